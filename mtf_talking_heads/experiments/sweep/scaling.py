"""A scaling curve: held-out loss against training FLOPs, over model sizes.

Reads two or more recorded sweeps (the --output_dir of `mtf_th sweep`), one
per model size, each pairing multi-head attention with other variants at one
head count (gin/experiments/scaling_d128, scaling_d192, scaling_d256), and
reports, per variant:

  points       every evaluated step of every size: the training FLOPs to
               that step (training_flops) and the held-out ln(PPL), mean and
               standard error over the seeds recorded in results.csv;
  fit          L = a * C^-b, least squares on (ln C, ln L) through the final
               point of each size;
  multiplier   at each size, how much more compute multi-head needs for the
               variant's final loss: C_MH(L_variant) / C_variant, read off
               multi-head's fit ("extrapolated" when C_MH lies outside the
               FLOPs of the sizes it was fitted on) and, as a check, off
               multi-head's measured curves (the cheapest size whose mean
               curve gets to that loss, linear between evaluated steps;
               "not reached" when none does);
  equal steps  comparison.py's Δ and steps multiplier within each size.

Writes scaling.png (plots.plot_scaling), scaling.md, scaling.csv (one line
per size and variant), scaling_points.csv (every point of the figure) and
scaling_fit.csv (a, b per variant).  Pure Python; only the figure imports
matplotlib, and no TensorFlow.

Example:
  result = analyse(["sweeps/scaling_d128", "sweeps/scaling_d192",
                    "sweeps/scaling_d256"])
  result.fits["multi_head"]       # (a, b)
  write(result, "sweeps/scaling", caption="mtf_th sweep --scaling ...")
"""
import collections
import csv
import json
import math
import os

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments.sweep import plan as plan_lib
from mtf_talking_heads.experiments.sweep import plots
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.experiments.sweep import rows as rows_lib
from mtf_talking_heads.runtime import run_files

BASELINE = spec_lib.MULTI_HEAD
# seqio.ByteVocabulary (the *_bytes tasks): pad, eos, unk and the 256 bytes
BYTE_VOCAB = 259
SCALING_PNG = "scaling.png"
SCALING_MD = "scaling.md"
SCALING_CSV = "scaling.csv"
POINTS_CSV = "scaling_points.csv"
FIT_CSV = "scaling_fit.csv"
COLUMNS = ("table", "d_model", "num_layers", "variant", "final_step",
           "baseline_params", "params", "baseline_flops", "flops",
           "baseline_ln_ppl", "baseline_se", "baseline_seeds", "ln_ppl", "se",
           "seeds", "delta_equal_steps", "delta_se", "delta_seeds",
           "steps_multiplier", "steps_multiplier_se",
           "compute_multiplier_fit", "fit_status",
           "compute_multiplier_measured", "measured_status")
POINT_COLUMNS = ("table", "d_model", "num_layers", "variant", "step", "flops",
                 "ln_ppl", "se", "seeds", "final")
FIT_COLUMNS = ("variant", "sizes", "a", "b")


# ---------------------------------------------------------------------------
# Training FLOPs from the gin files and results.csv.

