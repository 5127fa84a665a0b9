"""The embedded downstream benchmark (data/downstream.py), its metrics
(training/metrics.py), the TFDS data check (training/tfds_data.py) and the
fine-tuning settings; fast.  The sweep's fine-tuning stage:
tests/sweeps/test_finetune_stage.py; the real chain at tiny scale:
tests/sweeps/test_finetune_chain.py.
"""
import os
import re
import textwrap

import pytest
import seqio
import t5.data
from t5.evaluation import qa_utils

from mtf_talking_heads import cli
from mtf_talking_heads import data  # noqa: F401  (registers the tasks)
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.data import downstream
from mtf_talking_heads.data import vocab
from mtf_talking_heads.experiments.sweep import finetune as finetune_lib
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import metrics
from mtf_talking_heads.training import tfds_data

LENGTHS = {"inputs": 160, "targets": 16}


# ---------------------------------------------------------------------------
# The tasks.

def test_examples_are_deterministic_and_both_splits_are_filled():
  docs = downstream._documents("validation")
  assert downstream.continuation_examples(docs) == (
      downstream.continuation_examples(list(docs)))
  assert downstream.next_word_examples(docs) == (
      downstream.next_word_examples(list(docs)))
  for task in (downstream.CONTINUATION, downstream.NEXT_WORD):
    for split in ("train", "validation"):
      assert len(downstream.examples(task, split)) >= 100
  labels = [e["targets"] for e in downstream.examples(
      downstream.CONTINUATION, "train")]
  assert set(labels) == {"yes", "no"}
  assert 0.4 < labels.count("yes") / len(labels) < 0.6
  # The splits come from disjoint documents.
  train = {e["inputs"]
           for e in downstream.examples(downstream.NEXT_WORD, "train")}
  assert not train & {e["inputs"] for e in downstream.examples(
      downstream.NEXT_WORD, "validation")}


def test_continuation_labels_follow_the_documents():
  docs = ["Alpha beta gamma delta. Epsilon zeta eta theta.",
          "One two three four. Five six seven eight.",
          "Red green blue cyan. Black white grey pink."]
  out = downstream.continuation_examples(docs)
  pairs = {(d.split(". ")[0] + ".", d.split(". ")[1]) for d in docs}
  for ex in out:
    first, second = re.match(r"continuation sentence1: (.*) sentence2: (.*)",
                             ex["inputs"]).groups()
    assert ((first, second) in pairs) == (ex["targets"] == "yes")


def test_every_answer_is_the_word_after_the_question_word_in_the_context():
  for split in ("train", "validation"):
    for ex in downstream.examples(downstream.NEXT_WORD, split):
      word, context = re.match(
          r'question: which word follows "(.*)"\? context: (.*)$',
          ex["inputs"]).groups()
      words = context.split()
      assert words.count(word) == 1
      assert words[words.index(word) + 1] == ex["targets"]
      assert ex["answers"] == [ex["targets"]] and ex["targets"] in context
      assert qa_utils.normalize_squad(ex["targets"])  # not an article


def test_acceptability_and_misspelling_examples_hold_their_answers():
  docs = downstream._documents("validation")
  rows = downstream.acceptability_examples(docs)
  labels = [r["targets"] for r in rows]
  assert set(labels) == set(downstream.ACCEPTABILITY_LABELS)
  assert 0.4 < labels.count("acceptable") / len(labels) < 0.6
  starts = {" ".join(d.split()[:downstream.ACCEPTABILITY_WORDS])
            for d in docs}
  for r in rows:  # acceptable: a document's start; unacceptable: reordered
    sentence = r["inputs"][len("cola sentence: "):]
    assert (sentence in starts) == (r["targets"] == "acceptable")
  for r in downstream.examples(downstream.MISSPELLING, "validation"):
    context = r["inputs"].split(" context: ", 1)[1].split()
    wrong = r["targets"]
    assert context.count(wrong) == 1 and r["answers"] == [wrong]
    assert len(wrong) >= downstream.MISSPELLING_MIN_LETTERS
  assert downstream.misspelling_example(
      "Return the number of items".split()) == {
          "inputs": "question: which word is misspelt? context: Return the "
                    "nebmur of items",
          "targets": "nebmur", "answers": ["nebmur"]}


