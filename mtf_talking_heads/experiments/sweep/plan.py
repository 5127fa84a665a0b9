"""The plan of a sweep: which runs, with which gin, by which commands.

Owns the scales (which gin files put a row at tiny / small / base scale),
the costs per row, and Plan: rows x seeds with their model directories, the
`mtf_th train` / `mtf_th eval` commands of each run, the manifest that a
resumed sweep must match, and the dry-run text.  Nothing here runs anything
or reads results; run.py executes a plan, report.py reports on it.
"""
import collections
import os
import shlex

from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.experiments.sweep import report
from mtf_talking_heads.experiments.sweep import rows as rows_lib

SCALES = ("tiny", "small", "base")
PAPER_LENGTH = costs.PAPER_LENGTH
# Paper: 65536 of 524288 steps for the early ln(PPL) column.
EARLY_FRACTION = 8
MANIFEST = "sweep.json"

Run = collections.namedtuple("Run", ["row", "seed", "model_dir", "commands"])
Run.__doc__ = """One row x seed: its directory and the mtf_th commands it runs."""


# ---------------------------------------------------------------------------
# Scale and costs.

# Which model a row is: rows.py's (finetune.py needs it too, without plan).
model_and_size = rows_lib.model_and_size
model_of = rows_lib.model_of


def scale_files(row, scale, gin_dir=gin_reader.GIN_DIR):
  """The gin files that put `row` at `scale` (after the row's own files).

  A row of a paper-size model runs at "base" (its own files) or "tiny"; a
  row of a small-regime model at "small" (its own files) or "tiny".
  """
  if scale not in SCALES:
    raise ValueError("scale=%r is unknown; choose from %s"
                     % (scale, ", ".join(SCALES)))
  model, size = model_and_size(row, gin_dir)
  if scale == "tiny":
    return ("models/%s_tiny.gin" % model,)
  if scale != size:
    raise ValueError("row %s is a %s model (models/%s_%s.gin): use --scale "
                     "%s or tiny, not %s" % (row.name, size, model, size,
                                             size, scale))
  return ()


def row_costs(row, d_model, length):
  """(params, multiplies as the paper counts, multiplies executed) or Nones.

  One attention layer with n = m = length.  Rows whose variant is in one
  placement only have no single figure (the paper prints "various").
  """
  if row.placement != "all":
    return None, None, None
  variant, hk, h, hv, dk, dv, d, _, dynamic = rows_lib.cost_args(row, d_model)
  folded = costs.attention_costs(variant, hk, h, hv, dk, dv, d, length,
                                 dynamic=dynamic, fold_dynamic="paper",
                                 groups=row.groups)
  executed = costs.attention_costs(variant, hk, h, hv, dk, dv, d, length,
                                   dynamic=dynamic, fold_dynamic="code",
                                   groups=row.groups)
  return folded["params"], folded["multiplies"], executed["multiplies"]


# ---------------------------------------------------------------------------
# The plan.

def _row_manifest(row):
  """A row as the manifest records it (groups only where set, so the
  manifests of sweeps recorded before rows had groups still match)."""
  record = dict(row._asdict(), dynamic=list(row.dynamic),
                gin_files=list(row.gin_files), gin_params=list(row.gin_params))
  if record["groups"] is None:
    del record["groups"]
  return record


def _int_list(text, name):
  try:
    values = [int(v) for v in str(text).split(",") if v.strip()]
  except ValueError:
    raise ValueError("%s=%r: expected comma-separated integers" % (name, text)) from None
  return values


