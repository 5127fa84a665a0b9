"""Multi-head vs talking-heads attention on a small byte-level LM: held-out loss at equal steps and equal time.

  mtf_th demo [--output_dir=demo_output] [--heads=8] [--train_steps=1000]
              [--eval_every=250] [--seed=1] [--fresh]

What `make demo` runs.  Trains two rows of the small-regime heads table
(gin/experiments/lm_heads: a decoder-only LM on the bytes of the embedded
corpus, d_model 128, h * d_k = d_model, so 8 heads have d_k = d_v = 16;
talking heads then costs 1.17x multi-head's multiplies per attention layer,
the paper's proportion at its 24 heads):
multi-head and talking-heads attention with the same number of heads and
parameters, on one CPU device (a one-device mesh: no communication, the
cheapest layout for either; the layers' default sharding strategy,
mtf_th.Auto(), picks heads_parallel there, and logs so; multi-device
sharding is in docs/sharding.md).
Each run is evaluated on the held-out split every --eval_every steps, so
each gives a curve; the demo then prints held-out ln(PPL) (nats per byte)

  * at equal steps (both after --train_steps),
  * at equal time (both after the cheaper run's training seconds, the other
    curve read at the step it had reached by then),

with each model's steps/s, then the same comparison over several seeds and
all head counts as recorded in this repository (sweeps/lm_heads, the
source of docs/results.md), and writes <output_dir>/demo.md (all that),
<output_dir>/curves.png (held-out loss against steps and against seconds)
and the sweep's files (results.csv, comparison.csv, runs/).  The runs are exactly those of
`mtf_th sweep --paper_table lm_heads --scale small --train_steps 1000
--eval_steps 250,500,750,1000` (same gin, same seed 1): docs/results.md has
the same comparison over 3 seeds, with standard errors, and at 4, 16 and 32
heads.  A second invocation resumes (--fresh starts
over).
"""
import os
import shutil
import sys
import time

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.core import spec

PROG = "mtf_th demo"
TABLE = "lm_heads"
SCALE = "small"


def _rows(sweep, heads):
  """The multi-head and talking-heads rows of TABLE with `heads` heads."""
  rows = [r for r in sweep.paper_table_rows(TABLE) if r.heads == heads and
          r.variant in (spec.MULTI_HEAD, spec.TALKING_HEADS)]
  if len(rows) != 2:
    choices = sorted(set(r.heads for r in sweep.paper_table_rows(TABLE)))
    raise commands.UsageError("--heads %d: gin/experiments/%s has no such "
                              "rows; choose one of %s" % (heads, TABLE,
                                                          choices))
  return sorted(rows, key=lambda r: r.variant != spec.MULTI_HEAD)


def _eval_steps(train_steps, every):
  steps = list(range(every, train_steps, every)) + [train_steps]
  if len(steps) < 2:
    raise commands.UsageError(
        "--eval_every %d must be below --train_steps %d (the demo needs a "
        "curve of at least two points)" % (every, train_steps))
  return steps


# The lm_heads sweep recorded in this repository (docs/results.md).
RECORDED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "sweeps", TABLE)


def _recorded(comparison, path):
  """(sweep.json settings, summaries by heads) of a recorded sweep, or None."""
  import json  # pylint: disable=g-import-not-at-top
  csv_path = os.path.join(path, comparison.COMPARISON_CSV)
  manifest = os.path.join(path, "sweep.json")
  if not (os.path.exists(csv_path) and os.path.exists(manifest)):
    return None
  with open(manifest) as f:
    settings = json.load(f)
  summaries = comparison.summarize(comparison.read_records(csv_path), {})
  return settings, {s["heads"]: s for s in summaries}