def test_nli_hypotheses_continue_the_premise_or_not_by_label():
  docs = downstream._documents("validation")
  n = downstream.NLI_PREMISE_WORDS
  m = n + downstream.NLI_HYPOTHESIS_WORDS
  starts = [w for w in (downstream._words(d, m) for d in docs) if w]
  following = {" ".join(w[:n]): w[n:] for w in starts}
  rows = downstream.nli_examples(docs)
  labels = [r["targets"] for r in rows]
  for label in downstream.ENTAILMENT_LABELS:
    assert 0.25 < labels.count(label) / len(labels) < 0.42, label
  for r in rows:
    premise, hypothesis = re.match(r"mnli premise: (.*) hypothesis: (.*)$",
                                   r["inputs"]).groups()
    truth, hypothesis = following[premise], hypothesis.split()
    if r["targets"] == "entailment":
      assert hypothesis == truth
    elif r["targets"] == "contradiction":
      assert sorted(hypothesis) == sorted(truth) and hypothesis != truth
    else:  # the continuation of another document's premise
      assert hypothesis != truth and hypothesis in [
          w[n:] for w in starts if " ".join(w[:n]) != premise]


def test_lm_views_fit_one_128_position_sequence():
  """The decoder-only mixture's tasks: the examples of two tasks whose
  "<inputs> EOS <targets> EOS" fits 128 bytes, most of them."""
  for base in downstream.LM_TASKS:
    for split in ("train", "validation"):
      rows = downstream.examples(base, split)
      view = downstream.examples(base + downstream.LM_SUFFIX, split)
      assert view == [r for r in rows if downstream.fits_lm(r)]
      assert len(view) > 0.8 * len(rows), (base, split)
      assert max(len(r["inputs"].encode()) + len(r["targets"].encode())
                 for r in view) + 2 <= 128
  mixture = seqio.get_mixture_or_task("th_finetune_lm_bytes")
  assert sorted(t.name for t in mixture.tasks) == [
      "th_embedded_acceptability_lm_bytes",
      "th_embedded_misspelling_lm_bytes"]
  assert sorted(t.name for t in metrics.scored_tasks(
      "th_finetune_lm_bytes")) == sorted(t.name for t in mixture.tasks)


def test_mixtures_are_examples_proportional_in_each_vocabulary():
  for byte_level in (False, True):
    cls, span, name = downstream.task_names(byte_level)
    mixture = seqio.get_mixture_or_task(name)
    rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
    assert rates == {
        cls: len(downstream.examples(downstream.CLASSIFICATION, "train")),
        span: len(downstream.examples(downstream.SPAN, "train"))}
  assert isinstance(seqio.get_mixture_or_task(
      "th_embedded_next_word_bytes").output_features["targets"].vocabulary,
                    seqio.ByteVocabulary)


@pytest.mark.parametrize("name", ["th_embedded_continuation_bytes",
                                  "th_embedded_next_word_bytes",
                                  "th_embedded_next_word"])
def test_metrics_of_perfect_and_empty_predictions(name):
  task = seqio.get_mixture_or_task(name)
  examples = metrics.task_examples(task, LENGTHS, "validation", 8)
  assert len(examples) == 8
  perfect = [ex["targets_pretokenized"].decode() for ex in examples]
  best = metrics.metric_values(task, examples, perfect)
  worst = metrics.metric_values(task, examples, [""] * 8)
  expected = ({"accuracy"} if "continuation" in name else {"em", "f1"})
  assert set(best) == set(worst) == expected
  assert all(v == pytest.approx(100.0) for v in best.values())
  assert all(v == 0.0 for v in worst.values())
  # Half right: half of each.
  half = perfect[:4] + [""] * 4
  assert all(v == pytest.approx(50.0) for v in
             metrics.metric_values(task, examples, half).values())


def test_scored_tasks_refuses_a_pretraining_task():
  assert [t.name for t in metrics.scored_tasks("th_finetune_embedded")] == [
      "th_embedded_cloze", "th_embedded_entailment"]
  with pytest.raises(errors.ConfigError, match="th_span_corruption has no "
                     "task with a 'validation' split and metric_fns"):
    metrics.scored_tasks("th_span_corruption")