def model_facts(config, where):
  """What the FLOPs of a decoder-only LM depend on, from its gin macros.

  Args:
    config: a gin_text.GinConfig of the run's files and bindings.
    where: names the configuration in errors.
  Returns:
    dict(batch, layers, length, d_model, d_ff, vocab): batch_size,
    num_layers, targets_length, d_model and d_ff; vocab is the byte
    vocabulary padded as mtf pads it (the task is named by MIXTURE_NAME; only
    byte-level tasks tell their vocabulary without TensorFlow).
  Raises:
    ValueError: not a decoder-only LM, a macro missing, a task whose
      vocabulary is not bytes.
  """
  model_type = config.binding("utils.run.model_type")
  if model_type != "lm":
    raise ValueError("%s: utils.run.model_type is %r; the FLOPs count covers "
                     "decoder-only LMs (models/lm_small.gin), not %r"
                     % (where, model_type, model_type))
  task = config.get("MIXTURE_NAME")
  if not (isinstance(task, str) and task.endswith("_bytes")):
    raise ValueError("%s: task %r: the FLOPs need the vocabulary size, which "
                     "only byte-level tasks (*_bytes, %d ids) give without "
                     "TensorFlow" % (where, task, BYTE_VOCAB))
  facts = {}
  for key, macro in (("batch", "batch_size"), ("layers", "num_layers"),
                     ("length", "targets_length"), ("d_model", "d_model"),
                     ("d_ff", "d_ff")):
    facts[key] = rows_lib.positive_int(config.require(macro, where), macro,
                                       where)
  facts["vocab"] = model_lib.padded_vocab(BYTE_VOCAB)
  return facts


def flops_per_step(config, multiplies, where="the gin files"):
  """Training FLOPs of one step of a decoder-only LM.

  2 (a multiply-add) x 3 (the forward pass, and the backward pass's two
  products per weight) x batch x [layers x (attention multiplies per
  sequence + length x 2 x d_model x d_ff) + length x d_model x vocab]: the
  attention layer's multiplies as results.csv records them (costs.py, one
  sequence of the model's length), the feed-forward layer's two matrices,
  and the embedding shared with the softmax (its product with the output).

  Example: the d128 multi-head row (batch 16, 2 layers, length 128, d_model
  128, d_ff 512, the 259 byte ids padded to 384; results.csv: 12,582,912
  attention multiplies per layer per sequence of 128):

  >>> from mtf_talking_heads.core import gin_text
  >>> config = gin_text.GinConfig(
  ...     ["experiments/scaling_d128/01_multi_head_8_16.gin"])
  >>> flops_per_step(config, 12582912)  # 6 x 16 x (2 x 29360128 + 6291456)
  6241124352
  >>> training_flops(config, 12582912, steps=750)
  4680843264000

  Args:
    config: a gin_text.GinConfig of the run (model_facts reads it).
    multiplies: attention multiplies per layer per sequence.
    where: names the configuration in errors.
  Returns:
    an int.
  """
  f = model_facts(config, where)
  per_sequence = (f["layers"] * (multiplies + f["length"] * 2 * f["d_model"]
                                 * f["d_ff"])
                  + f["length"] * f["d_model"] * f["vocab"])
  return 2 * 3 * f["batch"] * per_sequence


def training_flops(config, multiplies, steps, where="the gin files"):
  """flops_per_step x steps (see its example)."""
  return flops_per_step(config, multiplies, where) * steps


def nonembedding_params(config, attention_params, where="the gin files"):
  """Weights outside the embedding: layers x (attention + 2 d_model d_ff).

  attention_params: one attention layer's (results.csv's params, costs.py).
  """
  f = model_facts(config, where)
  return f["layers"] * (attention_params + 2 * f["d_model"] * f["d_ff"])


# ---------------------------------------------------------------------------
# One recorded sweep = one size.

