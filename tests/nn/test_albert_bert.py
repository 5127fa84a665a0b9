"""BERT and ALBERT as the paper trained them (sections 7.2, 7.3).

* sentence-order prediction examples (data/sop.py): on hand-made documents
  of consecutive ids (so A, B and their order can be read off the ids) and
  on the registered th_mlm_sop / th_sop tasks over the embedded corpus;
* the gin files bind ALBERT's and BERT's optimizer, schedule, batch and
  sizes (docs/training.md lists each against its source);
* a tiny ALBERT with talking heads (tab:albert row 6) trains with MLM +
  SOP under LAMB, its SOP accuracy and loss are computed (sop_eval) before
  and after training, and its 4 blocks share one block's variables;
* BERT's 768-heads row passes the pre-flight on model:8 with
  layouts/talking_heads_batch_split.gin, and BatchSplit accepts the layout.
"""
import math

import gin
import numpy as np
import pytest
import seqio
import tensorflow.compat.v1 as tf

from mtf_talking_heads import training
from mtf_talking_heads.data import sop
from mtf_talking_heads.data import vocab
from mtf_talking_heads.experiments import sop_eval
from mtf_talking_heads.nn import models
from mtf_talking_heads.nn import optimizers

LENGTH = 64


class _Vocabulary(object):
  """What sop_mlm reads of a vocabulary: 1000 ids, the last 100 sentinels."""
  vocab_size = 1000
  extra_ids = 100


def _features():
  return {"targets": seqio.Feature(vocabulary=_Vocabulary())}


