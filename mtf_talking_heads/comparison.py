"""Each attention variant against multi-head attention, from a sweep's runs.

A sweep (sweep.py) trains rows x seeds; every run leaves a held-out curve
(<run>/eval_results.csv: ln(PPL) at each evaluated step) and its training
log (<run>/train_log.csv: steps/s).  This module pairs every row with the
multi-head row of the same head count (the paper's comparison: equal
parameters) and, seed by seed, measures

  equal steps  Delta = ln(PPL)_variant - ln(PPL)_multi-head at the last step;
  equal time   the same at the training time of the cheaper run of the pair
               (the other run's curve read at that time, interpolated between
               its evaluated steps); time = steps x the run's median seconds
               per step (graph building and evaluation excluded);
  multiplier   how many more steps (and how much more time) multi-head needs
               to reach the variant's held-out loss, read off multi-head's
               curve: at the variant's last step when multi-head gets there,
               else at the variant's latest evaluated step whose loss
               multi-head reaches (the step is reported), else "not reached";

then means and standard errors (sample std / sqrt(seeds)) over seeds.
Negative Delta = the variant is better.  Pure Python: no TensorFlow needed.

Example (one seed; curves {step: ln_ppl}, 0.1 s/step vs 0.15 s/step):
  >>> mh = Curve({500: 2.4, 1000: 2.2}, 0.10)
  >>> th = Curve({500: 2.3, 1000: 2.1}, 0.15)
  >>> round(th.at_step(1000) - mh.at_step(1000), 3)      # equal steps
  -0.1
  >>> delta, budget = equal_time_delta(th, mh)  # th at step 667, mh at 1000
  >>> round(delta, 3), budget
  (0.033, 100.0)
  >>> multiplier, step = steps_multiplier(th, mh)  # mh: 2.3 at step 750
  >>> round(multiplier, 3), step
  (1.5, 500)
"""
import collections
import csv
import math
import os
import statistics

TRAIN_LOG = "train_log.csv"
EVAL_RESULTS = "eval_results.csv"
COMPARISON_CSV = "comparison.csv"
COMPARISON_MD = "comparison.md"
# Optional, in the sweep's directory: step times measured side by side
# (benchmarks/small_regime.py); they replace the runs' own for equal time.
STEP_TIMES = "step_times.csv"
BASELINE = "multi_head"
COLUMNS = ("row", "baseline", "heads", "seed", "final_step", "ln_ppl",
           "baseline_ln_ppl", "delta_equal_steps", "equal_time_sec",
           "delta_equal_time", "step_time_sec", "baseline_step_time_sec",
           "steps_multiplier", "multiplier_at_step", "time_multiplier")


class Curve(object):
  """A run's held-out curve and its steady-state seconds per step.

  Args:
    points: {step: ln_ppl}.
    step_time: seconds per training step.
  """

  def __init__(self, points, step_time):
    self.steps = sorted(points)
    self.points = dict(points)
    self.step_time = step_time

  @property
  def final_step(self):
    return self.steps[-1]

  def at_step(self, step):
    """ln(PPL) at `step`, linear between evaluated steps (None outside)."""
    if not self.steps or step < self.steps[0] or step > self.steps[-1]:
      return None
    for a, b in zip(self.steps, self.steps[1:]):
      if a <= step <= b:
        t = (step - a) / float(b - a)
        return self.points[a] + t * (self.points[b] - self.points[a])
    return self.points[self.steps[0]]

  def step_reaching(self, loss):
    """First step (interpolated) at which the curve is <= loss, or None."""
    previous = None
    for step in self.steps:
      value = self.points[step]
      if value <= loss:
        if previous is None:
          return float(step)
        p_step, p_value = previous
        t = (p_value - loss) / (p_value - value)
        return p_step + t * (step - p_step)
      previous = (step, value)
    return None


def equal_time_delta(curve, baseline):
  """variant - baseline ln(PPL) when both have trained equally long.

  The budget is the shorter run's whole training time; the other curve is
  read at the step it had reached by then.
  """
  budget = min(curve.final_step * curve.step_time,
               baseline.final_step * baseline.step_time)
  mine = curve.at_step(budget / curve.step_time)
  theirs = baseline.at_step(budget / baseline.step_time)
  if mine is None or theirs is None:
    return None, budget
  return mine - theirs, budget


def steps_multiplier(curve, baseline):
  """(baseline steps / variant steps to the same loss, variant step).

  At the variant's last evaluated step if the baseline reaches that loss,
  else at its latest step whose loss the baseline reaches; (None, None) if
  the baseline never reaches any.
  """
  for step in reversed(curve.steps):
    reached = baseline.step_reaching(curve.points[step])
    if reached is not None:
      return reached / step, step
  return None, None


def read_curve(model_dir, split="validation", skip_steps=10):
  """The Curve of one run directory, or None if it has no evaluations."""
  points = {}
  path = os.path.join(model_dir, EVAL_RESULTS)
  if os.path.exists(path):
    with open(path) as f:
      for r in csv.DictReader(f):
        if r.get("split") == split and r.get("ln_ppl"):
          points[int(r["step"])] = float(r["ln_ppl"])
  points.pop(0, None)
  if not points:
    return None
  return Curve(points, median_step_time(model_dir, skip_steps))