class Size(object):
  """One recorded sweep: one model size, one row per variant.

  Attributes:
    path: the sweep's output directory.
    table: its table (sweep.json).
    plan: a sweep.Plan of its rows (gin, run directories).
    rows: {variant: Row}, multi-head first.
    finished: {variant: [seeds recorded in results.csv]}.
    flops_per_step, params: {variant: int}.
    d_model, num_layers: ints.
  """

  def __init__(self, path, plan, rows, finished, flops, params, facts):
    self.path = path
    self.table = plan.table
    self.plan = plan
    self.rows = rows
    self.finished = finished
    self.flops_per_step = flops
    self.params = params
    self.d_model = facts["d_model"]
    self.num_layers = facts["layers"]

  @property
  def label(self):
    return "d_model %d, %d layers" % (self.d_model, self.num_layers)

  def curves(self, variant):
    """[comparison.Curve] of the variant's recorded runs (with evaluations)."""
    row = self.rows[variant]
    curves = [comparison.read_curve(self.plan.model_dir(row, seed))
              for seed in self.finished[variant]]
    return [c for c in curves if c is not None]

  def mean_curve(self, variant):
    """[(step, mean, se, n)] at the steps every recorded seed evaluated."""
    curves = self.curves(variant)
    if not curves:
      raise ValueError("%s: row %s has results.csv lines but no evaluations "
                       "(runs/%s/seed_<n>/%s)" % (
                           self.path, self.rows[variant].name,
                           self.rows[variant].name, run_files.EVAL_RESULTS))
    steps = sorted(set.intersection(*[set(c.steps) for c in curves]))
    return [(step,) + comparison.mean_se([c.points[step] for c in curves])
            for step in steps]


def _read_manifest(path):
  if not os.path.isdir(path):
    raise ValueError("--scaling %s is not a directory: give the --output_dir "
                     "of a recorded `mtf_th sweep`" % path)
  for name in (plan_lib.MANIFEST, results.RESULTS_CSV):
    if not os.path.exists(os.path.join(path, name)):
      raise ValueError("--scaling %s has no %s: give the --output_dir of a "
                       "recorded `mtf_th sweep`" % (path, name))
  with open(os.path.join(path, plan_lib.MANIFEST)) as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError("--scaling %s: %s is not JSON (%s)"
                       % (path, plan_lib.MANIFEST, e)) from None


def _scaling_rows(path, rows, heads):
  """{variant: row} of a scaling table (one row per variant, one head
  count, multi-head among them), or ValueError saying why not."""
  if heads is not None:
    chosen = [r for r in rows if r.heads == heads]
    if not chosen:
      raise ValueError("--scaling %s has no row of %d heads (its rows have "
                       "%s)" % (path, heads, ", ".join(
                           str(h) for h in sorted({r.heads for r in rows}))))
    rows = chosen
  counts = sorted({r.heads for r in rows})
  if len(counts) > 1:
    raise ValueError("--scaling %s is not a scaling table: its rows have %s "
                     "heads (a scaling table has one head count); give "
                     "--scaling_heads H to take the rows of H heads"
                     % (path, ", ".join(map(str, counts))))
  by_variant = collections.OrderedDict()
  for row in rows:
    if row.variant in by_variant:
      raise ValueError("--scaling %s is not a scaling table: rows %s and %s "
                       "are both %s (a scaling table has one row per "
                       "variant)" % (path, by_variant[row.variant].name,
                                     row.name, row.variant))
    if row.placement != "all":
      raise ValueError("--scaling %s: row %s has its variant in one "
                       "placement only (%s); its multiplies are not one "
                       "figure" % (path, row.name, row.placement))
    by_variant[row.variant] = row
  if BASELINE not in by_variant or len(by_variant) < 2:
    raise ValueError("--scaling %s is not a scaling table: it needs a %s row "
                     "and another variant's (it has %s)"
                     % (path, BASELINE, ", ".join(by_variant)))
  by_variant.move_to_end(BASELINE, last=False)
  return by_variant


