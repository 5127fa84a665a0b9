"""Each attention variant against multi-head attention, from a sweep's runs.

A sweep (the sweep package) trains rows x seeds; every run leaves a held-out curve
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

then means and standard errors (sample std / sqrt(seeds)) over seeds; and
gap_by_step: the equal-steps Delta at every evaluated step, to show whether
the gap grows or closes with training (comparison_steps.csv).
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

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.runtime import run_files

COMPARISON_CSV = "comparison.csv"
COMPARISON_MD = "comparison.md"
# Δ at every evaluated step (does the gap grow or close with training?)
GAP_CSV = "comparison_steps.csv"
GAP_COLUMNS = ("row", "baseline", "heads", "step", "delta", "se", "seeds")
# Optional, in the sweep's directory: step times measured side by side
# (benchmarks/small_regime.py); they replace the runs' own for equal time.
STEP_TIMES = "step_times.csv"
BASELINE = spec_lib.MULTI_HEAD
COLUMNS = ("row", "baseline", "heads", "seed", "final_step", "ln_ppl",
           "baseline_ln_ppl", "delta_equal_steps", "equal_time_sec",
           "delta_equal_time", "step_time_sec", "baseline_step_time_sec",
           "steps_multiplier", "time_multiplier", "baseline_final_step",
           "multiplier_at_step", "steps_multiplier_common",
           "step_time_source")


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
    """ln(PPL) at `step`, linear between evaluated steps (None outside, or
    for a step that is not a finite number)."""
    if step is None or not math.isfinite(step):
      return None
    if not self.steps or step < self.steps[0] or step > self.steps[-1]:
      return None
    for a, b in zip(self.steps, self.steps[1:]):
      if a <= step <= b:
        t = (step - a) / float(b - a)
        return self.points[a] + t * (self.points[b] - self.points[a])
    return self.points[self.steps[0]]

  def step_reaching(self, loss):
    """First step (interpolated) at which the curve is <= loss, or None.

    If the first evaluated point is already <= loss, that step is returned
    (an upper bound: the loss was reached at or before it).
    """
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
  if not (math.isfinite(curve.step_time) and
          math.isfinite(baseline.step_time)):
    return None, None
  budget = min(curve.final_step * curve.step_time,
               baseline.final_step * baseline.step_time)
  # the cheaper run at its own final step (budget / step_time may come out
  # one ulp past it), the other where it had got to by then
  mine = curve.at_step(min(curve.final_step, budget / curve.step_time))
  theirs = baseline.at_step(min(baseline.final_step,
                                budget / baseline.step_time))
  if mine is None or theirs is None:
    return None, budget
  return mine - theirs, budget


def steps_multiplier(curve, baseline, step=None):
  """(baseline steps / variant steps to the variant's loss at `step`, step).

  step=None: the variant's latest evaluated step whose loss the baseline
  reaches ((None, None) if none).  A given step whose loss the baseline
  does not reach gives (None, step).
  """
  for s in ([step] if step is not None else reversed(curve.steps)):
    reached = baseline.step_reaching(curve.points[s])
    if reached is not None:
      return reached / s, s
  return None, step


def read_curve(model_dir, split="validation", skip_steps=10):
  """The Curve of one run directory, or None if it has no evaluations."""
  points = run_files.scan_eval_results(model_dir, split)
  points.pop(0, None)
  if not points:
    return None
  return Curve(points, median_step_time(model_dir, skip_steps))


def median_step_time(model_dir, skip_steps=10):
  """Median seconds per step in train_log.csv after its first `skip_steps`
  rows (graph building, warm-up; half the rows of a shorter log); the
  median also ignores the few slow rows after a resume."""
  rates = [r["steps_per_sec"] for r in run_files.scan_train_log(model_dir)
           if r["steps_per_sec"] is not None]
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


def paired_curves(row, base, seeds, model_dir_fn, step_times=None,
                  finished=None):
  """(seed, row's Curve, base's Curve) for every seed both runs have.

  Args:
    row, base: a pair of sweep rows (pairs()).
    seeds, model_dir_fn, finished: as compare().
    step_times: {row name: seconds per step} for both rows, or None/{}:
      the runs' own medians.
  Yields:
    (seed, Curve, Curve), skipping seeds whose runs are not both finished
    and evaluated.
  """
  for seed in range(1, seeds + 1):
    if finished is not None and not {(row.name, seed),
                                     (base.name, seed)} <= finished:
      continue
    mine = _curve(row, seed, model_dir_fn, step_times or {})
    theirs = _curve(base, seed, model_dir_fn, step_times or {})
    if mine is not None and theirs is not None:
      yield seed, mine, theirs


def compare(rows, seeds, model_dir_fn, step_times=None, finished=None):
  """Per-seed comparisons of every (row, baseline) pair.

  Args:
    rows: sweep rows (sweep.Row).
    seeds: number of seeds (1..seeds).
    model_dir_fn: (row, seed) -> run directory.
    step_times: {row name: seconds per step} measured side by side
      (read_step_times); used for a pair only when both its rows are in
      it, else both use their runs' own medians.
    finished: set of (row name, seed) whose runs are complete (a sweep's
      results.csv); None: every run with evaluations.
  Returns:
    [dict] with the keys of COLUMNS, one per pair and seed with both runs
    finished and evaluated at a common final step.  The multiplier is read
    at the variant's final step (steps_multiplier; None if multi-head does
    not get there) and, in `multiplier_at_step`/`steps_multiplier_common`,
    at the latest step every seed's multi-head reaches.
  """
  records = []
  step_times = step_times or {}
  for row, base in pairs(rows):
    times = (step_times if row.name in step_times and base.name in step_times
             else {})
    runs = []
    for seed, mine, theirs in paired_curves(row, base, seeds, model_dir_fn,
                                            times, finished):
      final = min(mine.final_step, theirs.final_step)
      if mine.at_step(final) is None or theirs.at_step(final) is None:
        continue
      runs.append((seed, mine, theirs, final))
    reachable = [steps_multiplier(m, t)[1] for _, m, t, _ in runs]
    common = None if None in reachable or not reachable else min(reachable)
    for seed, mine, theirs, final in runs:
      a, b = mine.at_step(final), theirs.at_step(final)
      delta_time, budget = equal_time_delta(mine, theirs)
      mult, _ = steps_multiplier(mine, theirs, step=final)
      common_mult = (None if common is None else
                     steps_multiplier(mine, theirs, step=common)[0])
      ratio = theirs.step_time / mine.step_time
      records.append(dict(
          row=row.name, baseline=base.name, heads=row.heads, seed=seed,
          final_step=final, ln_ppl=a, baseline_ln_ppl=b,
          delta_equal_steps=a - b, equal_time_sec=budget,
          delta_equal_time=delta_time, step_time_sec=mine.step_time,
          baseline_step_time_sec=theirs.step_time, steps_multiplier=mult,
          time_multiplier=(None if mult is None or not math.isfinite(ratio)
                           else mult * ratio),
          baseline_final_step=theirs.final_step,
          multiplier_at_step=common, steps_multiplier_common=common_mult,
          step_time_source="side by side" if times else "own run"))
  return records


_TEXT_COLUMNS = ("row", "baseline", "step_time_source")


def read_records(path):
  """compare()'s records back from a comparison.csv."""
  with open(path) as f:
    rows = [{k: (None if v in ("", None) else v if k in _TEXT_COLUMNS
                 else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)]
  return [dict({c: None for c in COLUMNS}, **r) for r in rows]


def summarize(records, labels):
  """Per pair: means, standard errors and counts over seeds.

  Args:
    records: compare() output.
    labels: {row name: label for tables}.
  Returns:
    [dict(row, baseline, label, heads, seeds, final_step, baseline_final_step,
          delta_steps, delta_time, steps_mult, time_mult, common_mult:
          each (mean, se, n) over the seeds that have it,
          common_step, step_time_ratio=(mean, se, n), wins=int)]
  """
  by_pair = collections.OrderedDict()
  for r in records:
    by_pair.setdefault((r["row"], r["baseline"]), []).append(r)
  out = []
  for (row, base), recs in by_pair.items():

    def stat(key, recs=recs):
      return mean_se([r[key] for r in recs])

    ratio = mean_se([r["step_time_sec"] / r["baseline_step_time_sec"]
                     for r in recs])
    out.append(dict(
        row=row, baseline=base, label=labels.get(row, row),
        heads=int(recs[0]["heads"]), seeds=len(recs),
        final_step=int(recs[0]["final_step"]),
        baseline_final_step=int(recs[0]["baseline_final_step"] or
                                recs[0]["final_step"]),
        delta_steps=stat("delta_equal_steps"),
        delta_time=stat("delta_equal_time"),
        steps_mult=stat("steps_multiplier"), time_mult=stat("time_multiplier"),
        common_mult=stat("steps_multiplier_common"),
        common_step=recs[0]["multiplier_at_step"],
        step_time_ratio=ratio,
        wins=sum(1 for r in recs if r["delta_equal_steps"] < 0)))
  return out


def format_mean_se(value, fmt="%+.3f", seeds=None, se_fmt="%.3f"):
  """(mean, se[, n]) as "-0.054 ± 0.002"; "(n=1)" when fewer values than
  `seeds` went into it; "n/a" without a mean."""
  mean, se = value[:2]
  n = value[2] if len(value) > 2 else None
  if mean is None:
    return "n/a"
  text = (fmt % mean) + ("" if se is None else " ± " + se_fmt % se)
  if seeds is not None and n is not None and n < seeds:
    text += " (n=%d)" % n
  return text


def multiplier_cells(s):
  """The two multiplier cells of a summary: at the final step, and at the
  latest step every seed's multi-head reaches."""
  seeds = s["seeds"]
  n = s["steps_mult"][2]
  if n == seeds:
    final = "%s / %s" % (format_mean_se(s["steps_mult"], "%.2f×"),
                         format_mean_se(s["time_mult"], "%.2f×", seeds))
  elif n == 0:
    final = "> %.2f× (not reached in %d steps)" % (
        s["baseline_final_step"] / float(s["final_step"]),
        s["baseline_final_step"])
  else:
    final = "%s; %d of %d seeds not reached" % (
        format_mean_se(s["steps_mult"], "%.2f×"), seeds - n, seeds)
  if s["common_step"] is None:
    common = "n/a"
  else:
    common = "%s at step %d" % (format_mean_se(s["common_mult"], "%.2f×",
                                               seeds), s["common_step"])
  return final, common


def markdown(summaries):
  """The comparison table (one line per pair)."""
  lines = [
      "| variant | heads | vs | seeds | Δ ln(PPL) equal steps | "
      "Δ ln(PPL) equal time | step time ratio | multi-head steps / time to "
      "reach the variant's final loss | multi-head steps to reach the "
      "variant's loss at an earlier step | better (seeds) |",
      "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
  for s in summaries:
    final, common = multiplier_cells(s)
    seeds = s["seeds"]
    lines.append("| %s | %d | %s | %d | %s | %s | %s | %s | %s | %d/%d |" % (
        s["label"], s["heads"], s["baseline"], seeds,
        format_mean_se(s["delta_steps"], seeds=seeds),
        format_mean_se(s["delta_time"], seeds=seeds),
        format_mean_se(s["step_time_ratio"], "%.2f", seeds),
        final, common, s["wins"], seeds))
  return "\n".join(lines) + "\n"


NOTE = (
    "Δ = variant − multi-head held-out ln(PPL) (negative: the variant is "
    "better), mean ± standard error over seeds, paired by seed; (n=k) marks "
    "a figure that fewer seeds give.  Equal steps: at the last evaluated "
    "step.  Equal time: at the shorter run's training time (median s/step × "
    "steps; graph building and evaluation excluded), the other curve read "
    "at the step it had reached by then, linear between evaluated steps.  "
    "Step time ratio: variant ÷ multi-head.  Multipliers: multi-head's steps "
    "(and training time) to reach the variant's held-out loss ÷ the "
    "variant's, read off multi-head's curve (linear between evaluated "
    "steps): at the variant's final step, or a lower bound when multi-head "
    "never gets there; and at the latest earlier step that every seed's "
    "multi-head reaches.  Rows without a multi-head row of the same head "
    "count are not compared.\n")


def gap_by_step(rows, seeds, model_dir_fn, finished=None):
  """Equal-steps Δ at every step that both runs of a pair evaluated.

  Args:
    rows, seeds, model_dir_fn, finished: as compare().
  Returns:
    [dict] with the keys of GAP_COLUMNS, one per pair and step: Δ's mean
    and standard error over the seeds whose two runs evaluated that step.

  Example (seed 1: Δ -0.1 at steps 500 and 1000; seed 2: -0.2 at 1000):
    [dict(step=500, delta=-0.1, se=None, seeds=1, ...),
     dict(step=1000, delta=-0.15, se=0.05, seeds=2, ...)]
  """
  out = []
  for row, base in pairs(rows):
    deltas = collections.defaultdict(list)
    for _, mine, theirs in paired_curves(row, base, seeds, model_dir_fn,
                                         finished=finished):
      for step in set(mine.steps) & set(theirs.steps):
        deltas[step].append(mine.points[step] - theirs.points[step])
    for step in sorted(deltas):
      mean, se, n = mean_se(deltas[step])
      out.append(dict(row=row.name, baseline=base.name, heads=row.heads,
                      step=step, delta=mean, se=se, seeds=n))
  return out


def gap_markdown(gaps, labels):
  """gap_by_step()'s records as a table: a line per pair, a column per step.

  Args:
    gaps: gap_by_step() output.
    labels: {row name: label for tables}.
  Returns:
    The markdown table; a cell is "(n=k)"-marked when fewer seeds went into
    it than into the pair's best-covered step; "" without gaps.

  Example: | talking-heads | 8 | 02_multi_head_8_16 | -0.100 (n=1) |
    -0.150 ± 0.050 |
  """
  steps = sorted({g["step"] for g in gaps})
  by_pair = collections.OrderedDict()
  for g in gaps:
    by_pair.setdefault((g["row"], g["baseline"], g["heads"]), {})[
        g["step"]] = g
  lines = ["| variant | heads | vs | %s |" % " | ".join(
      "Δ step %d" % s for s in steps),
           "|---|---:|---|%s" % ("---:|" * len(steps))]
  for (row, base, heads), cells in by_pair.items():
    seeds = max(c["seeds"] for c in cells.values())
    lines.append("| %s | %d | %s | %s |" % (
        labels.get(row, row), heads, base, " | ".join(
            format_mean_se((cells[s]["delta"], cells[s]["se"],
                            cells[s]["seeds"]), seeds=seeds)
            if s in cells else "" for s in steps)))
  return "\n".join(lines) + "\n" if gaps else ""


def write(output_dir, rows, seeds, model_dir_fn, labels, finished=None):
  """Writes comparison.csv, comparison.md and comparison_steps.csv (GAP_CSV,
  a header only when no pair has runs); returns the summaries."""
  step_times = read_step_times(output_dir)
  records = compare(rows, seeds, model_dir_fn, step_times, finished)
  gaps = gap_by_step(rows, seeds, model_dir_fn, finished)
  with open(os.path.join(output_dir, COMPARISON_CSV), "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
  summaries = summarize(records, labels)
  with open(os.path.join(output_dir, COMPARISON_MD), "w") as f:
    f.write("# Each variant vs multi-head attention\n\n")
    f.write(markdown(summaries) + "\n" + NOTE)
    f.write("\nStep times: %s.\n" % (
        "measured side by side, from %s (benchmarks/small_regime.py: one "
        "SGD step of the same model in the test harness, no input pipeline "
        "and no Adafactor; rows interleaved)" % STEP_TIMES if step_times
        else "each run's own median (runs that did not run side by side: on "
        "a shared machine they measure the load as much as the model)"))
    if gaps:
      f.write("\n## Δ ln(PPL) at each evaluated step\n\nEqual steps, "
              "paired by seed, mean ± standard error (does the gap grow or "
              "close with training?); every pair and step in `%s`.\n\n"
              % GAP_CSV + gap_markdown(gaps, labels))
  with open(os.path.join(output_dir, GAP_CSV), "w", newline="") as f:
    writer = csv.DictWriter(f, GAP_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(gaps)
  return summaries


def plot_curves(rows, seeds, model_dir_fn, path, title="", caption="",
                step_times=None):
  """Held-out ln(PPL) against steps and against training seconds (mean
  over seeds at each evaluated step), one line per row; `caption` (the
  command that made it) under the plots; step_times as in compare()."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 5.2),
                                         sharey=True)
  for row in rows:
    curves = [c for c in (_curve(row, s, model_dir_fn, step_times or {})
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
  if caption:
    fig.text(0.01, 0.01, caption, fontsize=7, family="monospace")
  fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
