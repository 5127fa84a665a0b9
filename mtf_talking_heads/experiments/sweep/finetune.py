"""The fine-tuning stage of a sweep (`mtf_th sweep --finetune`): plan and columns.

Owns Finetune: for each run of a Plan, after pre-training, `mtf_th finetune`
into <run>/finetune/ (paper section 7.1: experiments/finetune.gin's settings,
steps and mixture overridable) and `mtf_th eval --metrics` there; the
downstream columns those give (the paper's "SQuAD v1.1 dev-F1" and "MNLI-m
dev" in Tables 1-4), read from the fine-tuned model's
downstream_results.csv; and the appendix-style table of every task's
metrics (downstream.md, cf. Appendix B).  run.py executes the commands,
report.py prints the columns.  Imports no TensorFlow.

Mixtures:
  th_finetune_embedded[_bytes]  (default for encoder-decoder rows) the
      embedded benchmark built from the local corpus (data/downstream.py);
      the columns are its stand-ins: cloze span F1 (for SQuAD) and
      entailment accuracy (for MNLI-m).  The byte-level variant is chosen
      for rows pre-trained on bytes.
  th_finetune_lm[_bytes]  (default for decoder-only rows: lm_heads,
      lm_variants, scaling_*) the embedded tasks that fit one sequence of
      the pre-training's length, fine-tuned text-to-text as mtf's
      delimited_lm ("<inputs> EOS <targets> EOS", loss on the targets;
      experiments/finetune_embedded_lm.gin); the columns: misspelt-word span
      F1 (for SQuAD) and acceptability accuracy (CoLA's form, for MNLI-m).
  th_finetune_lexical[_bytes]  the embedded misspelling and acceptability
      tasks for encoder-decoder rows (same columns as th_finetune_lm); any
      other th_* name is built from the local corpus too, its columns empty.
  th_finetune_squad_glue_superglue  the paper's mixture, read by TFDS from
      --data_dir (a bucket prepared with `tfds build`); t5's tasks use t5's
      SentencePiece vocabulary, so every stage of such a sweep binds
      th_data.vocabulary_options.path to it (the fine-tuned model must share
      the pre-trained model's vocabulary).
"""
import csv
import os

from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.experiments.sweep import rows as rows_lib
from mtf_talking_heads.runtime import run_files

FINETUNE_DIR = "finetune"
DOWNSTREAM_MD = "downstream.md"
DOWNSTREAM_RESULTS = "downstream_results.csv"  # training/metrics.py writes it
EMBEDDED_MIXTURE = "th_finetune_embedded"
LEXICAL_MIXTURE = "th_finetune_lexical"
BYTES_SUFFIX = "_bytes"
PAPER_MIXTURE = "th_finetune_squad_glue_superglue"
# t5.data.DEFAULT_SPM_PATH (tests check they agree) and its size with t5's
# 100 sentinels.
T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
ENCODER_DECODER_MODELS = ("t5", "encdec")
DECODER_ONLY_MODELS = ("lm",)
LM_MIXTURE = "th_finetune_lm"
# A decoder-only row fine-tunes on one sequence of its pre-training length P:
# inputs P - LM_TARGETS_LENGTH, targets LM_TARGETS_LENGTH (EOS included).
LM_TARGETS_LENGTH = 16
# results.csv columns of the stage (after results.RESULT_COLUMNS).
COLUMNS = results.FINETUNE_COLUMNS
# (task, metric) of the two columns, per mixture family.
_PAPER_COLUMNS = {
    PAPER_MIXTURE: (("squad_v010_allanswers", "f1"),
                    ("glue_mnli_matched_v002", "accuracy")),
    EMBEDDED_MIXTURE: (("th_embedded_cloze", "f1"),
                       ("th_embedded_entailment", "accuracy")),
    LM_MIXTURE: (("th_embedded_misspelling_lm", "f1"),
                 ("th_embedded_acceptability_lm", "accuracy")),
    LEXICAL_MIXTURE: (("th_embedded_misspelling", "f1"),
                      ("th_embedded_acceptability", "accuracy")),
}
_LABELS = {
    PAPER_MIXTURE: ("SQuAD v1.1 dev-F1", "MNLI-m dev"),
    EMBEDDED_MIXTURE: ("embedded cloze F1 (not SQuAD)",
                       "embedded entailment acc. (not MNLI-m)"),
    LM_MIXTURE: ("embedded misspelling F1 (not SQuAD)",
                 "embedded acceptability acc. (not MNLI-m)"),
}
_LABELS[LEXICAL_MIXTURE] = _LABELS[LM_MIXTURE]  # the same two tasks
_POSITIONS = "transformer.Unitransformer.positional_embedding"
_TABLE = "transformer.Unitransformer.max_length"
# Every task and mixture data/ builds from the embedded corpus is named th_*
# (data/task_names.THIS_PACKAGE; a test keeps it so); the one th_* read from
# TFDS is PAPER_MIXTURE.
LOCAL_PREFIX = "th_"


