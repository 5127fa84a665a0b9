"""Train and evaluate a grid of attention configurations (a paper table or explicit values); table + plots.

  mtf_th sweep --list_paper_tables
  mtf_th sweep --paper_table t5_heads --scale tiny --seeds 3 \\
      --train_steps 1000 --eval_steps 250,1000 --output_dir /tmp/t5_heads
  mtf_th sweep --grid heads=6,12,24,48 --tie d_k=768/heads --tie d_v=768/heads \\
      --grid variant=multi_head,talking_heads --output_dir /tmp/heads
  mtf_th sweep --paper_table t5_heads --scale base --dry_run --output_dir gs://b/t5
  mtf_th sweep --scaling sweeps/scaling_d128 sweeps/scaling_d192 \\
      sweeps/scaling_d256 --output_dir sweeps/scaling

Each row x seed is `mtf_th train` (one or two calls) then `mtf_th eval`, in
child processes, under <output_dir>/runs/<row>/seed_<n>.  Results:
<output_dir>/results.csv (every run), results.md (the paper's layout, mean
and std over seeds, best in bold), plot_heads.png (ln(PPL) vs heads),
plot_loss.png (loss curves), plot_step_time.png (step time vs multiplies).
Rerunning skips the runs already in results.csv; Ctrl-C, or `kill PID`
(SIGTERM) in the background, stops the run in flight cleanly (status 130,
143).  --dry_run prints the commands and the table with params and
multiplies only, then runs `mtf_th train`'s pre-flight checks on every row
(a row that cannot train is an error, status 2), and trains nothing.
Bad arguments exit with status 2 and one message on stderr.

--scaling DIR DIR [DIR ...] reads recorded sweeps, one per model size
(gin/experiments/scaling_d128, _d192, _d256), and writes to --output_dir
scaling.png (held-out ln(PPL) vs training FLOPs, both variants, every size's
curve, power-law fits dashed), scaling.md and scaling.csv (per size: params,
FLOPs, both losses, Δ, the compute multiplier read off multi-head's fit and
off its measured curves), scaling_points.csv and scaling_fit.csv
(sweep/scaling.py); it trains nothing.

--finetune chains, per run, pre-training -> `mtf_th finetune` into
<run>/finetune/ (experiments/finetune.gin's settings; --finetune_steps,
--finetune_mixture) -> `mtf_th eval --metrics`, and fills the downstream
columns of results.csv / results.md (the paper's "SQuAD v1.1 dev-F1" and
"MNLI-m dev"; on the default embedded benchmark, its stand-ins) and
downstream.md (every task's metrics).  Finished stages are skipped on a
rerun; an interrupted fine-tune resumes from its checkpoint.  The paper's
mixture (--finetune_mixture th_finetune_squad_glue_superglue) is read by
TFDS from --data_dir; a dataset missing there stops the sweep with one line
(status 2) before anything runs.
"""
import argparse
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import prechecks

PROG = "mtf_th sweep"