class Plan(object):
  """Rows x seeds at one scale: the runs, their gin and their commands.

  Example (t5_heads rows 2 and 6 at tiny scale, 400 steps):
    plan = Plan(paper_table_rows("t5_heads")[1:6:4], "/tmp/th", "tiny",
                train_steps=400, eval_steps=(100, 400), table="t5_heads")
    plan.eval_steps == (100, 400); plan.d_model[row.name] == 64
    plan.commands(row, seed=1) == [["mtf_th", "train", "--model_dir",
        "/tmp/th/runs/<row>/seed_1", "--gin_file", ..., "--train_steps",
        "400"], ["mtf_th", "eval", ..., "--checkpoint_steps", "100,400"]]

  Args:
    rows: [Row] (paper_table_rows or grid_rows).
    output_dir: where runs/, results.csv, results.md and the plots go.
    scale: "tiny", "small" or "base".
    seeds: number of seeds (seed macro = 1, 2, ...).
    train_steps: steps per run; default: the configuration's `train_steps`
      macro (524288 at base, 2000 at tiny for T5).
    eval_steps: the steps at which ln(PPL) is measured (ascending, at least
      two, the last = train_steps); default train_steps / 8 and
      train_steps, like the paper's 65536 / 524288.
    table: the paper table's name (or a label for a grid sweep).
    gin_files: extra gin files after the scale's (e.g. layouts/...).
    gin_params: extra bindings after everything (e.g. "mesh_shape='model:2'").
    tpu, tpu_zone, gcp_project: a Cloud TPU: every command gets --tpu etc.
      (see dry_run_text).
    gin_dir: the gin root.

  Raises:
    ValueError: any bad argument, before anything runs.
  """

  def __init__(self, rows, output_dir, scale="tiny", seeds=1,
               train_steps=None, eval_steps=None, table="grid", gin_files=(),
               gin_params=(), tpu=None, tpu_zone=None, gcp_project=None,
               gin_dir=gin_reader.GIN_DIR):
    if not rows:
      raise ValueError("rows: the sweep has no rows")
    if scale not in SCALES:
      raise ValueError("scale=%r is unknown; choose from %s"
                       % (scale, ", ".join(SCALES)))
    spec_lib.positive_int("seeds", seeds)
    if not output_dir:
      raise ValueError("output_dir is required")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
      raise ValueError("rows: duplicate row names %s" % names)
    self.rows = list(rows)
    self.output_dir = output_dir
    self.scale = scale
    self.seeds = seeds
    self.table = table
    self.extra_files = tuple(gin_files)
    self.extra_params = tuple(gin_params)
    self.tpu_flags = []
    for flag, value in (("--tpu", tpu), ("--tpu_zone", tpu_zone),
                        ("--gcp_project", gcp_project)):
      if value:
        self.tpu_flags += [flag, value]
    if self.tpu_flags and not tpu:
      raise ValueError("tpu_zone / gcp_project need tpu (--tpu NAME)")
    self.gin_dir = gin_dir
    self._configs = {}
    for row in self.rows:  # also checks that every gin file exists
      self._configs[row.name] = gin_reader.GinConfig(
          self.row_files(row), self.row_params(row, seed=1), gin_dir=gin_dir)
    self.train_steps, self.eval_steps = self._steps(train_steps, eval_steps)
    self.d_model = {}
    self.cost_length = {}
    for row in self.rows:
      config = self._configs[row.name]
      self.d_model[row.name] = rows_lib.positive_int(
          config.require("d_model", row.name), "d_model", row.name)
      self.cost_length[row.name] = (
          PAPER_LENGTH if scale == "base" else rows_lib.positive_int(
              config.require("inputs_length", row.name), "inputs_length",
              row.name))

  # The fine-tuning stage (finetune.Finetune) when the sweep has one.
  finetune = None

  # ------------------------------------------------------------ configuration
  def config(self, row):
    """The row's GinConfig (its files and bindings at this scale, seed 1)."""
    return self._configs[row.name]

  def row_files(self, row):
    """Gin files of one run: the row's, the scale's, then the extra ones."""
    return (tuple(row.gin_files) + tuple(scale_files(row, self.scale,
                                                     self.gin_dir))
            + self.extra_files)

  def row_params(self, row, seed):
    """Gin bindings of one run (after all files)."""
    return tuple(row.gin_params) + ("seed = %d" % seed,) + self.extra_params

  def _steps(self, train_steps, eval_steps):
    if eval_steps is not None and not isinstance(eval_steps, (list, tuple)):
      eval_steps = _int_list(eval_steps, "eval_steps")
    if train_steps is None:
      if eval_steps:
        train_steps = max(eval_steps)
      else:
        defaults = {self._configs[r.name].require("train_steps", r.name)
                    for r in self.rows}
        if len(defaults) != 1:
          raise ValueError("train_steps: the rows' configurations disagree "
                           "(%s); give --train_steps" % sorted(defaults))
        train_steps, = defaults
    rows_lib.positive_int(train_steps, "train_steps", "sweep")
    if eval_steps is None:
      eval_steps = [max(1, train_steps // EARLY_FRACTION), train_steps]
    eval_steps = list(eval_steps)
    if len(eval_steps) < 2:
      raise ValueError("eval_steps=%r: give at least two steps, an early one "
                       "and the last (like the paper's 65536,524288); more "
                       "give each run a held-out curve" % (eval_steps,))
    for s in eval_steps:
      rows_lib.positive_int(s, "eval_steps", "sweep")
    if any(a >= b for a, b in zip(eval_steps, eval_steps[1:])):
      raise ValueError("eval_steps=%r must be ascending" % (eval_steps,))
    if eval_steps[-1] != train_steps:
      raise ValueError("eval_steps=%r: the last must equal train_steps=%d"
                       % (eval_steps, train_steps))
    return train_steps, tuple(eval_steps)

  # ------------------------------------------------------------ runs
  def runs(self):
    """Every Run, seed-major: every row with seed 1 first, so that a sweep
    stopped early still has a whole table."""
    return [Run(row, seed, self.model_dir(row, seed),
                self.commands(row, seed))
            for seed in range(1, self.seeds + 1) for row in self.rows]

  def model_dir(self, row, seed):
    return os.path.join(self.output_dir, "runs", row.name, "seed_%d" % seed)

  def _gin_args(self, row, seed):
    args = []
    for f in self.row_files(row):
      args += ["--gin_file", f]
    for p in self.row_params(row, seed):
      args += ["--gin_param", p]
    args += ["--gin_param", "train_steps = %d" % self.train_steps]
    return args

  def train_gin(self, row, seed=1):
    """(gin_files, gin_params) that the run's first `mtf_th train` parses.

    Its --train_steps is included as the binding `mtf_th train` adds, so
    training.parse_gin(*plan.train_gin(row)) then training.preflight()
    checks exactly what that command will check.
    """
    steps = self._train_segments(row)[0]
    params = self.row_params(row, seed) + (
        "train_steps = %d" % self.train_steps,
        "utils.run.train_steps = %d" % steps)
    return list(self.row_files(row)), list(params)

  def _train_segments(self, row):
    """The --train_steps of each `mtf_th train` call of a run.

    One call when every eval step falls on a regular checkpoint
    (save_checkpoints_steps divides it), else one call per eval step (each
    call ends with a checkpoint).
    """
    every = self._configs[row.name].get("save_checkpoints_steps")
    if isinstance(every, int) and every > 0 and all(
        s % every == 0 for s in self.eval_steps):
      return [self.eval_steps[-1]]
    return list(self.eval_steps)

  def commands(self, row, seed):
    """The argv lists (starting with "mtf_th") of one run, in order."""
    model_dir = self.model_dir(row, seed)
    gin = self._gin_args(row, seed)
    tpu = self.tpu_flags
    keep = ["--keep_checkpoint_steps", ",".join(map(str, self.eval_steps))]
    cmds = [["mtf_th", "train", "--model_dir", model_dir] + gin + tpu
            + keep + ["--train_steps", str(steps)]
            for steps in self._train_segments(row)]
    cmds.append(["mtf_th", "eval", "--model_dir", model_dir] + gin + tpu
                + ["--checkpoint_steps",
                   ",".join(str(s) for s in self.eval_steps)])
    return cmds

  def manifest(self):
    """What must not change between invocations sharing an output_dir."""
    manifest = self._pretraining_manifest()
    if self.finetune:
      manifest["finetune"] = self.finetune.manifest()
    return manifest

  @classmethod
  def from_manifest(cls, manifest, output_dir):
    """The Plan a sweep.json records (manifest()'s inverse, without seeds or
    a fine-tuning stage).

    Raises:
      KeyError, TypeError: not a manifest; ValueError: a bad field.
    """
    rows = [rows_lib.Row(**dict(r, dynamic=tuple(r["dynamic"]),
                                gin_files=tuple(r["gin_files"]),
                                gin_params=tuple(r["gin_params"])))
            for r in manifest["rows"]]
    return cls(rows, output_dir, scale=manifest["scale"],
               train_steps=manifest["train_steps"],
               eval_steps=manifest["eval_steps"], table=manifest["table"],
               gin_files=manifest.get("extra_gin_files", ()),
               gin_params=manifest.get("extra_gin_params", ()))

  def _pretraining_manifest(self):
    return dict(
        table=self.table, scale=self.scale, train_steps=self.train_steps,
        eval_steps=list(self.eval_steps),
        extra_gin_files=list(self.extra_files),
        extra_gin_params=list(self.extra_params),
        rows=[_row_manifest(r) for r in self.rows])

  # ------------------------------------------------------------ records
  def cost_record(self, row):
    """The cost columns of a row's results.csv lines."""
    params, mults, executed = row_costs(row, self.d_model[row.name],
                                        self.cost_length[row.name])
    return dict(params=params, multiplies=mults, multiplies_executed=executed,
                d_model=self.d_model[row.name],
                cost_length=self.cost_length[row.name])

  def row_record(self, row, seed):
    """A run's results.csv line without its measurements."""
    record = dict(table=self.table, row=row.name, row_label=row.label,
                  variant=row.variant, dynamic=",".join(row.dynamic),
                  placement=row.placement, scale=self.scale, seed=seed,
                  early_step=self.eval_steps[0],
                  final_step=self.eval_steps[-1],
                  model_dir=self.model_dir(row, seed))
    record.update({d: getattr(row, d) for d in rows_lib.DIMS})
    if row.variant == spec_lib.BILINEAR:  # no d_k, d_v of its own
      record["d_k"] = record["d_v"] = self.d_model[row.name]
    record.update(self.cost_record(row))
    return record

  # ------------------------------------------------------------ text
  def command_line(self):
    """An `mtf_th sweep` command that makes this sweep (for captions).

    Paper-table sweeps name their rows by number; grid sweeps are described
    by their table label only.
    """
    if self.table not in rows_lib.paper_table_names(self.gin_dir):
      return "mtf_th sweep (%s) --output_dir %s" % (self.table,
                                                     self.output_dir)
    all_rows = [r.name for r in rows_lib.paper_table_rows(self.table,
                                                          self.gin_dir)]
    numbers = [str(all_rows.index(r.name) + 1) for r in self.rows
               if r.name in all_rows]
    rows = ("" if numbers == [str(i + 1) for i in range(len(all_rows))]
            else " --rows " + ",".join(numbers))
    return ("mtf_th sweep --paper_table %s%s --scale %s --seeds %d "
            "--train_steps %d --eval_steps %s --output_dir %s" % (
                self.table, rows, self.scale, self.seeds, self.train_steps,
                ",".join(map(str, self.eval_steps)), self.output_dir))

  def dry_run_text(self):
    """The commands every run would execute, then the table (costs only)."""
    lines = ["# %d runs (%d rows x %d seeds), %s scale, %d steps, ln(PPL) at "
             "%s" % (len(self.rows) * self.seeds, len(self.rows), self.seeds,
                     self.scale, self.train_steps,
                     ",".join(map(str, self.eval_steps)))]
    if self.finetune:
      lines.append(self.finetune.dry_run_header())
    for run in self.runs():
      lines.append("# %s seed %d" % (run.row.name, run.seed))
      commands = list(run.commands)
      if self.finetune:
        commands += self.finetune.commands(run.row, run.seed)
      lines.extend(" ".join(shlex.quote(a) for a in argv)
                   for argv in commands)
    summary = report.summarize(self.rows, [], {r.name: self.cost_record(r)
                                               for r in self.rows})
    return "\n".join(lines) + "\n\n" + report.plan_markdown(self, summary)