def _family(mixture):
  if mixture.endswith(BYTES_SUFFIX):
    mixture = mixture[:-len(BYTES_SUFFIX)]
  return mixture if mixture in _PAPER_COLUMNS else None


def column_tasks(mixture):
  """((span task, metric), (classification task, metric)) or None."""
  family = _family(mixture)
  if family is None:
    return None
  suffix = BYTES_SUFFIX if mixture.endswith(BYTES_SUFFIX) else ""
  return tuple((task + (suffix if family != PAPER_MIXTURE else ""), metric)
               for task, metric in _PAPER_COLUMNS[family])


def column_labels(mixture):
  """The two columns' headers: the paper's for its mixture, else stand-ins."""
  return _LABELS.get(_family(mixture) or "", ("span F1", "classification acc."))


def read_downstream(model_dir):
  """Rows of <model_dir>/downstream_results.csv (value float, step int)."""
  path = os.path.join(model_dir, DOWNSTREAM_RESULTS)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    r["value"], r["step"] = float(r["value"]), int(r["step"])
  return rows


class Finetune(object):
  """The fine-tuning stage of every run of a Plan.

  Example (the embedded benchmark, 4 steps, 16 examples per task):
    stage = Finetune(plan, steps=4, max_eval_examples=16)
    stage.commands(row, 1) == [
        ["mtf_th", "finetune", "--pretrained_model_dir", <run>,
         "--model_dir", <run>/finetune, --gin_file ... experiments/
         finetune_embedded.gin, --gin_param "MIXTURE_NAME = '...'", ...,
         "--checkpoint_step", "<train_steps>", "--finetune_steps", "4"],
        ["mtf_th", "eval", "--metrics", "--model_dir", <run>/finetune,
         "--max_eval_examples", "16"]]

  Args:
    plan: the sweep's Plan (rows of text-to-text models: t5, encdec, and
      decoder-only lm rows, fine-tuned as delimited_lm).
    mixture: the fine-tuning mixture (default: th_finetune_embedded for
      encoder-decoders, th_finetune_lm for decoder-only rows, each with its
      _bytes variant for rows pre-trained on bytes).
    steps: fine-tuning steps (default: finetune.gin's 131072).
    max_eval_examples: held-out examples per task for the metrics (None:
      all).
    data_dir: TFDS data directory; required for a mixture read from TFDS
      (needs_data: the paper's, or any name not th_*).
  Raises:
    ValueError: a row that cannot be fine-tuned text-to-text, a bad number,
      or a TFDS mixture without data_dir -- before anything runs.
  """

  def __init__(self, plan, mixture=None, steps=None, max_eval_examples=None,
               data_dir=None):
    self.plan = plan
    for row in plan.rows:
      model = plan_model(plan, row)
      if model not in ENCODER_DECODER_MODELS + DECODER_ONLY_MODELS:
        raise ValueError(
            "--finetune: row %s is a model of kind %s; the downstream tasks are "
            "text-to-text and need an encoder-decoder (the T5 tables, or "
            "the small encdec_heads and span_heads tables) or a decoder-only "
            "LM (lm_heads, lm_variants, scaling_*). BERT/ALBERT fine-tuning "
            "needs task heads, which this repository does not build"
            % (row.name, model))
    for name, value in (("finetune_steps", steps),
                        ("max_eval_examples", max_eval_examples)):
      if value is not None:
        rows_lib.positive_int(value, name, "sweep")
    self.mixture = mixture
    self.steps = steps
    self.max_eval_examples = max_eval_examples
    self.data_dir = data_dir
    for row in plan.rows:
      self._check_vocabulary(row)
      self.length_params(row)  # refuses a too short row before anything runs
      self._check_position_table(row)
    if self.needs_data() and not data_dir:
      raise ValueError(
          "--finetune_mixture %s reads %s from TFDS (this package's other "
          "th_* mixtures are built from the embedded corpus): give "
          "--data_dir gs://BUCKET/tensorflow_datasets (prepared with "
          "`tfds build`)" % (mixture, "GLUE / SuperGLUE / SQuAD"
                             if mixture == PAPER_MIXTURE else "its data"))
    self.total_steps = plan.train_steps + self.default_steps()

  def _check_vocabulary(self, row):
    """The mixture must be in the pre-training's vocabulary (t5's tasks,
    read from TFDS, are in SentencePiece: no row pre-trained on bytes); a
    decoder-only row needs the mixture whose examples fit its sequence."""
    family = _family(self.mixture_for(row))
    pre_bytes = self._pretraining_mixture(row).endswith(BYTES_SUFFIX)
    wanted = self._default_family(row) + (BYTES_SUFFIX if pre_bytes else "")
    if self._decoder_only(row) and family != LM_MIXTURE:
      raise ValueError(
          "--finetune_mixture %s: row %s is a decoder-only LM, fine-tuned "
          "on one sequence of its pre-training length; it needs %s (the "
          "tasks' examples that fit); leave --finetune_mixture out to get it"
          % (self.mixture, row.name, wanted))
    mixture = self.mixture_for(row)
    if needs_data(mixture):  # t5's vocabulary for every stage
      if not pre_bytes:
        return
      raise ValueError(
          "--finetune_mixture %s: row %s was pre-trained on %s (bytes), but "
          "the sweep fine-tunes %s (read from TFDS) in t5's SentencePiece "
          "vocabulary; fine-tune the row on a "
          "..._bytes mixture of the local corpus (leave --finetune_mixture "
          "out to get %s), or fine-tune rows pre-trained on SentencePiece "
          "(the T5 tables)"
          % (self.mixture, row.name, self._pretraining_mixture(row),
             self.mixture, wanted))
    if mixture.endswith(BYTES_SUFFIX) != pre_bytes:
      raise ValueError(
          "--finetune_mixture %s: row %s was pre-trained on %s (%s), so it "
          "needs a mixture in the same vocabulary (a name %s in %s); "
          "leave --finetune_mixture out to get %s"
          % (self.mixture, row.name, self._pretraining_mixture(row),
             "bytes" if pre_bytes else "SentencePiece",
             "ending" if pre_bytes else "not ending", BYTES_SUFFIX, wanted))

  def _check_position_table(self, row):
    """A fine-tuned model restores its pre-training's position embedding
    tables, so both stages must give each stack's table one size (it follows
    inputs_length in models/encdec_small.gin: 128 in pre-training, 160 in
    fine-tuning).  Scoped bindings (encoder/..., decoder/...) count as
    gin applies them."""
    files, params = self.gin(row, 1)
    finetuned = gin_reader.GinConfig(files, params, gin_dir=self.plan.gin_dir)
    scopes = ("",) if self._decoder_only(row) else ("encoder", "decoder")
    for scope in scopes:
      sizes = [position_table(config, scope)
               for config in (self.plan.config(row), finetuned)]
      if sizes[0] != sizes[1]:
        raise ValueError(
            "--finetune: row %s's %sposition embedding table has %s "
            "positions in pre-training and %s in fine-tuning (%s follows the "
            "sequence length); the fine-tuning could not restore it: give "
            "both stages one size, e.g. --gin_file "
            "models/absolute_positions.gin (160)"
            % (row.name, scope + " " if scope else "",
               "no" if sizes[0] is None else sizes[0],
               "no" if sizes[1] is None else sizes[1], _TABLE))

  def _decoder_only(self, row):
    return plan_model(self.plan, row) in DECODER_ONLY_MODELS

  def _default_family(self, row):
    return LM_MIXTURE if self._decoder_only(row) else EMBEDDED_MIXTURE

  def _pretraining_mixture(self, row):
    return str(self.plan.config(row).get("MIXTURE_NAME") or "")

  # ---------------------------------------------------------- configuration
  def needs_data(self):
    return needs_data(self.mixture)

  def mixture_for(self, row):
    """The row's fine-tuning mixture (bytes rows get the _bytes variant)."""
    if self.mixture:
      return self.mixture
    pretraining = self._pretraining_mixture(row)
    return self._default_family(row) + (BYTES_SUFFIX if pretraining.endswith(
        BYTES_SUFFIX) else "")

  def gin_file(self, row):
    if self._decoder_only(row):
      return "experiments/finetune_embedded_lm.gin"
    return ("experiments/finetune.gin" if needs_data(self.mixture_for(row))
            else "experiments/finetune_embedded.gin")

  def length_params(self, row):
    """A decoder-only row's sequence lengths: inputs + targets = the
    pre-training's length P, in the pre-training's position embedding table
    (P positions unless the row binds max_length otherwise), [] otherwise.

    Example: lm_heads rows (P = 128) give inputs_length = 112,
    targets_length = 16, transformer.Unitransformer.max_length = 128.
    """
    if not self._decoder_only(row):
      return []
    length = rows_lib.positive_int(
        self.plan.config(row).require("targets_length", row.name),
        "targets_length", row.name)
    if length <= LM_TARGETS_LENGTH:
      raise ValueError(
          "--finetune: row %s is pre-trained on sequences of %d positions "
          "(targets_length); a decoder-only fine-tuning needs more than the "
          "%d of the targets: pre-train it longer (--gin_param "
          "'targets_length = 128') or leave the row out of --rows"
          % (row.name, length, LM_TARGETS_LENGTH))
    table = position_table(self.plan.config(row)) or length
    return ["inputs_length = %d" % (length - LM_TARGETS_LENGTH),
            "targets_length = %d" % LM_TARGETS_LENGTH,
            "%s = %d" % (_TABLE, table)]

  def vocabulary_params(self):
    return vocabulary_params(self.mixture)

  def default_steps(self):
    """--finetune_steps, else the finetune_steps macro of finetune.gin."""
    if self.steps is not None:
      return self.steps
    config = gin_reader.GinConfig(["experiments/finetune.gin"], (),
                                  gin_dir=self.plan.gin_dir)
    return rows_lib.positive_int(config.require("finetune_steps", "finetune"),
                                 "finetune_steps", "finetune.gin")

  def preflight_gin(self, row, seed=1):
    """(gin_files, gin_params) as `mtf_th finetune` parses them, with the
    bindings it adds (init checkpoint aside), for a dry run's pre-flight."""
    files, params = self.gin(row, seed)
    return files, params + ["utils.run.train_steps = %d" % self.total_steps]

  def gin(self, row, seed):
    """(gin_files, gin_params) of the run's `mtf_th finetune`."""
    files = list(self.plan.row_files(row)) + [self.gin_file(row)]
    params = list(self.plan.row_params(row, seed)) + [
        "train_steps = %d" % self.plan.train_steps,
        "MIXTURE_NAME = %r" % self.mixture_for(row)] + self.length_params(row)
    return files, params

  def model_dir(self, row, seed):
    return os.path.join(self.plan.model_dir(row, seed), FINETUNE_DIR)

  def commands(self, row, seed):
    """[`mtf_th finetune` argv, `mtf_th eval --metrics` argv] of one run."""
    ft_dir = self.model_dir(row, seed)
    files, params = self.gin(row, seed)
    gin = []
    for f in files:
      gin += ["--gin_file", f]
    for p in params:
      gin += ["--gin_param", p]
    data = ["--data_dir", self.data_dir] if self.data_dir else []
    steps = ["--finetune_steps", str(self.steps)] if self.steps else []
    finetune = (["mtf_th", "finetune", "--pretrained_model_dir",
                 self.plan.model_dir(row, seed), "--model_dir", ft_dir] + gin
                + self.plan.tpu_flags + data
                + ["--checkpoint_step", str(self.plan.train_steps)] + steps)
    metrics = (["mtf_th", "eval", "--metrics", "--model_dir", ft_dir]
               + self.plan.tpu_flags + data
               + (["--max_eval_examples", str(self.max_eval_examples)]
                  if self.max_eval_examples else []))
    return [finetune, metrics]

  def manifest(self):
    return dict(mixture=self.mixture, steps=self.steps,
                max_eval_examples=self.max_eval_examples,
                data_dir=self.data_dir)

  # ---------------------------------------------------------- state
  def stage_state(self, row, seed):
    """"done", "scored" is missing ("finetuned") or "todo" (resumes)."""
    ft_dir = self.model_dir(row, seed)
    if any(r["step"] == self.total_steps
           for r in read_downstream(ft_dir)):
      return "done"
    if run_files.listed_latest_step(ft_dir) == self.total_steps:
      return "finetuned"
    return "todo"

  def cannot_start(self, row, seed):
    """True when the stage has to run `mtf_th finetune` ("todo") but the
    pre-training checkpoint it starts from (step train_steps) is gone: a
    commit carries a run's small files, not its checkpoints, to another
    machine."""
    return (self.stage_state(row, seed) == "todo"
            and self.plan.train_steps not in run_files.checkpoint_steps(
                self.plan.model_dir(row, seed)))

  def record(self, row, seed):
    """The stage's results.csv cells (COLUMNS) from downstream_results.csv."""
    mixture = self.mixture_for(row)
    values = {(r["task"], r["metric"]): r["value"]
              for r in read_downstream(self.model_dir(row, seed))
              if r["step"] == self.total_steps}
    record = dict(downstream_mixture=mixture, finetune_step=self.total_steps,
                  span_f1=None, cls_accuracy=None)
    tasks = column_tasks(mixture)
    if tasks:
      record["span_f1"] = values.get(tasks[0])
      record["cls_accuracy"] = values.get(tasks[1])
    return record

  def all_metrics(self, row, seed):
    """{(task, metric): value} at the final fine-tuning step."""
    return {(r["task"], r["metric"]): r["value"]
            for r in read_downstream(self.model_dir(row, seed))
            if r["step"] == self.total_steps}

  # ---------------------------------------------------------- text
  def dry_run_header(self):
    mixtures = sorted({self.mixture_for(r) for r in self.plan.rows})
    text = ("# then fine-tune each run %d steps (to step %d) on %s into "
            "<run>/%s/ and score its downstream metrics"
            % (self.default_steps(), self.total_steps, ", ".join(mixtures),
               FINETUNE_DIR))
    if self.data_dir:
      text += "; TFDS data from --data_dir %s" % self.data_dir
    if self.vocabulary_params():
      text += "; every stage uses t5's vocabulary %s" % T5_VOCABULARY
    return text