def recorded_sweep(comparison, path=RECORDED):
  """The repository's multi-seed lm_heads comparison, as demo text."""
  recorded = _recorded(comparison, path)
  if recorded is None:
    return ("This run is one seed; docs/results.md has the same comparison "
            "over several seeds (the recorded sweep is not in this "
            "installation).\n")
  settings, by_heads = recorded
  lines = ["This run is one seed. The recorded sweep %s (%s scale, %d "
           "steps, evaluated at %s; docs/results.md), paired by seed, mean "
           "± standard error:" % (
               os.path.relpath(path), settings["scale"],
               settings["train_steps"],
               ",".join(map(str, settings["eval_steps"]))),
           "",
           "| heads | seeds | Δ ln(PPL) equal steps | Δ ln(PPL) equal time |"
           " talking heads better |", "|---:|---:|---:|---:|---:|"]
  for heads in sorted(by_heads):
    s = by_heads[heads]
    lines.append("| %d | %d | %s | %s | %d/%d |" % (
        heads, s["seeds"],
        comparison.format_mean_se(s["delta_steps"], seeds=s["seeds"]),
        comparison.format_mean_se(s["delta_time"], seeds=s["seeds"]),
        s["wins"], s["seeds"]))
  return "\n".join(lines) + "\n"


def verdict(delta, recorded_summary):
  """Says whether a one-seed Δ is beyond the recorded seed noise."""
  side = "talking heads" if delta < 0 else "multi-head"
  if recorded_summary is None:
    return "%s lower in this run (one seed)" % side
  mean, se, n = recorded_summary["delta_steps"]
  if se is None or n < 2:
    return "%s lower in this run; the recorded sweep has %d seed%s here" % (
        side, n, "" if n == 1 else "s")
  beyond = abs(mean) > 2 * se
  return ("%s lower; over %d recorded seeds Δ = %s, %s" % (
      side, n, "%+.3f ± %.3f" % (mean, se),
      "more than twice its standard error" if beyond else
      "within twice its standard error: not distinguishable from seed noise"))


def _cell(value, fmt):
  return "n/a" if value is None or value != value else fmt % value


def _at_time(curve, step):
  """The equal-time cell: the loss at `step`, or why there is none."""
  if step is None:
    return "n/a"
  value = curve.at_step(step)
  if value is None:  # e.g. a load spike made one run 4x slower
    return "n/a (step %d, before the first evaluation at step %d)" % (
        round(step), curve.steps[0])
  return "%.3f (step %d)" % (value, round(step))