def load_size(path, heads=None):
  """The Size of a recorded sweep; ValueError (one line) if it is not one.

  Args:
    path: the sweep's output directory (sweep.json, results.csv, runs/).
    heads: take the rows of this head count (None: the sweep must have one).
  """
  manifest = _read_manifest(path)
  try:
    plan = plan_lib.Plan.from_manifest(manifest, path)
  except (KeyError, TypeError) as e:
    raise ValueError("--scaling %s: %s is not a sweep manifest (%s)"
                     % (path, plan_lib.MANIFEST, e)) from None
  except ValueError as e:
    raise ValueError("--scaling %s: %s" % (path, e)) from None
  rows = _scaling_rows(path, plan.rows, heads)
  recorded = results.read_results(path)
  finished, flops, params, facts = {}, {}, {}, None
  for variant, row in rows.items():
    seeds = sorted(s for (name, s) in recorded if name == row.name)
    if not seeds:
      raise ValueError("--scaling %s: row %s has no finished run in %s yet"
                       % (path, row.name, results.RESULTS_CSV))
    record = recorded[(row.name, seeds[0])]
    where = "--scaling %s: row %s" % (path, row.name)
    facts = model_facts(plan.config(row), where)
    try:
      # executed, not the paper's folded count (they differ for dynamic
      # projections); older records have only `multiplies`
      executed = record.get("multiplies_executed") or record["multiplies"]
      multiplies, cost_length = (int(float(executed)),
                                 int(record["cost_length"]))
      attention_params = int(float(record["params"]))
    except (KeyError, TypeError, ValueError):
      raise ValueError("%s: results.csv has no multiplies, params or "
                       "cost_length for it" % where) from None
    if cost_length != facts["length"]:
      raise ValueError("%s: results.csv counts the attention multiplies at "
                       "length %d, the model trains at %d" % (
                           where, cost_length, facts["length"]))
    finished[variant] = seeds
    flops[variant] = flops_per_step(plan.config(row), multiplies, where)
    params[variant] = nonembedding_params(plan.config(row), attention_params,
                                          where)
  return Size(path, plan, rows, finished, flops, params, facts)


# ---------------------------------------------------------------------------
# Fits and multipliers.

def fit_power_law(points):
  """(a, b) of L = a * C^-b: least squares on (ln C, ln L).

  >>> a, b = fit_power_law([(1e12, 10 * 1e12 ** -0.05),
  ...                       (1e14, 10 * 1e14 ** -0.05)])
  >>> round(a, 6), round(b, 6)
  (10.0, 0.05)

  Args:
    points: [(C, L)] with at least two distinct C, all positive.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  xs = [math.log(c) for c, _ in points]
  if len(set(xs)) < 2:
    raise ValueError("a power-law fit needs points at two compute budgets "
                     "at least, got %d" % len(set(xs)))
  slope, intercept = np.polyfit(xs, [math.log(l) for _, l in points], 1)
  return math.exp(intercept), -float(slope)


def flops_for_loss(fit, loss):
  """The C at which a * C^-b = loss; None if the fit does not fall (b <= 0).

  >>> round(flops_for_loss((10.0, 0.05), 10 * 1e13 ** -0.05) / 1e13, 6)
  1.0
  """
  a, b = fit
  if b <= 0:
    return None
  return (a / loss) ** (1.0 / b)


def fit_multiplier(fit, loss, flops, fitted_flops):
  """(C_fit(loss) / flops, status) read off a fit.

  status: "" inside the FLOPs the fit was made on, "extrapolated" outside
  them, "n/a: ..." (multiplier None) when the fit does not fall with compute.
  """
  needed = flops_for_loss(fit, loss)
  if needed is None:
    return None, "n/a: multi-head's fit does not fall with compute"
  inside = min(fitted_flops) <= needed <= max(fitted_flops)
  return needed / flops, "" if inside else "extrapolated"


def measured_multiplier(baseline_curves, loss, flops):
  """(C / flops, status): C the fewest FLOPs at which a measured curve of
  the baseline gets to `loss`.

  Args:
    baseline_curves: [(label, comparison.Curve keyed by FLOPs)], one per size.
    loss: the variant's held-out ln(PPL).
    flops: the variant's FLOPs at that loss.
  Returns:
    (multiplier, status): "label, <C> FLOPs" read between evaluated points;
    "upper bound: label's first point" when a curve's first evaluated point
    is already at or below `loss`; (None, "not reached") when no curve
    gets there.
  """
  best = None
  for label, curve in baseline_curves:
    reached = curve.step_reaching(loss)
    if reached is not None and (best is None or reached < best[0]):
      first = curve.steps[0]
      bound = reached == first and curve.points[first] <= loss
      best = (reached, label, bound)
  if best is None:
    return None, "not reached"
  reached, label, bound = best
  if bound:
    return reached / flops, "upper bound: %s's first point" % label
  return reached / flops, "%s, %.3e FLOPs" % (label, reached)


# ---------------------------------------------------------------------------
# The analysis.

Scaling = collections.namedtuple(
    "Scaling", ["sizes", "variants", "labels", "points", "fits", "lines"])
Scaling.__doc__ = """analyse()'s result.