def columns_note(stage):
  """One paragraph under results.md's table: what the downstream columns are."""
  mixtures = sorted({stage.mixture_for(r) for r in stage.plan.rows})
  text = ("\nDownstream columns: each run fine-tuned %d steps (to step %d) on "
          "%s, then scored on the validation split by the tasks' metrics "
          "(`mtf_th eval --metrics`); every task's metrics in `%s`."
          % (stage.default_steps(), stage.total_steps, ", ".join(mixtures),
             DOWNSTREAM_MD))
  families = {_family(m) for m in mixtures}
  lexical = "misspelt-word span F1, word-order acceptability accuracy"
  kinds = {EMBEDDED_MIXTURE: "cloze span F1, copied-words entailment accuracy",
           LM_MIXTURE: lexical, LEXICAL_MIXTURE: lexical}
  if len(families) == 1 and families <= set(kinds):
    text += (" These are the embedded benchmark built from the local corpus "
             "(%s), stand-ins for the paper's SQuAD v1.1 and MNLI-m columns, "
             "not those benchmarks." % kinds[families.pop()])
  return text


def downstream_comparison(plan):
  """Each variant's downstream columns against multi-head's, paired by seed.

  Returns markdown: per (variant, multi-head) pair of comparison.pairs, the
  mean ± standard error over seeds of variant − multi-head for the two
  columns, and the seeds in which the variant scores higher; "" without a
  pair scored in a common seed.  Example line (3 seeds):
    | talking-heads | 8 | 02_multi_head_8_16 | 3 | +4.10 ± 1.20 | -0.50 ± 0.40 | 3/3, 1/3 |
  """
  stage = plan.finetune
  labels = column_labels(stage.mixture_for(plan.rows[0]))
  lines = []
  for row, base in comparison.pairs(plan.rows):
    deltas = ([], [])
    for seed in range(1, plan.seeds + 1):
      mine, theirs = stage.record(row, seed), stage.record(base, seed)
      for i, key in enumerate(("span_f1", "cls_accuracy")):
        if mine[key] is not None and theirs[key] is not None:
          deltas[i].append(mine[key] - theirs[key])
    if not any(deltas):
      continue
    seeds = max(len(d) for d in deltas)
    cells = [comparison.format_mean_se(comparison.mean_se(d), "%+.2f",
                                       seeds, se_fmt="%.2f") for d in deltas]
    wins = ", ".join("%d/%d" % (sum(1 for v in d if v > 0), len(d))
                     for d in deltas)
    lines.append("| %s | %d | %s | %d | %s | %s | %s |" % (
        row.label, row.heads, base.name, seeds, cells[0], cells[1], wins))
  if not lines:
    return ""
  header = ("\n## Each variant vs multi-head\n\n"
            "| variant | heads | vs | seeds | Δ %s | Δ %s | higher (seeds) |\n"
            "|---|---:|---|---:|---:|---:|---:|\n" % labels)
  return header + "\n".join(lines) + (
      "\n\nΔ = variant − multi-head (positive: the variant scores higher), "
      "mean ± standard error over the seeds both runs are scored in, paired "
      "by seed; (n=k) marks a column that fewer seeds give; higher: the "
      "seeds in which the variant scores higher, per column.\n")


