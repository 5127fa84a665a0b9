"""Sweeps over attention configurations: the paper's tables, at any scale.

A sweep is a list of rows (attention configurations) times a number of seeds.
Rows come either from a paper table -- the gin experiment files under
``gin/experiments/<table>/``, one file per row, in file-name order, so the
grid is defined once, by the files the training uses -- or from explicit
values (``grid_rows``: ``heads=6,12,24,48`` with ``d_k=768/heads``).

Every row x seed is one training run through the training machinery: the
``mtf_th train`` and ``mtf_th eval`` commands, each in its own process (a
crash or a kill costs one run, never the sweep).  A run is finished when its
line is in ``<output_dir>/results.csv``; rerunning the same sweep skips
finished runs and continues the one that was in flight from its last
checkpoint.  After every run the
markdown table in the paper's layout (``results.md``) is rewritten, and at
the end the plots (``plot_heads.png``, ``plot_loss.png``,
``plot_step_time.png``).

Costs (params, multiplies per attention layer) come from costs.py: at base
scale with the paper's n = m = 512, at tiny scale with the model's actual
input length (the ``inputs_length`` macro), d_model from the configuration
(``d_model`` macro).  Dynamic projections are counted the paper's way
(folded, see docs/costs.md); the CSV also has the pseudocode's count, which
is what the layers execute.  Rows with talking heads in one placement only
have "various" costs, as in the paper.

The package, one job per file:
  (gin_text.py, outside sweep/: GinConfig, the macros of gin files.)
  rows.py        Row, the paper tables (gin/experiments/), --rows.
  grid.py        rows from explicit values (--grid, --tie).
  plan.py        scales, costs per row, Plan: runs, commands, manifest,
                 dry-run text.
  run.py         Runner: executes runs, resumes, accounts time, appends to
                 results.csv.
  results.py     results.csv and the training's CSV files of a run.
  report.py      summaries, the markdown table, Reporter (results.md,
                 comparison.md, plots).
  plots.py       the matplotlib figures.
  finetune.py    the --finetune stage: its commands, state, downstream
                 columns and downstream.md.
  scaling.py     --scaling: held-out loss vs training FLOPs over recorded
                 sweeps of several sizes, fits, compute multipliers.
  job.py         Sweep = Plan + Runner + Reporter (+ Finetune).
  (runtime/run_files.py, outside experiments/: a run's train_log.csv,
  eval_results.csv and checkpoints.)
Importing the package imports no TensorFlow and no matplotlib.

Example:
  rows = paper_table_rows("t5_heads")
  sweep = Sweep(rows, output_dir="/tmp/t5_heads", scale="tiny", seeds=3,
                train_steps=1000, eval_steps=(250, 1000), table="t5_heads")
  sweep.run()          # or: print(sweep.dry_run_text())
"""
# pylint: disable=g-importing-member  (this file only re-exports)
from mtf_talking_heads.core.gin_text import GIN_DIR
from mtf_talking_heads.core.gin_text import GinConfig
from mtf_talking_heads.experiments.sweep.grid import GRID_KEYS
from mtf_talking_heads.experiments.sweep.grid import grid_rows
from mtf_talking_heads.experiments.sweep.grid import LABELS
from mtf_talking_heads.experiments.sweep.grid import parse_grid
from mtf_talking_heads.experiments.sweep.grid import parse_ties
from mtf_talking_heads.experiments.sweep.job import Sweep
from mtf_talking_heads.experiments.sweep.plan import EARLY_FRACTION
from mtf_talking_heads.experiments.sweep.plan import MANIFEST
from mtf_talking_heads.experiments.sweep.plan import model_and_size
from mtf_talking_heads.experiments.sweep.plan import model_of
from mtf_talking_heads.experiments.sweep.plan import PAPER_LENGTH
from mtf_talking_heads.experiments.sweep.plan import Plan
from mtf_talking_heads.experiments.sweep.plan import row_costs
from mtf_talking_heads.experiments.sweep.plan import Run
from mtf_talking_heads.experiments.sweep.plan import scale_files
from mtf_talking_heads.experiments.sweep.plan import SCALES
from mtf_talking_heads.experiments.sweep.plots import plot_heads
from mtf_talking_heads.experiments.sweep.plots import plot_loss
from mtf_talking_heads.experiments.sweep.plots import plot_step_time
from mtf_talking_heads.experiments.sweep.report import CURVES_PLOT
from mtf_talking_heads.experiments.sweep.report import markdown_table
from mtf_talking_heads.experiments.sweep.report import PLOTS
from mtf_talking_heads.experiments.sweep.report import Reporter
from mtf_talking_heads.experiments.sweep.report import RESULTS_MD
from mtf_talking_heads.experiments.sweep.report import summarize
from mtf_talking_heads.experiments.sweep.results import read_eval_results
from mtf_talking_heads.experiments.sweep.results import read_train_log
from mtf_talking_heads.experiments.sweep.results import RESULT_COLUMNS
from mtf_talking_heads.experiments.sweep.results import RESULTS_CSV
from mtf_talking_heads.experiments.sweep.rows import DIMS
from mtf_talking_heads.experiments.sweep.rows import EXPERIMENTS
from mtf_talking_heads.experiments.sweep.rows import MODELS
from mtf_talking_heads.experiments.sweep.rows import paper_table_names
from mtf_talking_heads.experiments.sweep.rows import paper_table_rows
from mtf_talking_heads.experiments.sweep.rows import PLACEMENTS
from mtf_talking_heads.experiments.sweep.rows import Row
from mtf_talking_heads.experiments.sweep.rows import ROW_MACROS
from mtf_talking_heads.experiments.sweep.rows import select_rows
from mtf_talking_heads.experiments.sweep.rows import SMALL_MODELS
from mtf_talking_heads.experiments.sweep.rows import table_caption
from mtf_talking_heads.experiments.sweep.rows import VARIANTS
from mtf_talking_heads.experiments.sweep.run import RUN_TIME
from mtf_talking_heads.experiments.sweep.run import Runner

__all__ = [
    "CURVES_PLOT",
    "DIMS",
    "EARLY_FRACTION",
    "EXPERIMENTS",
    "GIN_DIR",
    "GinConfig",
    "GRID_KEYS",
    "grid_rows",
    "LABELS",
    "MANIFEST",
    "markdown_table",
    "model_and_size",
    "model_of",
    "MODELS",
    "PAPER_LENGTH",
    "paper_table_names",
    "paper_table_rows",
    "parse_grid",
    "parse_ties",
    "PLACEMENTS",
    "Plan",
    "plot_heads",
    "plot_loss",
    "plot_step_time",
    "PLOTS",
    "read_eval_results",
    "read_train_log",
    "Reporter",
    "RESULT_COLUMNS",
    "RESULTS_CSV",
    "RESULTS_MD",
    "Row",
    "row_costs",
    "ROW_MACROS",
    "Run",
    "RUN_TIME",
    "Runner",
    "scale_files",
    "SCALES",
    "select_rows",
    "SMALL_MODELS",
    "summarize",
    "Sweep",
    "table_caption",
    "VARIANTS",
]