def test_downstream_results_csv_replaces_the_same_step(tmp_path):
  row = dict(task="t", metric="f1", value=1.0, step=8, examples=4)
  metrics.write_results(str(tmp_path), [row])
  metrics.write_results(str(tmp_path), [dict(row, value=2.0),
                                        dict(row, step=4, value=3.0)])
  assert [(r["step"], r["value"]) for r in
          metrics.read_results(str(tmp_path))] == [(4, 3.0), (8, 2.0)]
  assert finetune_lib.read_downstream(str(tmp_path))[1]["value"] == 2.0


# ---------------------------------------------------------------------------
# The paper's mixture: TFDS data, vocabulary.

def test_paper_mixture_data_check(tmp_path):
  names = tfds_data.tfds_datasets(finetune_lib.PAPER_MIXTURE)
  assert "squad/v1.1:3.0.0" in names and "glue/mnli_matched:1.0.0" in names
  with pytest.raises(errors.ConfigError) as e:
    tfds_data.check_data(finetune_lib.PAPER_MIXTURE, str(tmp_path))
  assert "\n" not in str(e.value)
  assert "%d TFDS datasets that --data_dir=%s lacks" % (len(names),
                                                       tmp_path) in str(e.value)
  _fake_tfds(tmp_path, names)
  tfds_data.check_data(finetune_lib.PAPER_MIXTURE, str(tmp_path))
  assert tfds_data.tfds_datasets("th_finetune_embedded") == []


def test_constants_agree_with_t5():
  assert finetune_lib.T5_VOCABULARY == t5.data.DEFAULT_SPM_PATH
  assert list(vocab.PUBLISHED_PIECES) == [t5.data.DEFAULT_SPM_PATH]


def test_published_vocabulary_size_is_known_without_reading_it():
  """t5's 32000-piece vocabulary + 100 sentinels, as t5.data.get_default_
  vocabulary() reports it, with no GCS access (the path does not exist
  here: reading it would fail)."""
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.bind_parameter("th_data.vocabulary_options.path",
                       t5.data.DEFAULT_SPM_PATH)
  try:
    assert vocab.vocab_size_of(vocab.get_vocabulary()) == 32100
    assert vocab.vocab_size_of(seqio.SentencePieceVocabulary(
        t5.data.DEFAULT_SPM_PATH, extra_ids=100)) == 32100
    assert vocab.vocab_size_of(seqio.ByteVocabulary()) == 259
  finally:
    with gin.unlock_config():
      gin.clear_config()


def _fake_tfds(root, names):
  for n in names:
    d = tfds_data.dataset_dir(str(root), n)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "dataset_info.json"), "w") as f:
      f.write("{}")


def test_dry_run_of_the_paper_mixture_prints_the_tpu_commands(tmp_path,
                                                               capsys):
  _fake_tfds(tmp_path / "tfds",
             tfds_data.tfds_datasets(finetune_lib.PAPER_MIXTURE))
  code = cli.main(["sweep", "--paper_table", "t5_heads", "--rows", "7",
                   "--scale", "base", "--output_dir", "gs://bucket/t5",
                   "--tpu", "my-tpu", "--tpu_zone", "europe-west4-a",
                   "--finetune", "--finetune_mixture",
                   finetune_lib.PAPER_MIXTURE,
                   "--data_dir", str(tmp_path / "tfds"), "--dry_run"])
  out, err = capsys.readouterr()
  assert code == 0, err
  commands = [l for l in out.splitlines() if l.startswith("mtf_th ")]
  assert [c.split()[1] for c in commands] == [
      "train", "train", "eval", "finetune", "eval"]
  run = "gs://bucket/t5/runs/07_talking_heads_24_32/seed_1"
  for c in commands:
    assert "--tpu my-tpu --tpu_zone europe-west4-a" in c
    assert finetune_lib.T5_VOCABULARY in c or "--metrics" in c
  assert ("--pretrained_model_dir %s --model_dir %s/finetune" % (run, run)
          in commands[3])
  assert "experiments/finetune.gin" in commands[3]
  assert "--checkpoint_step 524288" in commands[3]
  assert "th_finetune_squad_glue_superglue" in commands[3]
  assert commands[4].startswith("mtf_th eval --metrics --model_dir %s/finetune"
                                % run)
  for c in commands[3:]:
    assert "--data_dir %s" % (tmp_path / "tfds") in c
  assert "to step 655360" in out  # 524288 + 131072
  assert "| SQuAD v1.1 dev-F1 | MNLI-m dev |" in out
  assert "pre-flight of `mtf_th finetune` passed for all 1 rows" in err