def downstream_markdown(plan):
  """downstream.md: every (task, metric) per row, mean (std) over seeds.

  Like the paper's Appendix B tables: one column per task and metric, the
  best of each column in bold.  Each line starts with the row's name (its
  directory under runs/), since rows that differ only in their heads share
  a variant label:

    | row | variant | th_embedded_cloze f1 | ...
    | 01_multi_head_8_16 | multi-head | 37.30 (31.72) | ...
  """
  stage = plan.finetune
  values = {}  # (row name, task, metric) -> [value per seed]
  keys = []
  for row in plan.rows:
    for seed in range(1, plan.seeds + 1):
      for key, value in sorted(stage.all_metrics(row, seed).items()):
        if key not in keys:
          keys.append(key)
        values.setdefault((row.name,) + key, []).append(value)
  lines = ["# Downstream metrics of `%s`, %s scale\n" % (plan.table,
                                                           plan.scale),
           columns_note(stage).strip() + "\n"]
  if not keys:
    return "\n".join(lines + ["No fine-tuned run is scored yet.\n"])
  header = ["row", "variant"] + ["%s %s" % key for key in keys]
  lines.append("| " + " | ".join(header) + " |")
  lines.append("|" + "|".join([":---"] * 2 + ["---:"] * len(keys)) + "|")
  best = {}
  for key in keys:
    means = [comparison.mean_std(values.get((r.name,) + key, []))[0]
             for r in plan.rows]
    means = [m for m in means if m is not None]
    best[key] = max(means) if len(means) > 1 else None
  for row in plan.rows:
    cells = [row.name, row.label]
    for key in keys:
      mean, std, n = comparison.mean_std(values.get((row.name,) + key, []))
      if mean is None:
        cells.append("")
        continue
      cell = "%.2f" % mean
      if best[key] is not None and cell == "%.2f" % best[key]:
        cell = "**%s**" % cell
      if n > 1:
        cell += " (%.2f)" % std
      cells.append(cell)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n" + downstream_comparison(plan)