def _build_parser():
  parser = commands.ArgumentParser(
      prog=PROG,
      description="Sweep attention configurations like the paper's tables. "
      "See docs/sweeps.md.")
  what = parser.add_argument_group("what to sweep (one of)")
  what.add_argument("--list_paper_tables", action="store_true",
                    help="print the paper tables' names, one a line, and exit")
  what.add_argument("--paper_table", metavar="NAME",
                    help="the rows of gin/experiments/NAME/ (file order)")
  what.add_argument("--rows", metavar="SPEC",
                    help="with --paper_table: only these rows, 1-based, "
                    "e.g. 1-8 or 1,5")
  what.add_argument("--grid", action="append", default=[], metavar="KEY=V,..",
                    help="grid axis (repeatable): variant, heads_k, heads, "
                    "heads_v, d_k or d_v; the rows are the product")
  what.add_argument("--tie", action="append", default=[], metavar="DIM=EXPR",
                    help="a dim computed from another: 768/heads, heads, "
                    "2*heads, heads/2, 64 (repeatable); heads_k, heads_v "
                    "default to heads and d_v to d_k")
  what.add_argument("--variant", help="variant of every grid row (unless "
                    "--grid variant=...)")
  what.add_argument("--dynamic", metavar="TERMS",
                    help="dynamic_projections rows: subset of x2l,m2l,x2w,m2w "
                    "(default all four)")
  what.add_argument("--placement", default="all",
                    help="grid rows: all (default), enc_self, dec_self or "
                    "encdec (multi-head attention elsewhere)")
  what.add_argument("--model", default="t5",
                    help="grid rows: t5 (default), bert or albert")
  how = parser.add_argument_group("how")
  how.add_argument("--scale", default=None,
                   help="tiny (CPU: models/<model>_tiny.gin after each row's "
                   "files; the default for the paper's tables), base (the "
                   "paper's sizes) or small (the small-regime tables' own "
                   "models; their default)")
  how.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="runs per row, seed macro 1..N (default 1)")
  how.add_argument("--train_steps", type=int, metavar="N",
                   help="steps per run (default: the configuration's "
                   "train_steps, or the last --eval_steps)")
  how.add_argument("--eval_steps", metavar="A,B", type=_eval_steps,
                   help="the two steps with ln(PPL) columns (default "
                   "train_steps/8,train_steps, like the paper's "
                   "65536,524288)")
  how.add_argument("--output_dir", metavar="DIR",
                   help="runs/, results.csv, results.md, plots (required)")
  how.add_argument("--gin_file", action="append", default=[],
                   help="extra gin file for every run, after the scale's "
                   "(e.g. layouts/heads_parallel.gin)")
  how.add_argument("--gin_param", action="append", default=[],
                   help="extra gin binding for every run, last (e.g. "
                   "\"mesh_shape = 'model:2'\")")
  how.add_argument("--mesh_shape", help="shorthand for --gin_param "
                   "\"mesh_shape = '...'\" (logical CPU devices locally)")
  how.add_argument("--layout", help="shorthand for --gin_param "
                   "\"layout = '...'\"")
  how.add_argument("--tpu", metavar="NAME",
                   help="pass --tpu NAME to every train/eval command (with "
                   "--dry_run: print the TPU commands)")
  how.add_argument("--cluster", metavar="HOST:PORT,...",
                   help="run every train and eval on these `mtf_th server` "
                   "tasks (docs/cluster.md)")
  how.add_argument("--devices_per_task", type=common.positive_int,
                   metavar="K",
                   help="passed on with --cluster (default 1)")
  how.add_argument("--tpu_zone", help="passed on with --tpu")
  how.add_argument("--gcp_project", help="passed on with --tpu")
  tune = parser.add_argument_group("fine-tuning (paper section 7.1)")
  tune.add_argument("--finetune", action="store_true",
                    help="after pre-training, fine-tune every run and "
                    "score its downstream metrics (results.md columns, "
                    "downstream.md)")
  tune.add_argument("--finetune_steps", type=int, metavar="N",
                    help="fine-tuning steps (default: finetune.gin's 131072)")
  tune.add_argument("--finetune_mixture", metavar="NAME",
                    help="default: th_finetune_embedded for encoder-decoder "
                    "rows (built from the local corpus, as is any other th_* "
                    "name but the paper's), th_finetune_lm for decoder-only "
                    "rows (their only choice); _bytes for byte-level rows; "
                    "the paper's: th_finetune_squad_glue_superglue (needs "
                    "--data_dir and SentencePiece rows)")
  tune.add_argument("--finetune_eval_examples", type=int, metavar="N",
                    help="score at most N validation examples per task "
                    "(default: all)")
  tune.add_argument("--data_dir", metavar="DIR",
                    help="TFDS data directory of t5's SQuAD / GLUE / "
                    "SuperGLUE (e.g. gs://BUCKET/tensorflow_datasets)")
  curve = parser.add_argument_group("a scaling curve from recorded sweeps")
  curve.add_argument("--scaling", nargs="+", metavar="DIR",
                     help="the --output_dir of two or more recorded sweeps, "
                     "one per model size (e.g. sweeps/scaling_d128 "
                     "sweeps/scaling_d192 sweeps/scaling_d256): write "
                     "scaling.png (held-out ln(PPL) vs training FLOPs), "
                     "scaling.md and its CSVs to --output_dir; train nothing")
  curve.add_argument("--scaling_heads", type=common.positive_int,
                     metavar="H", help="with --scaling: take each sweep's "
                     "rows of H heads (default: each sweep has one head "
                     "count)")
  how.add_argument("--report", action="store_true",
                   help="rewrite results.md, comparison.md and the plots "
                   "from the runs recorded in --output_dir (after "
                   "benchmarks/small_regime.py, or while another process "
                   "trains); train nothing")
  how.add_argument("--dry_run", action="store_true",
                   help="print the commands and the table (params and "
                   "multiplies only); train nothing, write nothing")
  return parser