def test_the_embedded_mixtures_need_no_tfds_data():
  """th_finetune_lm[_bytes] is built from the local corpus, as
  th_finetune_embedded is: no --data_dir, no t5 vocabulary."""
  for mixture in ("th_finetune_embedded", "th_finetune_embedded_bytes",
                  "th_finetune_lm", "th_finetune_lm_bytes"):
    assert not finetune_lib.needs_data(mixture), mixture
    assert finetune_lib.vocabulary_params(mixture) == (), mixture
  assert finetune_lib.needs_data(finetune_lib.PAPER_MIXTURE)
  assert finetune_lib.needs_data("glue_cola_v002")
  # every other th_* name is built locally: the rule needs_data keeps
  ours, _ = prechecks.task_names()
  assert all(n.startswith(finetune_lib.LOCAL_PREFIX) for n in ours)
  assert [n for n in ours if finetune_lib.needs_data(n)] == [
      finetune_lib.PAPER_MIXTURE]
  assert finetune_lib.LEXICAL_MIXTURE == downstream.LEXICAL_MIXTURE
  assert finetune_lib.LM_MIXTURE == downstream.LM_MIXTURE
  assert finetune_lib.EMBEDDED_MIXTURE == downstream.MIXTURE
  # the sweep's split of lm_small's 128 positions is the one the _lm views
  # are cut for: inputs + EOS, then the targets (+ EOS)
  assert finetune_lib.LM_TARGETS_LENGTH == downstream.MAX_TARGET_BYTES + 1
  assert (downstream.MAX_LM_INPUT_BYTES + 1 + finetune_lib.LM_TARGETS_LENGTH
          == 128)


def test_an_other_embedded_mixture_runs_without_tfds_and_has_its_columns(
    tmp_path, capsys):
  """--finetune_mixture th_finetune_lexical_bytes (built from the local
  corpus) needs no --data_dir and gets its two tasks as the columns."""
  code = cli.main(["sweep", "--paper_table", "encdec_heads", "--rows", "2",
                   "--scale", "tiny", "--output_dir", str(tmp_path / "out"),
                   "--finetune", "--finetune_steps", "4",
                   "--finetune_mixture", "th_finetune_lexical_bytes",
                   "--dry_run"])
  out, err = capsys.readouterr()
  assert code == 0, err
  finetune, = [l for l in out.splitlines() if l.startswith("mtf_th finetune")]
  assert "experiments/finetune_embedded.gin" in finetune
  assert "--data_dir" not in out and "vocabs" not in out
  assert "embedded misspelling F1 (not SQuAD)" in out
  assert "word-order acceptability accuracy), stand-ins" in out
  assert finetune_lib.column_tasks("th_finetune_lexical_bytes") == (
      ("th_embedded_misspelling_bytes", "f1"),
      ("th_embedded_acceptability_bytes", "accuracy"))
  assert seqio.get_mixture_or_task("th_finetune_lexical_bytes")


@pytest.mark.parametrize("scale, lengths", [("small", (112, 16, 128)),
                                           ("tiny", (16, 16, 32))])
def test_dry_run_of_a_decoder_only_row_fine_tunes_it_as_delimited_lm(
    scale, lengths, tmp_path, capsys):
  """lm_heads rows fine-tune on th_finetune_lm_bytes in one sequence of the
  pre-training's length (lm_small: 128, lm_tiny: 32), and the fine-tuning's
  pre-flight passes (delimited_lm, inputs + targets = max_length)."""
  code = cli.main(["sweep", "--paper_table", "lm_heads", "--rows", "6",
                   "--scale", scale, "--output_dir", str(tmp_path / "out"),
                   "--finetune", "--finetune_steps", "500", "--dry_run"])
  out, err = capsys.readouterr()
  assert code == 0, err
  finetune, = [l for l in out.splitlines() if l.startswith("mtf_th finetune")]
  assert "experiments/finetune_embedded_lm.gin" in finetune
  assert "th_finetune_lm_bytes" in finetune
  assert ("--gin_param 'inputs_length = %d' --gin_param 'targets_length = "
          "%d' --gin_param 'transformer.Unitransformer.max_length = %d'"
          % lengths) in finetune
  assert "embedded acceptability acc. (not MNLI-m)" in out
  assert "word-order acceptability accuracy), stand-ins" in out
  assert "pre-flight of `mtf_th finetune` passed for all 1 rows" in err