Attributes:
  sizes: [Size], smallest first.
  variants: [variant], multi-head first.
  labels: {variant: row label}.
  points: {variant: [dict(size, step, flops, mean, se, n, final)]}.
  fits: {variant: (a, b)} through each size's final point.
  lines: [dict] one per size and non-multi-head variant (COLUMNS' values,
    plus size, summary: comparison.summarize()'s, or None).
"""


def _sizes(dirs, heads):
  if len(dirs) < 2:
    raise ValueError("--scaling needs the sweeps of at least two model "
                     "sizes, got %d directory" % len(dirs))
  sizes = [load_size(d, heads) for d in dirs]
  first = sizes[0]
  for size in sizes[1:]:
    if set(size.rows) != set(first.rows):
      raise ValueError("--scaling: the sweeps' variants differ: %s has %s, "
                       "%s has %s; give sweeps of the same variants"
                       % (first.path, ", ".join(first.rows), size.path,
                          ", ".join(size.rows)))
  heads_of = {size.path: sorted({r.heads for r in size.rows.values()})
              for size in sizes}
  if len({tuple(h) for h in heads_of.values()}) > 1:
    raise ValueError("--scaling: the sweeps' head counts differ (%s); one "
                     "curve compares one head count (--scaling_heads H)"
                     % "; ".join("%s: %s" % (p, ",".join(map(str, h)))
                                 for p, h in heads_of.items()))
  seen = {}
  for size in sizes:
    key = (size.d_model, size.num_layers)
    if key in seen:
      raise ValueError("--scaling: %s and %s are the same size (%s); give "
                       "one sweep per size" % (seen[key], size.path,
                                               size.label))
    seen[key] = size.path
  return sorted(sizes, key=lambda s: s.params[BASELINE])


def _points(size, variant):
  curve = size.mean_curve(variant)
  return [dict(size=size, step=step, flops=step * size.flops_per_step[variant],
               mean=mean, se=se, n=n, final=i == len(curve) - 1)
          for i, (step, mean, se, n) in enumerate(curve)]


def _within_size(size, variant):
  """comparison.summarize()'s summary of the variant vs multi-head, or None."""
  rows = [size.rows[BASELINE], size.rows[variant]]
  seeds = max(max(size.finished[v]) for v in (BASELINE, variant))
  finished = {(size.rows[v].name, s) for v in (BASELINE, variant)
              for s in size.finished[v]}
  records = comparison.compare(rows, seeds, size.plan.model_dir,
                               comparison.read_step_times(size.path),
                               finished)
  summaries = comparison.summarize(records, {r.name: r.label for r in rows})
  return summaries[0] if summaries else None


def analyse(dirs, heads=None):
  """The scaling curve of recorded sweeps, one per size.

  Args:
    dirs: the sweeps' output directories (at least two sizes).
    heads: take each sweep's rows of this head count (None: each sweep must
      have one).
  Returns:
    a Scaling.
  Raises:
    ValueError: one line, naming the directory and the fix.
  """
  sizes = _sizes(dirs, heads)
  variants = list(sizes[0].rows)
  labels = {v: sizes[0].rows[v].label for v in variants}
  points = {v: [p for size in sizes for p in _points(size, v)]
            for v in variants}
  fits = {v: fit_power_law([(p["flops"], p["mean"]) for p in points[v]
                            if p["final"]]) for v in variants}
  base_finals = {p["size"].path: p for p in points[BASELINE] if p["final"]}
  fitted_flops = [p["flops"] for p in base_finals.values()]
  curves = [(size.label, comparison.Curve(
      {p["flops"]: p["mean"] for p in points[BASELINE] if p["size"] is size},
      float("nan"))) for size in sizes]
  lines = []
  for variant in variants[1:]:
    for p in points[variant]:
      if not p["final"]:
        continue
      size, base = p["size"], base_finals[p["size"].path]
      fit_mult, fit_status = fit_multiplier(fits[BASELINE], p["mean"],
                                            p["flops"], fitted_flops)
      measured, measured_status = measured_multiplier(curves, p["mean"],
                                                      p["flops"])
      summary = _within_size(size, variant)
      delta = summary["delta_steps"] if summary else (None, None, 0)
      steps_mult = summary["steps_mult"] if summary else (None, None, 0)
      lines.append(dict(
          size=size, summary=summary, table=size.table, d_model=size.d_model,
          num_layers=size.num_layers, variant=variant, final_step=p["step"],
          baseline_params=size.params[BASELINE], params=size.params[variant],
          baseline_flops=base["flops"], flops=p["flops"],
          baseline_ln_ppl=base["mean"], baseline_se=base["se"],
          baseline_seeds=base["n"], ln_ppl=p["mean"], se=p["se"],
          seeds=p["n"], delta_equal_steps=delta[0], delta_se=delta[1],
          delta_seeds=delta[2], steps_multiplier=steps_mult[0],
          steps_multiplier_se=steps_mult[1],
          compute_multiplier_fit=fit_mult, fit_status=fit_status,
          compute_multiplier_measured=measured,
          measured_status=measured_status))
  return Scaling(sizes, variants, labels, points, fits, lines)


# ---------------------------------------------------------------------------
# Tables and the figure.

def _loss_cell(mean, se, n):
  return comparison.format_mean_se((mean, se), "%.3f") + (
      "" if n > 1 else " (1 seed)")


def _multiplier_cell(value, status):
  if value is None:
    return status
  return "%.2f×%s" % (value, " (%s)" % status if status else "")


def markdown(result):
  """The table (one line per size and variant), the fits and a note."""
  lines = [
      "| size | params | steps | variant | training FLOPs multi-head / "
      "variant | multi-head ln(PPL) | variant ln(PPL) | Δ ln(PPL) equal "
      "steps | multi-head steps / time to the variant's final loss (same "
      "size) | compute multiplier (fit) | compute multiplier (measured) |",
      "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
  for line in result.lines:
    summary = line["summary"]
    lines.append("| %s | %s | %d | %s | %.3e / %.3e | %s | %s | %s | %s | "
                 "%s | %s |" % (
                     line["size"].label, "{:,}".format(line["baseline_params"]),
                     line["final_step"], result.labels[line["variant"]],
                     line["baseline_flops"], line["flops"],
                     _loss_cell(line["baseline_ln_ppl"], line["baseline_se"],
                                line["baseline_seeds"]),
                     _loss_cell(line["ln_ppl"], line["se"], line["seeds"]),
                     comparison.format_mean_se(
                         (line["delta_equal_steps"], line["delta_se"],
                          line["delta_seeds"]), seeds=line["seeds"]),
                     comparison.multiplier_cells(summary)[0] if summary
                     else "n/a",
                     _multiplier_cell(line["compute_multiplier_fit"],
                                      line["fit_status"]),
                     _multiplier_cell(line["compute_multiplier_measured"],
                                      line["measured_status"])))
  lines += ["", "| variant | sizes | a | b | fit |", "|---|---:|---:|---:|---|"]
  for variant in result.variants:
    a, b = result.fits[variant]
    lines.append("| %s | %d | %.4g | %.4f | L = %.4g · C^−%.4f |" % (
        result.labels[variant], len(result.sizes), a, b, a, b))
  return "\n".join(lines) + "\n"


NOTE = (
    "Training FLOPs = 2 (multiply-add) × 3 (forward and backward) × batch × "
    "[layers × (attention multiplies per sequence as executed, results.csv's "
    "`multiplies_executed`, + length × 2 × d_model × d_ff) + length × d_model × "
    "vocabulary (the embedding shared with the softmax, the 259 byte ids "
    "padded to 384)] per step, × steps; batch, layers, length, d_model and "
    "d_ff are each row's gin macros.  Params: weights outside the embedding "
    "(attention and feed-forward), of the multi-head row.  ln(PPL): held-out "
    "nats per byte at the last evaluated step, mean ± standard error over "
    "the seeds recorded.  Δ and the steps / time multiplier: "
    "comparison.md's, within one size (paired by seed).  Fit: L = a · C^−b, "
    "least squares on (ln C, ln L) through each size's final point.  "
    "Compute multiplier: the FLOPs multi-head needs for the variant's final "
    "loss ÷ the variant's FLOPs, read off multi-head's fit "
    "(\"extrapolated\": outside the FLOPs of the sizes it was fitted on) "
    "and off multi-head's measured curves (the cheapest size whose mean "
    "curve reaches that loss, linear between evaluated steps; \"not "
    "reached\" when none does; \"upper bound\" when a curve's first point "
    "is already below it).\n")


def _number(value, fmt="%.6g"):
  return "" if value is None else fmt % value


def _write_csv(path, columns, rows):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def write(result, output_dir, caption=""):
  """Writes the figure, scaling.md and the CSVs; returns their paths.

  Args:
    result: analyse()'s Scaling.
    output_dir: created if missing.
    caption: the command that made them (under the figure, atop the md).
  """
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, name) for name in (
      SCALING_PNG, SCALING_MD, SCALING_CSV, POINTS_CSV, FIT_CSV)]
  _write_csv(paths[2], COLUMNS, [
      {k: (_number(v) if isinstance(v, float) else v)
       for k, v in line.items()} for line in result.lines])
  _write_csv(paths[3], POINT_COLUMNS, [
      dict(table=p["size"].table, d_model=p["size"].d_model,
           num_layers=p["size"].num_layers, variant=v, step=p["step"],
           flops=p["flops"], ln_ppl=_number(p["mean"]), se=_number(p["se"]),
           seeds=p["n"], final=int(p["final"]))
      for v in result.variants for p in result.points[v]])
  _write_csv(paths[4], FIT_COLUMNS, [
      dict(variant=v, sizes=len(result.sizes), a=_number(a), b=_number(b))
      for v, (a, b) in result.fits.items()])
  with open(paths[1], "w") as f:
    f.write("# Scaling: held-out loss against training FLOPs\n\n")
    f.write("Sweeps: %s.%s\n\n" % (", ".join(
        "`%s` (%s)" % (s.path, s.label) for s in result.sizes),
        "  Made by: `%s`." % caption if caption else ""))
    f.write(markdown(result) + "\n" + NOTE)
  series = [dict(label="%s, %s (%d seed%s)" % (
      result.labels[v], size.label, len(size.finished[v]),
      "" if len(size.finished[v]) == 1 else "s"), group=v,
                 baseline=v == BASELINE,
                 flops=[p["flops"] for p in result.points[v]
                        if p["size"] is size],
                 means=[p["mean"] for p in result.points[v]
                        if p["size"] is size],
                 ses=[p["se"] or 0.0 for p in result.points[v]
                      if p["size"] is size])
            for v in result.variants for size in result.sizes]
  fits = [dict(label="%s fit: L = %.3g·C^-%.4f" % (result.labels[v], a, b),
               group=v, a=a, b=b) for v, (a, b) in result.fits.items()]
  plots.plot_scaling(series, fits, paths[0], caption=caption)
  return paths