def _make_sweep(args, sweep):
  """Builds the Sweep from parsed arguments (ValueError on bad input)."""
  if args.paper_table and (args.grid or args.tie or args.variant
                           or args.dynamic):
    raise commands.UsageError("--paper_table defines its own rows; drop "
                              "--grid, --tie, --variant and --dynamic")
  if not args.paper_table and not args.grid:
    raise commands.UsageError("give --paper_table NAME, --grid KEY=V1,V2,... "
                              "or --list_paper_tables")
  if args.rows and not args.paper_table:
    raise commands.UsageError("--rows selects rows of a --paper_table")
  if not args.output_dir:
    raise commands.UsageError("--output_dir is required")
  if args.paper_table:
    rows = sweep.select_rows(sweep.paper_table_rows(args.paper_table),
                             args.rows)
    table = args.paper_table
  else:
    dynamic = [t.strip() for t in (args.dynamic or "").split(",")
               if t.strip()]
    rows = sweep.grid_rows(sweep.parse_grid(args.grid),
                           sweep.parse_ties(args.tie), variant=args.variant,
                           dynamic=dynamic, placement=args.placement,
                           model=args.model)
    table = "grid"
  params = list(args.gin_param)
  if args.mesh_shape:
    params.append("mesh_shape = %r" % args.mesh_shape)
  if args.layout:
    params.append("layout = %r" % args.layout)
  scale = args.scale or ("small" if sweep.model_and_size(rows[0])[1] ==
                         "small" else "tiny")
  return sweep.Sweep(rows, args.output_dir, scale=scale,
                     seeds=args.seeds, train_steps=args.train_steps,
                     eval_steps=args.eval_steps, table=table,
                     gin_files=args.gin_file, gin_params=params, tpu=args.tpu,
                     tpu_zone=args.tpu_zone, gcp_project=args.gcp_project,
                     finetune=_finetune_options(args))


def _check_layout_axes(job):
  """The layout's mesh axes against the mesh, before TensorFlow is loaded
  (the pre-flight checks its dims against the model's)."""
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import spec  # pylint: disable=g-import-not-at-top
  for row in job.rows:
    config = gin_text.GinConfig(job.row_files(row), job.row_params(row, 1))
    layout, mesh = config.get("layout"), config.get("mesh_shape")
    if isinstance(layout, str) and isinstance(mesh, str):
      spec.check_layout_axes(
          layout, [name for name, _ in spec.parse_mesh_shape(mesh)],
          what="row %s: layout %r:" % (row.name, layout))


def _cluster_flags(args):
  """--cluster / --devices_per_task, passed on to every train and eval."""
  from mtf_talking_heads.runtime import cluster  # pylint: disable=g-import-not-at-top
  cluster.from_args(args, PROG, [])  # a bad value: one line, status 2
  if not args.cluster:
    return []
  return ["--cluster", args.cluster,
          "--devices_per_task", str(args.devices_per_task or 1)]


def _finetune_options(args):
  """Finetune's options from the flags, None without --finetune."""
  flags = {"--finetune_steps": args.finetune_steps,
           "--finetune_mixture": args.finetune_mixture,
           "--finetune_eval_examples": args.finetune_eval_examples,
           "--data_dir": args.data_dir}
  if not args.finetune:
    given = [f for f, v in flags.items() if v is not None]
    if given:
      raise commands.UsageError("%s go%s with --finetune"
                                % (", ".join(given),
                                   "es" if len(given) == 1 else ""))
    return None
  prechecks.task(args.finetune_mixture, args.gin_file, "--finetune_mixture",
                 own_task=prechecks.SWEEP_TASKS)
  return dict(mixture=args.finetune_mixture, steps=args.finetune_steps,
              max_eval_examples=args.finetune_eval_examples,
              data_dir=args.data_dir)


def _preflight(job, tpu):
  """`mtf_th train`'s pre-flight on every row of a dry run; exit status.

  The plan is printed first (it needs no TensorFlow); each row's gin is then
  parsed and checked as its first train command would, and every row that
  would fail is reported on stderr (status 2).
  """
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  stages = [("mtf_th train", job.train_gin)]
  if job.finetune:
    stages.append(("mtf_th finetune", job.finetune.preflight_gin))
  code = 0
  for command, gin_of in stages:
    failed = []
    for row in job.rows:
      gin_files, gin_params = gin_of(row)
      try:
        training.parse_gin(gin_files, gin_params)
        training.preflight(tpu=tpu)
      except training.ConfigError as e:
        failed.append(row.name)
        print("%s: error: row %s: %s" % (PROG, row.name, e), file=sys.stderr)
    if failed:
      print("%s: %d of %d rows fail the pre-flight of `%s` (%s): fix them "
            "before running the sweep" % (PROG, len(failed), len(job.rows),
                                          command, ", ".join(failed)),
            file=sys.stderr)
      code = 2
    else:
      print("%s: pre-flight of `%s` passed for all %d rows"
            % (PROG, command, len(job.rows)), file=sys.stderr)
  return code