@pytest.mark.parametrize("args, pattern", [
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", finetune_lib.PAPER_MIXTURE],
     "th_finetune_squad_glue_superglue reads GLUE / SuperGLUE / SQuAD from "
     "TFDS .* give --data_dir gs://BUCKET/tensorflow_datasets"),
    # any t5 mixture is read from TFDS, not only the paper's GLUE/SQuAD one
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", "cnn_dailymail_v002"],
     "--finetune_mixture cnn_dailymail_v002 reads its data from TFDS .this "
     "package's other th_\\* mixtures .*: give --data_dir"),
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", finetune_lib.PAPER_MIXTURE, "--data_dir",
      "{tmp}/none"], "reads 23 TFDS datasets that --data_dir={tmp}/none lacks"),
    (["--paper_table", "bert_heads", "--rows", "1", "--finetune"],
     "row 01_multi_head_12_64 is a model of kind bert"),
    (["--paper_table", "albert_heads", "--rows", "1", "--finetune"],
     "row 01_multi_head_6_128 is a model of kind albert; .* the small "
     "encdec_heads and span_heads tables\\) or a decoder-only LM"),
    (["--paper_table", "lm_heads", "--rows", "2", "--finetune",
      "--finetune_mixture", "th_finetune_embedded_bytes"],
     "row 02_multi_head_8_16 is a decoder-only LM, .* it needs "
     "th_finetune_lm_bytes"),
    # the decoder-only refusal comes first: --data_dir would not help
    (["--paper_table", "lm_heads", "--rows", "2", "--finetune",
      "--finetune_mixture", finetune_lib.PAPER_MIXTURE],
     "row 02_multi_head_8_16 is a decoder-only LM, .* it needs "
     "th_finetune_lm_bytes"),
    (["--paper_table", "lm_heads", "--rows", "2", "--finetune",
      "--gin_param", "targets_length = 16"],
     "row 02_multi_head_8_16 is pre-trained on sequences of 16 positions "
     ".* pre-train it longer"),
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune_steps", "4"],
     "--finetune_steps goes with --finetune"),
    (["--paper_table", "encdec_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", "th_finetune_embedded"],
     "was pre-trained on th_prefix_lm_bytes .bytes., so it needs a mixture "
     "in the same vocabulary .a name ending in _bytes.; leave "
     "--finetune_mixture out to get th_finetune_embedded_bytes"),
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", "th_finetune_lexical_bytes"],
     "row 01_multi_head_6_128 was pre-trained on th_span_corruption "
     ".SentencePiece., so it needs a mixture in the same vocabulary .a name "
     "not ending in _bytes.; leave --finetune_mixture out to get "
     "th_finetune_embedded$"),
    # a bytes row cannot take t5's SentencePiece tasks (refused before
    # --data_dir is asked for: it would not help)
    (["--paper_table", "encdec_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", finetune_lib.PAPER_MIXTURE],
     "row 01_multi_head_4_32 was pre-trained on th_prefix_lm_bytes .bytes., "
     "but the sweep fine-tunes th_finetune_squad_glue_superglue .read from "
     "TFDS. in t5's SentencePiece vocabulary; fine-tune the row on a "
     "\\.\\.\\._bytes mixture of the local corpus .leave "
     "--finetune_mixture out to get th_finetune_embedded_bytes"),
    (["--paper_table", "encdec_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", "th_finetune_lexcal_bytes"],
     "--finetune_mixture 'th_finetune_lexcal_bytes' is not a registered task "
     "or mixture; did you mean th_finetune_lexical_bytes.* \\(mtf_th sweep "
     "fine-tunes on the tasks and mixtures this package and t5 register\\)$"),
    (["--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_steps", "0"], "finetune_steps"),
])
def test_bad_finetune_input_is_one_line_and_status_2(args, pattern, tmp_path,
                                                     capsys):
  args = [a.replace("{tmp}", str(tmp_path)) for a in args]
  code = cli.main(["sweep", "--output_dir", str(tmp_path / "out")] + args)
  _, err = capsys.readouterr()
  assert code == 2
  assert len(err.strip().splitlines()) == 1, err
  assert re.search(pattern.replace("{tmp}", str(tmp_path)), err), err
  assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# Fine-tuning settings per model kind (gin/experiments/finetune*.gin).