def report(job, comparison, elapsed, png, recorded_path=RECORDED):
  """The demo's markdown: equal steps, equal time, steps/s, costs."""
  mh, th = job.rows
  finished = set(job.read_results())
  records = comparison.compare(job.rows, 1, job.model_dir, finished=finished)
  if not records:
    return "no comparison: a run has no evaluations (see %s)" % job.output_dir
  rec = records[0]
  budget = rec["equal_time_sec"]
  costs = {r.name: job.cost_record(r) for r in job.rows}
  lines = [
      "| attention | heads | d_k = d_v | params / att. layer | "
      "multiplies / att. layer | steps/s | held-out ln(PPL) after %d steps "
      "| held-out ln(PPL) after %s s of training |" % (
          rec["final_step"], _cell(budget, "%.3g")),
      "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for row in job.rows:
    curve = comparison.read_curve(job.model_dir(row, 1))
    step = (None if budget is None else
            min(curve.final_step, budget / curve.step_time))
    lines.append("| %s | %d | %d | %d | %.3g | %s | %.3f | %s |" % (
        row.label, row.heads, row.d_k, costs[row.name]["params"],
        costs[row.name]["multiplies"], _cell(1.0 / curve.step_time, "%.2f"),
        curve.at_step(rec["final_step"]),
        _at_time(curve, step)))
  recorded = _recorded(comparison, recorded_path)
  ratio = rec["step_time_sec"] / rec["baseline_step_time_sec"]
  if rec["steps_multiplier"] is not None:
    mult = "Multi-head needs %.2f× the steps (%s the time) to reach " \
           "talking heads' final held-out loss." % (
               rec["steps_multiplier"], _cell(rec["time_multiplier"], "%.2f×"))
  else:
    mult = ("Multi-head does not reach talking heads' final held-out loss in "
            "its %d steps." % rec["baseline_final_step"])
  text = [
      "# mtf_th demo: multi-head vs talking-heads attention, %d heads of "
      "d_k = %d" % (mh.heads, mh.d_k), "",
      "\n".join(lines), "",
      "Δ (talking heads − multi-head) at equal steps: %+.3f nats/byte (%s)."
      % (rec["delta_equal_steps"], verdict(
          rec["delta_equal_steps"],
          recorded[1].get(th.heads) if recorded else None)),
      "Δ at equal time: %s; talking heads takes %s× multi-head's time per "
      "step on this machine." % (_cell(rec["delta_equal_time"], "%+.3f"),
                                 _cell(ratio, "%.2f")),
      mult, "",
      recorded_sweep(comparison, recorded_path),
      "Model: decoder-only byte LM (models/lm_small.gin), d_model 128, 2 "
      "layers, length 128, batch 16, one CPU device; ln(PPL) = mean "
      "cross-entropy in nats per byte of the held-out split; time = median "
      "s/step × steps (graph building and evaluation excluded).",
      "Wall time %.0f s. Curves: %s" % (elapsed, png), ""]
  return "\n".join(text)


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="demo_output")
  parser.add_argument("--heads", type=common.positive_int, default=8,
                      help="head count of both models (4, 8, 16 or 32)")
  parser.add_argument("--train_steps", type=common.positive_int,
                      default=1000)
  parser.add_argument("--eval_every", type=common.positive_int,
                      default=250, help="held-out evaluation every N steps")
  parser.add_argument("--seed", type=common.positive_int, default=1)
  parser.add_argument("--scale", choices=("small", "tiny"), default=SCALE,
                      help="small (default): models/lm_small.gin; tiny: "
                      "models/lm_tiny.gin, for tests (seconds, no signal)")
  parser.add_argument("--fresh", action="store_true",
                      help="delete output_dir first")
  parser.add_argument("--verbose", action=commands.VerboseAction,
                      help="keep TensorFlow's log, warnings and mtf's "
                      "tf.Print in the runs' sweep.log files")
  argv_used = list(sys.argv[1:] if argv is None else argv)
  args = commands.parse(parser, argv_used)
  if isinstance(args, int):
    return args
  print("[demo] multi-head vs talking heads, %d heads, %d steps each -> %s"
        % (args.heads, args.train_steps, args.output_dir), file=sys.stderr,
        flush=True)
  from mtf_talking_heads.experiments import comparison  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.experiments import sweep  # pylint: disable=g-import-not-at-top
  try:
    rows = _rows(sweep, args.heads)
    job = sweep.Sweep(
        rows, args.output_dir, scale=args.scale, seeds=1,
        train_steps=args.train_steps,
        eval_steps=_eval_steps(args.train_steps, args.eval_every),
        table=TABLE, gin_params=[
            "save_checkpoints_steps = %d" % args.eval_every,
            "seed = %d" % args.seed], log=sys.stderr)
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  try:
    prechecks.directory(args.output_dir, "--output_dir", write=True)
    prechecks.not_in_use(args.output_dir, "--output_dir")
    prechecks.cache()
    if not args.fresh:
      job.runner.manifest_conflict()
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  start = time.time()
  if args.fresh and os.path.isdir(args.output_dir):
    shutil.rmtree(args.output_dir)
  try:
    job.run()
  except ValueError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  except RuntimeError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    import shlex  # pylint: disable=g-import-not-at-top
    print("%s: interrupted; %d of 2 runs finished in %s, and the run in "
          "progress continues from its last checkpoint: resume with: %s %s"
          % (PROG, len(job.read_results()), args.output_dir, PROG,
             shlex.join([a for a in argv_used if a != "--fresh"])),
          file=sys.stderr)
    return 130
  png = comparison.plot_curves(
      job.rows, 1, job.model_dir, os.path.join(args.output_dir, "curves.png"),
      title="decoder-only byte LM, %d heads: held-out loss" % args.heads,
      caption="mtf_th demo " + " ".join(argv_used))
  text = report(job, comparison, time.time() - start, png)
  with open(os.path.join(args.output_dir, "demo.md"), "w") as f:
    f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
