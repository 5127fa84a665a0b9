"""Sweep: a Plan with its Runner and Reporter, the object callers use.

Owns only the composition: `mtf_th sweep`, `mtf_th demo`, benchmarks/ and
the tests build a Sweep(...) and call run(), dry_run_text(), summary() ...;
the work is plan.py's, run.py's and report.py's.
"""
from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.experiments.sweep import finetune as finetune_lib
from mtf_talking_heads.experiments.sweep import plan as plan_lib
from mtf_talking_heads.experiments.sweep import report
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.experiments.sweep import run as run_lib


class Sweep(plan_lib.Plan):
  """Rows x seeds, trained and evaluated through `mtf_th train` / `mtf_th eval`.

  Example:
    rows = paper_table_rows("t5_heads")
    sweep = Sweep(rows, output_dir="/tmp/t5_heads", scale="tiny", seeds=3,
                  train_steps=1000, eval_steps=(250, 1000), table="t5_heads")
    sweep.run()          # or: print(sweep.dry_run_text())

  Args:
    rows, output_dir, scale, seeds, train_steps, eval_steps, table,
    gin_files, gin_params, tpu, tpu_zone, gcp_project, gin_dir: as Plan.
    launcher: argv prefix that runs `mtf_th` (default: this Python).
    log: where progress lines go (default sys.stdout).
    finetune: None, or a dict of finetune.Finetune's options (mixture,
      steps, max_eval_examples, data_dir): after pre-training, every run is
      fine-tuned and scored, filling the downstream columns.

  Attributes:
    reporter: the report.Reporter of this sweep.
    runner: the run.Runner of this sweep.

  Raises:
    ValueError: any bad argument, before anything runs.
  """

  def __init__(self, rows, output_dir, scale="tiny", seeds=1,
               train_steps=None, eval_steps=None, table="grid", gin_files=(),
               gin_params=(), launcher=None, tpu=None, tpu_zone=None,
               gcp_project=None, gin_dir=gin_reader.GIN_DIR, log=None,
               finetune=None):
    if finetune is not None:  # t5's tasks: t5's vocabulary in every stage
      gin_params = tuple(gin_params) + finetune_lib.vocabulary_params(
          finetune.get("mixture"))
    super().__init__(rows, output_dir, scale=scale, seeds=seeds,
                     train_steps=train_steps, eval_steps=eval_steps,
                     table=table, gin_files=gin_files, gin_params=gin_params,
                     tpu=tpu, tpu_zone=tpu_zone, gcp_project=gcp_project,
                     gin_dir=gin_dir)
    if finetune is not None:
      self.finetune = finetune_lib.Finetune(self, **finetune)
    self.reporter = report.Reporter(self)
    self.runner = run_lib.Runner(self, self.reporter, launcher, log)

  @property
  def launcher(self):
    return self.runner.launcher

  @launcher.setter
  def launcher(self, value):
    self.runner.launcher = value

  @property
  def log(self):
    return self.runner.log

  @log.setter
  def log(self, value):
    self.runner.log = value

  def results_path(self):
    return results.results_path(self.output_dir)

  def read_results(self):
    """Recorded runs: {(row name, seed): record} (strings as in the CSV)."""
    return results.read_results(self.output_dir)

  def run(self, train=True):
    """Runner.run: trains and evaluates every unfinished run, then reports."""
    return self.runner.run(train)

  def summary(self):
    """Reporter.summary: one dict per row, means and stds over seeds."""
    return self.reporter.summary()

  def markdown(self, summary=None):
    """Reporter.markdown: the paper-layout markdown table."""
    return self.reporter.markdown(summary)

  def write_table(self):
    self.reporter.write_table()

  def write_plots(self):
    return self.reporter.write_plots()