@pytest.mark.parametrize("files, optimizer, schedule, expected", [
    (["models/t5_base.gin", "experiments/finetune.gin"],
     "optimize.AdafactorOptimizer",
     "learning_rate_schedules.constant_learning_rate",
     {"learning_rate_schedules.constant_learning_rate.learning_rate": 1e-3,
      "finetune_steps": 131072, "dropout_rate": 0.1,
      "MIXTURE_NAME": "th_finetune_squad_glue_superglue"}),
    (["experiments/span_heads/01_multi_head_8_16.gin",
      "experiments/finetune_embedded.gin"],
     "optimize.AdafactorOptimizer",
     "learning_rate_schedules.constant_learning_rate",
     {"learning_rate_schedules.constant_learning_rate.learning_rate": 0.01,
      "dropout_rate": 0.0, "MIXTURE_NAME": "th_finetune_embedded"}),
    (["experiments/lm_heads/02_multi_head_8_16.gin",
      "experiments/finetune_embedded_lm.gin"],
     "optimize.AdafactorOptimizer",
     "learning_rate_schedules.constant_learning_rate",
     {"learning_rate_schedules.constant_learning_rate.learning_rate": 0.01,
      "dropout_rate": 0.0, "utils.run.model_type": "delimited_lm",
      "MIXTURE_NAME": "th_finetune_lm_bytes"}),
    (["models/bert_base.gin", "experiments/finetune_bert.gin"],
     "mtf_th.BertAdamOptimizer", "mtf_th.warmup_linear_decay",
     {"mtf_th.warmup_linear_decay.learning_rate": 5e-5,
      "mtf_th.warmup_linear_decay.warmup_steps": 821,
      "finetune_steps": 8212, "utils.run.batch_size": 32,
      "dropout_rate": 0.1, "mtf_th.BertAdamOptimizer.weight_decay_rate": 0.01,
      "MIXTURE_NAME": "th_mlm"}),
    (["models/albert_base.gin", "experiments/finetune_albert.gin"],
     "mtf_th.BertAdamOptimizer", "mtf_th.warmup_linear_decay",
     {"mtf_th.warmup_linear_decay.learning_rate": 5e-5,
      "mtf_th.warmup_linear_decay.warmup_steps": 365,
      "finetune_steps": 3649, "utils.run.batch_size": 48,
      "dropout_rate": 0.0, "MIXTURE_NAME": "th_mlm_sop"}),
])
def test_finetune_settings_per_model_kind(files, optimizer, schedule,
                                          expected):
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
  training.parse_gin(files)
  assert models.query("utils.run.optimizer").selector == optimizer
  assert models.query("utils.run.learning_rate_schedule").selector == schedule
  assert {k: models.query(k) for k in expected} == expected
  assert models.query("utils.run.variable_filter") is None or (
      "embedding" in models.query("utils.run.variable_filter"))


def test_finetune_schedule_counts_from_the_first_fine_tuning_step():
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import optimizers  # pylint: disable=g-import-not-at-top
  steps = [125000, 125500, 126000, 130500, 135000]
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    rate = optimizers.warmup_linear_decay(
        step, 135000, learning_rate=3e-5, warmup_steps=1000,
        start_step=125000)
    with tf.Session() as sess:
      values = [sess.run(rate, {step: s}) for s in steps]
  assert values == pytest.approx([0.0, 1.5e-5, 2.7e-5, 1.35e-5, 0.0],
                                 abs=1e-10)


def test_preflight_checks_the_fine_tuning_schedule_over_its_own_steps():
  """500 fine-tuning steps cannot hold finetune_bert.gin's 821 warm-up
  steps, although the global step count (P + 500) can."""
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import optimizers  # pylint: disable=g-import-not-at-top
  files = ["models/bert_base.gin", "experiments/finetune_bert.gin"]
  start = ["mtf_th.warmup_linear_decay.start_step = 100000"]
  training.parse_gin(files, start + ["utils.run.total_run_steps = 100500"])
  with pytest.raises(ValueError, match=r"train_steps \(500\) must be larger "
                     r"than mtf_th.warmup_linear_decay.warmup_steps \(821\)"):
    optimizers.check_settings()
  training.parse_gin(files, start + ["utils.run.total_run_steps = 108212"])
  optimizers.check_settings()  # finetune_bert.gin's own 8212 steps fit