def _hand_made_examples(num_docs, doc_length, length=16, **kwargs):
  """sop_mlm over documents whose tokens are consecutive ids 10, 11, ..."""
  docs = [{"targets": np.arange(10, 10 + doc_length, dtype=np.int32)} for _ in range(num_docs)]
  ds = tf.data.Dataset.from_generator(
      lambda: iter(docs),
      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  with seqio.utils.map_seed_manager(1234):
    out = sop.sop_mlm(ds, {"inputs": length, "targets": length}, _features(),
                      **kwargs)
  return list(out.as_numpy_iterator())


def test_sop_examples_are_two_consecutive_segments_in_either_order():
  v = _Vocabulary()
  cls_, sep = sop.special_id(v, sop.CLS), sop.special_id(v, sop.SEP)
  in_order, swapped = sop.label_ids(v)
  assert (cls_, sep, in_order, swapped) == (998, 997, 996, 995)
  # documents of 13 tokens, pieces of at most 16 - 3 = 13: one piece each
  examples = _hand_made_examples(2000, 13, noise_density=0.0)
  assert len(examples) == 2000
  swaps = 0
  for ex in examples:
    inputs, targets = ex["inputs"], ex["targets"]
    assert len(inputs) == len(targets) == 15  # + EOS (the task's) = 16
    assert inputs[0] == cls_ and targets[0] in (in_order, swapped)
    assert list(np.where(inputs == sep)[0]) == list(np.where(targets == sep)[0])
    cut = int(np.where(inputs == sep)[0][0])
    first, second = targets[1:cut], targets[cut + 1:]
    assert len(first) >= 1 and len(second) >= 1
    np.testing.assert_array_equal(inputs[1:], targets[1:])  # no noise
    if targets[0] == swapped:
      swaps += 1
      first, second = second, first
    # in order, A then B is the document itself
    np.testing.assert_array_equal(np.concatenate([first, second]),
                                  np.arange(10, 23))
  # swap probability 0.5: 2000 draws, 3 standard deviations = 0.034
  assert abs(swaps / 2000 - 0.5) < 0.034, swaps


def test_sop_corruption_spares_cls_and_sep_and_swap_probability_is_used():
  v = _Vocabulary()
  examples = _hand_made_examples(300, 40, length=48, noise_density=0.5)
  changed, total = 0, 0
  for ex in examples:
    inputs, targets = ex["inputs"], ex["targets"]
    sep_at = np.where(targets == sop.special_id(v, sop.SEP))[0]
    assert len(sep_at) == 1 and inputs[sep_at[0]] == targets[sep_at[0]]
    assert inputs[0] == sop.special_id(v, sop.CLS)
    ordinary = np.ones(len(inputs), bool)
    ordinary[[0, sep_at[0]]] = False
    changed += np.sum(inputs[ordinary] != targets[ordinary])
    total += ordinary.sum()
  # half of the tokens selected, 90% of those visibly changed (mask or a
  # random other piece; a random piece equal to the original is rare)
  assert 0.40 < changed / total < 0.50, changed / total
  never = _hand_made_examples(200, 13, swap_probability=0.0)
  assert {ex["targets"][0] for ex in never} == {sop.label_ids(v)[0]}
  always = _hand_made_examples(200, 13, swap_probability=1.0)
  assert {ex["targets"][0] for ex in always} == {sop.label_ids(v)[1]}


def test_sop_arguments_are_checked():
  with pytest.raises(ValueError, match="th_data.sop_mlm.swap_probability"):
    _hand_made_examples(1, 13, swap_probability=1.5)
  with pytest.raises(ValueError, match="sequence length of at least 5"):
    _hand_made_examples(1, 13, length=4)


@pytest.fixture(scope="module")
def corpus_examples():
  lengths = {"inputs": LENGTH, "targets": LENGTH}
  out = {}
  for name in (sop.TRAIN_TASK, sop.LABEL_TASK):
    ds = seqio.get_mixture_or_task(name).get_dataset(
        lengths, split="validation", shuffle=False, seed=7, use_cached=False,
        num_epochs=1)
    out[name] = list(ds.as_numpy_iterator())
  return out


def test_registered_tasks_on_the_embedded_corpus(corpus_examples):
  vocabulary = vocab.get_vocabulary()
  in_order, swapped = sop.label_ids(vocabulary)
  train, labels = corpus_examples[sop.TRAIN_TASK], corpus_examples[
      sop.LABEL_TASK]
  assert len(train) == len(labels) > 300
  swaps = 0
  for ex, lab in zip(train, labels):
    inputs, targets = ex["inputs"], ex["targets"]
    assert 5 <= len(inputs) == len(targets) <= LENGTH
    assert inputs[0] == sop.special_id(vocabulary, sop.CLS)
    assert targets[-1] == inputs[-1] == 1  # EOS
    assert np.sum(targets == sop.special_id(vocabulary, sop.SEP)) == 1
    assert targets[0] in (in_order, swapped)
    swaps += targets[0] == swapped
    # th_sop: the same example, the label its only weighted target
    np.testing.assert_array_equal(lab["inputs"], inputs)
    assert lab["targets"][0] == targets[0]
    assert set(lab["targets"][1:]) == {sop.NO_LOSS}
  assert abs(swaps / len(train) - 0.5) < 3 * 0.5 / math.sqrt(len(train))


# ------------------------------------------------------------------ gin


def _parse(files):
  training.parse_gin(files)
  optimizers.check_settings()


def _selector(name):
  return models.query(name).selector


def test_albert_base_binds_albert_settings():
  _parse(["models/albert_base.gin"])
  assert _selector("utils.run.optimizer") == "mtf_th.LambOptimizer"
  assert _selector("utils.run.learning_rate_schedule") == (
      "mtf_th.warmup_linear_decay")
  expected = {
      "mtf_th.warmup_linear_decay.learning_rate": 0.00176,
      "mtf_th.warmup_linear_decay.warmup_steps": 3125,
      "utils.run.batch_size": 4096, "utils.run.total_run_steps": 125000,
      "mtf_th.LambOptimizer.weight_decay_rate": 0.01,
      "mtf_th.LambOptimizer.beta_1": 0.9, "mtf_th.LambOptimizer.beta_2": 0.999,
      "mtf_th.LambOptimizer.epsilon": 1e-6,
      "mtf_th.LambOptimizer.clip_norm": 1.0,
      "MIXTURE_NAME": "th_mlm_sop", "d_model": 768, "num_layers": 12,
      "inputs_length": 512, "targets_length": 512, "dropout_rate": 0.0,
      "th_data.sop_mlm.swap_probability": 0.5,
      "th_data.sop_mlm.noise_density": 0.15,
  }
  assert {k: models.query(k) for k in expected} == expected
  # embedding = hidden = 768: one vocab x d_model table, no factorisation
  description = models.describe("aligned", 8100)
  assert "inner_vocab" not in description.dims
  assert description.d_model == 768


def test_bert_base_binds_bert_settings():
  _parse(["models/bert_base.gin"])
  assert _selector("utils.run.optimizer") == "mtf_th.BertAdamOptimizer"
  expected = {
      "mtf_th.warmup_linear_decay.learning_rate": 1e-4,
      "mtf_th.warmup_linear_decay.warmup_steps": 10000,
      "utils.run.batch_size": 256, "utils.run.total_run_steps": 1000000,
      "mtf_th.BertAdamOptimizer.weight_decay_rate": 0.01,
      "mtf_th.BertAdamOptimizer.clip_norm": 1.0,
      "MIXTURE_NAME": "th_mlm", "inputs_length": 512, "dropout_rate": 0.1,
      "relative_attention_type": "bias_shared",
  }
  assert {k: models.query(k) for k in expected} == expected


def test_tiny_files_keep_the_optimizers():
  _parse(["models/albert_base.gin", "models/albert_tiny.gin"])
  assert _selector("utils.run.optimizer") == "mtf_th.LambOptimizer"
  assert models.query("utils.run.total_run_steps") == 2000
  assert models.query("mtf_th.warmup_linear_decay.warmup_steps") == 100
  _parse(["models/bert_base.gin", "models/bert_tiny.gin"])
  assert _selector("utils.run.optimizer") == "mtf_th.BertAdamOptimizer"


# ------------------------------------------------- train ALBERT, score SOP


@pytest.fixture(scope="module")
def albert_run(tmp_path_factory):
  """A tiny talking-heads ALBERT (4 heads of 16): 30 steps of MLM + SOP
  under LAMB, checkpoints 0 and 30."""
  model_dir = str(tmp_path_factory.mktemp("albert") / "model")
  params = ["heads_k = 4", "heads = 4", "heads_v = 4", "d_k = 16", "d_v = 16",
            "save_checkpoints_steps = 30", "learning_rate = 0.01",
            "warmup_steps = 10"]
  rows = training.train(model_dir, [
      "experiments/albert_heads/06_talking_heads_12_64.gin",
      "models/albert_tiny.gin"], params, train_steps=30)
  scores = sop_eval.evaluate_sop(model_dir, checkpoint_steps="all",
                                 max_examples=64)
  return model_dir, rows, scores


def test_albert_trains_with_lamb_and_sop_accuracy_is_computed(albert_run):
  model_dir, rows, scores = albert_run
  losses = [r["loss"] for r in rows]
  assert len(losses) == 30 and all(math.isfinite(l) for l in losses)
  assert np.mean(losses[-5:]) < losses[0] - 1.0, losses
  variables = dict(tf.train.list_variables(tf.train.latest_checkpoint(
      model_dir)))
  weights = [n for n in variables if "/adam_" not in n and n != "global_step"]
  assert weights and all(n + "/adam_m" in variables and n + "/adam_v" in
                         variables for n in weights)  # LAMB's slots
  assert [s["step"] for s in scores] == [0, 30]
  assert all(s["examples"] == 64 for s in scores)
  before, after = scores
  # untrained: the labels are two of 8192 pieces, never the argmax
  assert before["sop_accuracy"] == 0.0 and before["sop_loss"] > 5.0
  # trained: the first position's mass is on the two labels (ln 2 = 0.69
  # is chance between them) and the argmax is one of them
  assert after["sop_loss"] < 1.5, after
  assert 0.3 <= after["sop_accuracy"] <= 1.0, after


def test_albert_blocks_share_one_set_of_variables(albert_run):
  variables = {n: s for n, s in tf.train.list_variables(
      tf.train.latest_checkpoint(albert_run[0]))
               if "/adam_" not in n and not n.startswith("global_step")}
  layer = {n: s for n, s in variables.items()
           if "/shared_attention/" in n or "/shared_feed_forward/" in n}
  # one layer's variables although the stack has 4 blocks
  suffixes = sorted(n.split("/shared_")[1] for n in layer)
  assert suffixes == sorted([
      "attention/TalkingHeadsAttention/p_k",
      "attention/TalkingHeadsAttention/p_l",
      "attention/TalkingHeadsAttention/p_o",
      "attention/TalkingHeadsAttention/p_q",
      "attention/TalkingHeadsAttention/p_v",
      "attention/TalkingHeadsAttention/p_w",
      "attention/rms_norm/scale",
      "feed_forward/DenseReluDense/wi/kernel",
      "feed_forward/DenseReluDense/wo/kernel",
      "feed_forward/rms_norm/scale"]), suffixes
  d, ff, h = 64, 256, 4
  one_layer = (4 * d * h * 16 + 2 * h * h) + 2 * d * ff + 2 * d
  assert sum(int(np.prod(s)) for s in layer.values()) == one_layer
  assert not any("block_00" in n or "layer_00" in n for n in variables)
  # embedding size = d_model (paper 7.2): vocab x 64, and positions x 64
  embedding = {n: s for n, s in variables.items() if "embedding" in n}
  assert sorted(map(tuple, embedding.values())) == [(64, 64), (8192, 64)]


def test_evaluate_sop_refuses_a_model_without_sop(tmp_path):
  with pytest.raises(training.ConfigError, match="no sentence-order labels"):
    sop_eval.evaluate_sop(str(tmp_path), ["models/bert_base.gin"])


# ------------------------------------------------- 768 heads, sharded


def test_768_heads_bert_passes_preflight_with_the_batch_split_layout():
  training.parse_gin(["experiments/bert_heads/10_talking_heads_768_1.gin",
                      "layouts/talking_heads_batch_split.gin"])
  settings, description = training.preflight()
  assert str(settings.mesh_shape) == "Shape[model=8]"
  assert settings.batch_size == 256
  layers = [layer for _, layer in models.attention_layers(description)]
  assert len(layers) == 12
  for layer in layers:
    assert type(layer.strategy).__name__ == "BatchSplit"
    assert (layer.dims.heads.size, layer.dims.heads_k.size) == (768, 768)
    # the strategy's own check (the pre-flight does not call it)
    layer.strategy.check(layer.dims, "model:8", settings.layout_string,
                         settings.batch_size, 512)
  with pytest.raises(ValueError, match="not a multiple of 8"):
    layers[0].strategy.check(layers[0].dims, "model:8",
                             settings.layout_string, 252, 512)
  with gin.unlock_config():
    gin.clear_config()


def test_preflight_runs_the_strategy_and_optimizer_checks():
  files = ["experiments/bert_heads/10_talking_heads_768_1.gin",
           "layouts/talking_heads_batch_split.gin"]
  try:
    training.parse_gin(files, ["batch_size = 252"])
    with pytest.raises(training.ConfigError,
                       match=r"not a multiple of 8.*strategy BatchSplit"):
      training.preflight()
    training.parse_gin(files, ["mtf_th.warmup_linear_decay.warmup_steps = -1"])
    with pytest.raises(training.ConfigError, match="warmup_steps"):
      training.preflight()
  finally:
    with gin.unlock_config():
      gin.clear_config()