def _eval_steps(text):
  """argparse type of --eval_steps: prechecks.step_list (no repeats, each
  >= 1); the plan checks the order and the count."""
  try:
    return prechecks.step_list(text, "", minimum=1)
  except commands.UsageError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def _check_data(job):
  """The TFDS data of the fine-tuning mixture, before anything runs; status."""
  if not (job.finetune and job.finetune.needs_data()):
    return 0
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # one line, no TF noise
  from mtf_talking_heads import data  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads.training import errors  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.training import tfds_data  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  try:
    # a gin `import my_tasks` registers the user's mixture, as in training
    for module in sorted({m for row in job.rows
                          for m in job.config(row).imports}):
      importlib.import_module(module)
  except ImportError as e:
    print("%s: error: --gin_file imports %s: %s" % (PROG, module, e),
          file=sys.stderr)
    return 2
  try:
    tfds_data.check_data(job.finetune.mixture, job.finetune.data_dir,
                         name_flag="--finetune_mixture")
  except errors.ConfigError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  return 0


def _check_paths(args, job):
  """What the real run checks before it trains, with no TensorFlow: the
  gin files and bindings, --output_dir (a directory, writable, not in use,
  not another sweep's, its results.csv lines those of its runs at this
  sweep's steps: Runner.records_conflict) and the cache.  The dry run
  checks the same."""
  prechecks.gin_files(args.gin_file)
  prechecks.gin_params(job.extra_params)
  prechecks.directory(args.output_dir, "--output_dir",
                      write=not args.report, must_exist=args.report)
  if args.report:
    if "://" not in args.output_dir:
      job.runner.records_conflict()
    return
  if "://" not in args.output_dir:
    prechecks.not_in_use(args.output_dir, "--output_dir")
    job.runner.manifest_conflict()
    job.runner.model_conflict()
    job.runner.records_conflict()
  if not args.tpu:
    prechecks.cache()


def _scaling(args, parser, argv):
  """--scaling: the figure and tables of recorded sweeps; exit status.

  Bad input (a flag of another mode, a missing or non-scaling sweep,
  fewer than two sizes, variants that differ) is one line, status 2,
  before matplotlib is imported.
  """
  import shlex  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.experiments.sweep import scaling  # pylint: disable=g-import-not-at-top
  defaults = vars(parser.parse_args([]))
  others = ["--" + k for k, v in sorted(vars(args).items())
            if k not in ("scaling", "scaling_heads", "output_dir")
            and v != defaults[k]]
  try:
    if others:
      raise commands.UsageError("--scaling reads recorded sweeps and trains "
                                "nothing: drop %s" % ", ".join(others))
    if args.scaling_heads and not args.scaling:
      raise commands.UsageError("--scaling_heads goes with --scaling")
    if not args.output_dir:
      raise commands.UsageError("--output_dir is required: where "
                                "scaling.png and its tables go")
    prechecks.directory(args.output_dir, "--output_dir", write=True)
    result = scaling.analyse(args.scaling, args.scaling_heads)
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  paths = scaling.write(result, args.output_dir,
                        caption="%s %s" % (PROG, shlex.join(argv)))
  sys.stdout.write(scaling.markdown(result))
  print("\n".join("wrote %s" % p for p in paths))
  return 0


def _interrupted(job, argv):
  """One line for a stop: what is recorded and the command that resumes."""
  import shlex  # pylint: disable=g-import-not-at-top
  done = len(job.read_results())
  return ("%s: interrupted; %d of %d runs are recorded in %s, and the run "
          "in progress continues from its last checkpoint: resume with: %s %s"
          % (PROG, done, len(job.runs()), job.results_path(), PROG,
             shlex.join(argv)))


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  from mtf_talking_heads.experiments import sweep  # pylint: disable=g-import-not-at-top
  parser = _build_parser()
  args = commands.parse(parser, argv)
  if isinstance(args, int):
    return args
  if args.list_paper_tables:
    print("\n".join(sweep.paper_table_names()))
    return 0
  if args.scaling is not None or args.scaling_heads:
    return _scaling(args, parser, argv)
  try:
    job = _make_sweep(args, sweep)
    _check_layout_axes(job)
    _check_paths(args, job)
    job.tpu_flags += _cluster_flags(args)  # every run on the same servers
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  if args.dry_run:
    sys.stdout.write(job.dry_run_text())
    sys.stdout.flush()
    return _check_data(job) or _preflight(job, args.tpu)
  try:
    if not args.report and _check_data(job):
      return 2
    job.run(train=not args.report)
  except ValueError as e:  # e.g. output_dir holds another sweep
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  except RuntimeError as e:  # a run failed; rerun to resume
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(_interrupted(job, argv), file=sys.stderr)
    return 130
  return 0


if __name__ == "__main__":
  sys.exit(main())
