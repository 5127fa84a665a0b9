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
cheapest layout for either; multi-device sharding is in docs/sharding.md).
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
from mtf_talking_heads.commands import train as train_command

PROG = "mtf_th demo"
TABLE = "lm_heads"
SCALE = "small"


def _rows(sweep, heads):
  """The multi-head and talking-heads rows of TABLE with `heads` heads."""
  rows = [r for r in sweep.paper_table_rows(TABLE) if r.heads == heads and
          r.variant in ("multi_head", "talking_heads")]
  if len(rows) != 2:
    choices = sorted(set(r.heads for r in sweep.paper_table_rows(TABLE)))
    raise commands.UsageError("--heads %d: gin/experiments/%s has no such "
                              "rows; choose one of %s" % (heads, TABLE,
                                                          choices))
  return sorted(rows, key=lambda r: r.variant != "multi_head")


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


def recorded_sweep(comparison, path=RECORDED):
  """The repository's multi-seed lm_heads comparison, as demo text."""
  csv_path = os.path.join(path, comparison.COMPARISON_CSV)
  if not os.path.exists(csv_path):
    return ("This run is one seed; docs/results.md has the same comparison "
            "over 3 seeds (the recorded sweep is not in this installation).")
  import csv  # pylint: disable=g-import-not-at-top
  with open(csv_path) as f:
    records = [{k: (None if v == "" else (v if k in ("row", "baseline") else
                                           float(v)))
                for k, v in r.items()} for r in csv.DictReader(f)]
  lines = ["This run is one seed. The same runs over several seeds, recorded "
           "in sweeps/%s (docs/results.md; mean ± standard error):" % TABLE,
           "",
           "| heads | seeds | Δ ln(PPL) equal steps | Δ ln(PPL) equal time |"
           " talking heads better |", "|---:|---:|---:|---:|---:|"]
  for s in sorted(comparison.summarize(records, {}),
                  key=lambda s: s["heads"]):
    lines.append("| %d | %d | %s | %s | %d/%d |" % (
        s["heads"], s["seeds"], comparison.format_mean_se(s["delta_steps"]),
        comparison.format_mean_se(s["delta_time"]), s["wins"], s["seeds"]))
  return "\n".join(lines) + "\n"


def report(job, comparison, summaries, elapsed, png):
  """The demo's markdown: equal steps, equal time, steps/s, costs."""
  mh, th = job.rows
  records = {r["row"]: r for r in comparison.compare(
      job.rows, job.seeds, job.model_dir)}
  rec = records.get(th.name)
  if rec is None:
    return "no comparison: a run has no evaluations (see %s)" % job.output_dir
  costs = {r.name: job.cost_record(r) for r in job.rows}
  lines = [
      "| attention | heads | d_k = d_v | params / att. layer | "
      "multiplies / att. layer | steps/s | held-out ln(PPL) after %d steps "
      "| held-out ln(PPL) after %.0f s of training |" % (
          rec["final_step"], rec["equal_time_sec"]),
      "|---|---:|---:|---:|---:|---:|---:|---:|"]
  curves = {r.name: comparison.read_curve(job.model_dir(r, 1))
            for r in job.rows}
  for row in job.rows:
    curve = curves[row.name]
    steps_at_budget = rec["equal_time_sec"] / curve.step_time
    at_time = curve.at_step(steps_at_budget)
    lines.append("| %s | %d | %d | %d | %.3g | %.2f | %.3f | %.3f (step %d) |"
                 % (row.label, row.heads, row.d_k, costs[row.name]["params"],
                    costs[row.name]["multiplies"], 1.0 / curve.step_time,
                    curve.at_step(rec["final_step"]), at_time,
                    round(steps_at_budget)))
  s = summaries[0]
  verdict = ("talking heads is better" if rec["delta_equal_steps"] < 0
             else "multi-head is better")
  text = [
      "# mtf_th demo: multi-head vs talking-heads attention, %d heads of "
      "d_k = %d" % (mh.heads, mh.d_k), "",
      "\n".join(lines), "",
      "Δ (talking heads − multi-head): %+.3f nats/byte at equal steps "
      "(%s), %s at equal time; talking heads takes %.2f× multi-head's time "
      "per step." % (
          rec["delta_equal_steps"], verdict,
          "n/a" if rec["delta_equal_time"] is None else
          "%+.3f" % rec["delta_equal_time"], s["step_time_ratio"]),
      "Multi-head needs %s the steps (%s the time) to reach talking heads' "
      "held-out loss%s." % (
          "n/a" if rec["steps_multiplier"] is None else
          "%.2f×" % rec["steps_multiplier"],
          "n/a" if rec["time_multiplier"] is None else
          "%.2f×" % rec["time_multiplier"],
          "" if rec["multiplier_at_step"] in (None, rec["final_step"]) else
          " at talking heads' step %d (it does not reach the final one)"
          % rec["multiplier_at_step"]),
      "",
      recorded_sweep(comparison),
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
  parser.add_argument("--heads", type=train_command.positive_int, default=8,
                      help="head count of both models (4, 8, 16 or 32)")
  parser.add_argument("--train_steps", type=train_command.positive_int,
                      default=1000)
  parser.add_argument("--eval_every", type=train_command.positive_int,
                      default=250, help="held-out evaluation every N steps")
  parser.add_argument("--seed", type=train_command.positive_int, default=1)
  parser.add_argument("--scale", choices=("small", "tiny"), default=SCALE,
                      help="small (default): models/lm_small.gin; tiny: "
                      "models/lm_tiny.gin, for tests (seconds, no signal)")
  parser.add_argument("--fresh", action="store_true",
                      help="delete output_dir first")
  parser.add_argument("--verbose", action=commands.VerboseAction,
                      help="keep TensorFlow's log, warnings and mtf's "
                      "tf.Print in the runs' sweep.log files")
  args = commands.parse(parser, sys.argv[1:] if argv is None else argv)
  if isinstance(args, int):
    return args
  print("[demo] multi-head vs talking heads, %d heads, %d steps each -> %s"
        % (args.heads, args.train_steps, args.output_dir), file=sys.stderr,
        flush=True)
  from mtf_talking_heads import comparison  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import sweep  # pylint: disable=g-import-not-at-top
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
  png = comparison.plot_curves(
      job.rows, 1, job.model_dir, os.path.join(args.output_dir, "curves.png"),
      title="decoder-only byte LM, %d heads: held-out loss" % args.heads)
  summaries = comparison.summarize(
      comparison.compare(job.rows, 1, job.model_dir),
      {r.name: r.label for r in job.rows})
  text = report(job, comparison, summaries, time.time() - start, png)
  with open(os.path.join(args.output_dir, "demo.md"), "w") as f:
    f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