def median_step_time(model_dir, skip_steps=10):
  """Median seconds per step in train_log.csv after its first `skip_steps`
  rows (graph building, warm-up; half the rows of a shorter log); the
  median also ignores the few slow rows after a resume."""
  path = os.path.join(model_dir, TRAIN_LOG)
  rates = []
  if os.path.exists(path):
    with open(path) as f:
      for r in csv.DictReader(f):
        try:
          rates.append(float(r["steps_per_sec"]))
        except (KeyError, TypeError, ValueError):
          continue
  skip = min(skip_steps, len(rates) // 2)
  times = [1.0 / rate for rate in rates[skip:] if rate > 0]
  return statistics.median(times) if times else float("nan")


def mean_std(values):
  """(mean, sample std, n) of the values that are not None or NaN; std is
  None if n < 2, mean None if n = 0."""
  values = [v for v in values if v is not None and not math.isnan(v)]
  if not values:
    return None, None, 0
  if len(values) < 2:
    return values[0], None, 1
  return statistics.mean(values), statistics.stdev(values), len(values)


def mean_se(values):
  """(mean, standard error, n): mean_std with std / sqrt(n)."""
  mean, std, n = mean_std(values)
  return mean, (None if std is None else std / math.sqrt(n)), n


def pairs(rows):
  """[(row, baseline row)]: every non-multi-head row with the multi-head
  row of the same heads, d_k and d_v (or, failing that, the same heads)."""
  baselines = [r for r in rows if r.variant == BASELINE]
  out = []
  for row in rows:
    if row.variant == BASELINE:
      continue
    same = [b for b in baselines if (b.heads, b.d_k, b.d_v) ==
            (row.heads, row.d_k, row.d_v)] or [
                b for b in baselines if b.heads == row.heads]
    if same:
      out.append((row, same[0]))
  return out


def read_step_times(output_dir):
  """{row name: seconds per step} from output_dir/STEP_TIMES, or {}."""
  path = os.path.join(output_dir, STEP_TIMES)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {r["row"]: float(r["step_time_sec"]) for r in csv.DictReader(f)}


def _curve(row, seed, model_dir_fn, step_times):
  curve = read_curve(model_dir_fn(row, seed))
  if curve is not None and row.name in step_times:
    curve.step_time = step_times[row.name]
  return curve


def compare(rows, seeds, model_dir_fn, step_times=None):
  """Per-seed comparisons of every (row, baseline) pair.

  Args:
    rows: sweep rows (sweep.Row).
    seeds: number of seeds (1..seeds).
    model_dir_fn: (row, seed) -> run directory.
    step_times: {row name: seconds per step} measured side by side
      (read_step_times); rows not in it use their runs' own median.
  Returns:
    [dict] with the keys of COLUMNS, one per pair and seed with both runs
    evaluated.
  """
  records = []
  for row, base in pairs(rows):
    for seed in range(1, seeds + 1):
      mine = _curve(row, seed, model_dir_fn, step_times or {})
      theirs = _curve(base, seed, model_dir_fn, step_times or {})
      if mine is None or theirs is None:
        continue
      final = min(mine.final_step, theirs.final_step)
      a, b = mine.at_step(final), theirs.at_step(final)
      delta_time, budget = equal_time_delta(mine, theirs)
      mult, at = steps_multiplier(mine, theirs)
      records.append(dict(
          row=row.name, baseline=base.name, heads=row.heads, seed=seed,
          final_step=final, ln_ppl=a, baseline_ln_ppl=b,
          delta_equal_steps=a - b, equal_time_sec=budget,
          delta_equal_time=delta_time, step_time_sec=mine.step_time,
          baseline_step_time_sec=theirs.step_time, steps_multiplier=mult,
          multiplier_at_step=at,
          time_multiplier=(None if mult is None else
                           mult * theirs.step_time / mine.step_time)))
  return records


def summarize(records, labels):
  """Per pair: means and standard errors over seeds.

  Args:
    records: compare() output.
    labels: {row name: label for tables}.
  Returns:
    [dict(row, baseline, label, heads, seeds, delta_steps=(mean, se),
          delta_time=(mean, se), steps_mult=(mean, se), time_mult=(mean, se),
          mult_steps=[step...], step_time_ratio=mean, wins=int)]
  """
  by_pair = collections.OrderedDict()
  for r in records:
    by_pair.setdefault((r["row"], r["baseline"]), []).append(r)
  out = []
  for (row, base), recs in by_pair.items():
    ratio = mean_se([r["step_time_sec"] / r["baseline_step_time_sec"]
                     for r in recs])[0]
    out.append(dict(
        row=row, baseline=base, label=labels.get(row, row),
        heads=recs[0]["heads"], seeds=len(recs),
        final_step=recs[0]["final_step"],
        delta_steps=mean_se([r["delta_equal_steps"] for r in recs])[:2],
        delta_time=mean_se([r["delta_equal_time"] for r in recs])[:2],
        steps_mult=mean_se([r["steps_multiplier"] for r in recs])[:2],
        time_mult=mean_se([r["time_multiplier"] for r in recs])[:2],
        mult_steps=sorted(set(r["multiplier_at_step"] for r in recs
                              if r["multiplier_at_step"] is not None)),
        unreached=sum(1 for r in recs if r["steps_multiplier"] is None),
        step_time_ratio=ratio,
        wins=sum(1 for r in recs if r["delta_equal_steps"] < 0)))
  return out


def format_mean_se(value, fmt="%+.3f"):
  """(mean, se) as "-0.054 ± 0.002" ("n/a" without a mean)."""
  mean, se = value
  if mean is None:
    return "n/a"
  return (fmt % mean) + ("" if se is None else " ± %.3f" % se)





def _mult(summary):
  mean, se = summary["time_mult"]
  steps = summary["steps_mult"]
  if steps[0] is None:
    return "not reached", "not reached"
  where = ""
  if summary["mult_steps"] and summary["mult_steps"][-1] != summary[
      "final_step"]:
    where = " (at step %s)" % ",".join(str(s) for s in summary["mult_steps"])
  if summary["unreached"]:
    where += " (%d seed%s not reached)" % (
        summary["unreached"], "" if summary["unreached"] == 1 else "s")
  return (format_mean_se(steps, "%.2f×") + where,
          "n/a" if mean is None else format_mean_se((mean, se), "%.2f×"))


def markdown(summaries):
  """The comparison table (one line per pair)."""
  lines = [
      "| variant | heads | vs | seeds | Δ ln(PPL) equal steps | "
      "Δ ln(PPL) equal time | step time ratio | multi-head steps to match "
      "| multi-head time to match | better (seeds) |",
      "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
  for s in summaries:
    steps_mult, time_mult = _mult(s)
    ratio = s["step_time_ratio"]
    lines.append("| %s | %d | %s | %d | %s | %s | %s | %s | %s | %d/%d |" % (
        s["label"], s["heads"], s["baseline"], s["seeds"],
        format_mean_se(s["delta_steps"]), format_mean_se(s["delta_time"]),
        "n/a" if ratio is None else "%.2f" % ratio,
        steps_mult, time_mult, s["wins"], s["seeds"]))
  return "\n".join(lines) + "\n"


NOTE = (
    "Δ = variant − multi-head held-out ln(PPL) (negative: the variant is "
    "better), mean ± standard error over seeds, paired by seed.  Equal steps: "
    "at the last evaluated step.  Equal time: at the shorter run's training "
    "time (median s/step × steps; graph building and evaluation excluded), "
    "the other curve interpolated between evaluated steps.  Step time ratio: "
    "variant ÷ multi-head.  Multi-head steps (time) to match: multi-head's "
    "steps (training seconds) to reach the variant's held-out loss ÷ the "
    "variant's, read off multi-head's curve, at the variant's last step "
    "unless another step is named.\n")


def write(output_dir, rows, seeds, model_dir_fn, labels):
  """Writes comparison.csv and comparison.md; returns the summaries."""
  step_times = read_step_times(output_dir)
  records = compare(rows, seeds, model_dir_fn, step_times)
  with open(os.path.join(output_dir, COMPARISON_CSV), "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
  summaries = summarize(records, labels)
  with open(os.path.join(output_dir, COMPARISON_MD), "w") as f:
    f.write("# Each variant vs multi-head attention\n\n")
    f.write(markdown(summaries) + "\n" + NOTE)
    f.write("\nStep times: %s.\n" % (
        "measured side by side, from %s (benchmarks/small_regime.py)"
        % STEP_TIMES if step_times else
        "each run's own median (runs that did not run side by side: on a "
        "shared machine they measure the load as much as the model)"))
  return summaries


def plot_curves(rows, seeds, model_dir_fn, path, title=""):
  """Held-out ln(PPL) against steps and against training seconds (mean
  over seeds at each evaluated step), one line per row."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.8),
                                         sharey=True)
  for row in rows:
    curves = [c for c in (read_curve(model_dir_fn(row, s))
                          for s in range(1, seeds + 1)) if c is not None]
    if not curves:
      continue
    steps = sorted(set.intersection(*[set(c.steps) for c in curves]))
    means = [sum(c.points[s] for c in curves) / len(curves) for s in steps]
    seconds = sum(c.step_time for c in curves) / len(curves)
    style = "--" if row.variant == BASELINE else "-"
    label = "%s h=%d (%d seed%s)" % (row.label, row.heads, len(curves),
                                     "" if len(curves) == 1 else "s")
    line, = by_step.plot(steps, means, style, marker="o", ms=3, label=label)
    by_time.plot([s * seconds for s in steps], means, style, marker="o",
                 ms=3, color=line.get_color())
  by_step.set_xlabel("training step")
  by_time.set_xlabel("training seconds (median s/step × steps)")
  by_step.set_ylabel("held-out ln(PPL)")
  for ax in (by_step, by_time):
    ax.grid(alpha=0.3)
  by_step.legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