def test_scoring_gives_each_task_its_own_outputs(monkeypatch):
  """_score_with_estimator with a stand-in decoder that answers every input
  with its own reference target: 100 on every metric; the same answers in
  the wrong order (a slicing error between tasks) are not."""
  from mtf_talking_heads.training import decoding  # pylint: disable=g-import-not-at-top
  tasks = metrics.scored_tasks(downstream.MIXTURE + downstream.BYTES_SUFFIX)
  lengths = {"inputs": 256, "targets": 32}
  answers = {}
  for task in tasks:
    for ex in metrics.task_examples(task, lengths, "validation", 6):
      answers[tuple(int(t) for t in ex["inputs"] if t)] = (
          ex["targets_pretokenized"])
  order = [1]

  def decode_rows(estimator, vocabulary, ids, batch_size, checkpoint):
    out = [answers[tuple(int(t) for t in row if t)] for row in ids]
    return out[::order[0]]

  monkeypatch.setattr(decoding, "decode_rows", decode_rows)
  monkeypatch.setattr(metrics.estimator_lib, "configure_estimator",
                      lambda estimator, seed: None)

  def score():
    results = []
    metrics._score_with_estimator(  # pylint: disable=protected-access
        None, None, lengths, 4, None, None, None, results, (7, "ckpt"),
        {"tasks": tasks, "split": "validation", "max_examples": 6})
    return {(r["task"], r["metric"]): r["value"] for r in results}

  perfect = score()
  assert len(perfect) == 3 and set(perfect.values()) == {100.0}, perfect
  order[0] = -1  # every task now gets the other task's answers
  assert min(score().values()) < 50.0


@pytest.mark.parametrize("seed", [1, 2])
def test_held_out_set_of_a_mixture_reads_every_example_once(seed):
  """mtf_th eval's held-out set of a mixture: each task's examples, all of
  them, once (seqio's mixing stops when the first task runs out)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.training import evaluation  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    ds = evaluation.eval_dataset("th_finetune_lm_bytes",
                                 {"inputs": 112, "targets": 16},
                                 "validation", seed, None)
    targets = ds.reduce(np.int64(0), lambda n, ex: n + tf.reduce_sum(
        tf.cast(tf.equal(ex["targets"], 1), tf.int64)))
    with tf.Session() as sess:
      eos = sess.run(targets)
  assert eos == sum(len(downstream.examples(t + downstream.LM_SUFFIX,
                                            "validation"))
                    for t in downstream.LM_TASKS)  # one EOS per example


USER_TASKS = textwrap.dedent('''
    import seqio
    NAME = "user_mnli_for_sweep_test"
    if NAME not in seqio.TaskRegistry.names():
      seqio.TaskRegistry.add(
          NAME, source=seqio.TfdsDataSource("glue/mnli:1.0.0"),
          output_features={"targets": seqio.Feature(seqio.ByteVocabulary())})
''')


@pytest.mark.parametrize("module, pattern", [
    # the mixture the gin file's import registers is found, then its data
    ("user_tasks_for_sweep_test", "user_mnli_for_sweep_test reads 1 TFDS "
     "datasets that --data_dir={tmp}/none lacks .glue/mnli:1.0.0."),
    ("no_such_module_for_sweep_test", "--gin_file imports "
     "no_such_module_for_sweep_test: No module named"),
])
def test_sweep_finds_the_mixture_a_gin_import_registers(
    module, pattern, tmp_path, capsys, monkeypatch):
  (tmp_path / "user_tasks_for_sweep_test.py").write_text(USER_TASKS)
  monkeypatch.syspath_prepend(str(tmp_path))
  (tmp_path / "tasks.gin").write_text("import %s\n" % module)
  code = cli.main([
      "sweep", "--paper_table", "t5_heads", "--rows", "1", "--finetune",
      "--finetune_mixture", "user_mnli_for_sweep_test", "--data_dir",
      str(tmp_path / "none"), "--gin_file", str(tmp_path / "tasks.gin"),
      "--output_dir", str(tmp_path / "out")])
  _, err = capsys.readouterr()
  assert code == 2
  assert len(err.strip().splitlines()) == 1, err
  assert re.search(pattern.replace("{tmp}", str(tmp_path)), err), err
  assert not (tmp_path / "out").exists()