def _scoped_binding(config, name, scope):
  """The binding gin applies inside config scope `scope` ("" for none)."""
  if scope:
    value = config.binding("%s/%s" % (scope, name))
    if value is not None:
      return value
  return config.binding(name)


def position_table(config, scope=""):
  """The size of the learned position embedding table of the Unitransformer
  in gin scope `scope` (encoder, decoder; "" for a decoder-only LM), or None
  without one (positional_embedding False; mtf's default is True).

  Example: models/encdec_small.gin -> None; with
  models/absolute_positions.gin -> 160 in "encoder" and "decoder".
  """
  positional = _scoped_binding(config, _POSITIONS, scope)
  if positional is not None and not positional:
    return None
  return _scoped_binding(config, _TABLE, scope)


def needs_data(mixture):
  """True for a mixture read from TFDS: given, and not one built from the
  embedded corpus (th_finetune_embedded, th_finetune_lexical, th_copy_bytes,
  ... but the paper's th_finetune_squad_glue_superglue)."""
  return bool(mixture) and (mixture == PAPER_MIXTURE
                            or not mixture.startswith(LOCAL_PREFIX))


def vocabulary_params(mixture):
  """Bindings every stage gets (pre-training too): t5's vocabulary for a
  mixture of t5's tasks, nothing for the embedded one."""
  if needs_data(mixture):
    return ("th_data.vocabulary_options.path = %r" % T5_VOCABULARY,)
  return ()


def plan_model(plan, row):
  """The row's model kind (see rows.model_of)."""
  return rows_lib.model_of(row, plan.gin_dir)
