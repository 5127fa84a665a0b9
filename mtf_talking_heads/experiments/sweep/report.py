"""Reporting on a sweep: summaries, the paper-layout table, the figures.

Owns summarize (means and sample stds over seeds per row), markdown_table
(the paper's layout), and Reporter, which rewrites results.md,
comparison.md and the plots of an output_dir from its results.csv (the
drawing itself is plots.py's).
"""
import collections
import math
import os

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments.sweep import finetune
from mtf_talking_heads.experiments.sweep import plots
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.experiments.sweep import rows as rows_lib
from mtf_talking_heads.runtime import progress

RESULTS_MD = "results.md"
PLOTS = ("plot_heads.png", "plot_loss.png", "plot_step_time.png")
CURVES_PLOT = "plot_curves.png"  # held-out ln(PPL) vs steps and vs seconds


class Reporter(object):
  """The tables and plots of a Plan's output_dir, from its results.csv.

  Example:
    reporter = Reporter(plan)
    reporter.summary()[0]["final"]  # (mean, std) ln(PPL) of row 1
    reporter.write_table()          # results.md, comparison.md

  Args:
    plan: the Plan (rows, seeds, eval steps, costs, output_dir).
  """

  def __init__(self, plan):
    self.plan = plan

  def summary(self):
    """One dict per row (sweep order): means and stds over recorded seeds."""
    plan = self.plan
    recorded = results.read_results(plan.output_dir)
    return summarize(plan.rows, [recorded.get((r.name, s))
                                 for r in plan.rows
                                 for s in range(1, plan.seeds + 1)],
                     {r.name: plan.cost_record(r) for r in plan.rows})

  def markdown(self, summary=None):
    """The paper-layout markdown table (empty quality cells when not run)."""
    return plan_markdown(self.plan, summary or self.summary())

  def write_table(self):
    """results.md (a header, then markdown()) and comparison.md."""
    plan = self.plan
    path = os.path.join(plan.output_dir, RESULTS_MD)
    summary = self.summary()
    runs = sum(s["seeds"] for s in summary)
    wall = sum(s["wall"] or 0.0 for s in summary)
    cpu = sum(s["cpu"] or 0.0 for s in summary)
    title = (rows_lib.table_caption(plan.table, plan.gin_dir)
             if plan.table in rows_lib.paper_table_names(plan.gin_dir)
             else plan.table)
    header = ("# Sweep `%s`: %s, %s scale\n\n%d seed%s per row, %d training "
              "steps; %d of %d runs recorded (wall %s, CPU %s); every run in "
              "`results.csv`, run directories in `runs/`.\n\n"
              % (plan.table, title, plan.scale, plan.seeds,
                 "" if plan.seeds == 1 else "s", plan.train_steps,
                 runs, len(plan.rows) * plan.seeds,
                 progress.format_seconds(wall),
                 progress.format_seconds(cpu)))
    with open(path, "w") as f:
      f.write(header + self.markdown(summary))
    if plan.finetune:
      with open(os.path.join(plan.output_dir, finetune.DOWNSTREAM_MD),
                "w") as f:
        f.write(finetune.downstream_markdown(plan))
    comparison.write(plan.output_dir, plan.rows, plan.seeds, plan.model_dir,
                     {r.name: r.label for r in plan.rows},
                     finished=set(results.read_results(plan.output_dir)))

  def write_plots(self):
    """PLOTS and CURVES_PLOT in output_dir; returns their paths."""
    plan = self.plan
    summary = self.summary()
    paths = [os.path.join(plan.output_dir, p) for p in PLOTS]
    plots.plot_heads(summary, plan.eval_steps, paths[0], title=plan.table)
    curves = {}
    for row in plan.rows:
      curves[row.name] = [results.read_train_log(plan.model_dir(row, s))
                          for s in range(1, plan.seeds + 1)
                          if os.path.isdir(plan.model_dir(row, s))]
    plots.plot_loss(summary, curves, paths[1], title=plan.table)
    plots.plot_step_time(summary, paths[2], title=plan.table)
    paths.append(comparison.plot_curves(
        plan.rows, plan.seeds, plan.model_dir,
        os.path.join(plan.output_dir, CURVES_PLOT), title=plan.table,
        caption=plan.command_line(),
        step_times=comparison.read_step_times(plan.output_dir)))
    return paths


def plan_markdown(plan, summary):
  """markdown_table() of `summary` with a Plan's steps, costs and seeds."""
  labels = None
  if plan.finetune:
    labels = finetune.column_labels(plan.finetune.mixture_for(plan.rows[0]))
  table = markdown_table(summary, plan.eval_steps, plan.d_model.values(),
                         plan.cost_length.values(), plan.scale, plan.seeds,
                         downstream_labels=labels)
  if plan.finetune:
    table += finetune.columns_note(plan.finetune) + "\n"
  return table


def _mean_std(values):
  return comparison.mean_std(values)[:2]


def _float(value):
  if value is None or value == "":
    return None
  return float(value)


def summarize(rows, records, cost_records):
  """Per-row means / sample stds over seeds.

  Args:
    rows: [Row].
    records: result dicts (from results.csv; None entries are skipped).
    cost_records: {row name: Plan.cost_record(row)}.

  Returns:
    [dict(row=Row, seeds=n, early=(mean, std), final=(mean, std),
          step_time=mean, wall=total, cpu=total, params, multiplies,
          multiplies_executed)] in row order.
  """
  by_row = collections.defaultdict(list)
  for record in records:
    if record:
      by_row[record["row"]].append(record)
  out = []
  for row in rows:
    recs = by_row.get(row.name, [])
    out.append(dict(
        row=row, seeds=len(recs),
        early=_mean_std([_float(r["early_ln_ppl"]) for r in recs]),
        final=_mean_std([_float(r["final_ln_ppl"]) for r in recs]),
        step_time=_mean_std([_float(r["step_time_sec"]) for r in recs])[0],
        wall=sum(_float(r["wall_sec"]) for r in recs) if recs else None,
        cpu=sum(_float(r["cpu_sec"]) for r in recs) if recs else None,
        span=_mean_std([_float(r.get("span_f1")) for r in recs
                        if _float(r.get("span_f1")) is not None]),
        cls=_mean_std([_float(r.get("cls_accuracy")) for r in recs
                       if _float(r.get("cls_accuracy")) is not None]),
        **{k: cost_records[row.name][k]
           for k in ("params", "multiplies", "multiplies_executed")}))
  return out


def _heads_cells(row):
  """h_k, h, h_v as the paper prints them: blank where the variant ties them,
  24* where only some layers are talking heads."""
  star = "*" if row.placement != "all" else ""
  hk, h, hv = str(row.heads_k) + star, str(row.heads), str(row.heads_v) + star
  variant = spec_lib.VARIANT[row.variant]
  if not variant.project_logits:  # tied to h
    hk = ""
  if not variant.project_weights:
    hv = ""
  return hk, h, hv


def _sci(x):
  mantissa, exponent = ("%.3e" % x).split("e")
  return "%s·10^%d" % (mantissa, int(exponent))


def markdown_table(summary, eval_steps, d_models, cost_lengths, scale, seeds,
                   downstream_labels=None):
  """The paper's layout as markdown.

  Columns: label, h_k, h, h_v, d_k, d_v, ln(PPL) at both eval steps (mean,
  and (std) over seeds), with downstream_labels the two downstream columns
  (span F1, classification accuracy: the paper's "SQuAD v1.1 dev-F1" and
  "MNLI-m dev"), step time, params and multiplies per attention layer; the
  best (lowest) ln(PPL) of each column, the highest downstream scores and
  the fastest step time in bold.  Cells of runs not yet recorded stay
  empty; a row with fewer recorded seeds than `seeds` has "(n=k)" after
  its ln(PPL) cells.

  Args:
    summary: summarize() output.
    eval_steps: (early, final).
    d_models, cost_lengths: the d_model values and n = m lengths the costs
      were computed with (iterables of ints).
    scale: "tiny" or "base" (says where the length comes from).
    seeds: seeds per row (a std column needs two).
    downstream_labels: (span label, classification label), or None for no
      downstream columns.

  Returns:
    the table and a one-line note on the costs, as a string.
  """
  lengths = sorted(set(cost_lengths))
  length_note = "n=m=" + "/".join(str(n) for n in lengths)
  std_note = " (std)" if seeds > 1 else ""
  header = ["", "h_k", "h", "h_v", "d_k", "d_v",
            "ln(PPL) %d steps%s" % (eval_steps[0], std_note),
            "ln(PPL) %d steps%s" % (eval_steps[-1], std_note)]
  if downstream_labels:
    header += [label + std_note for label in downstream_labels]
  header += ["step time (s)", "params per att. layer",
            "multiplies per att. layer (%s)" % length_note]

  def lowest(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return min(values) if len(values) > 1 else None

  best_early = lowest(s["early"][0] for s in summary)
  best_final = lowest(s["final"][0] for s in summary)
  best_time = lowest(s["step_time"] for s in summary)

  def highest(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return max(values) if len(values) > 1 else None

  best_span = highest(s.get("span", (None, None))[0] for s in summary)
  best_cls = highest(s.get("cls", (None, None))[0] for s in summary)

  def number(value, best_value, fmt):
    if value is None or math.isnan(value):
      return ""
    text = fmt % value
    if best_value is not None and text == fmt % best_value:
      text = "**%s**" % text
    return text

  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
  for s in summary:
    row = s["row"]
    if row.variant == spec_lib.BILINEAR:
      d_k = d_v = "d_model"
    else:
      d_k, d_v = str(row.d_k), str(row.d_v)
    early = number(s["early"][0], best_early, "%.3f")
    if early and s["early"][1] is not None:
      early += " (%.3f)" % s["early"][1]
    final = number(s["final"][0], best_final, "%.3f")
    if final and s["final"][1] is not None:
      final += " (%.3f)" % s["final"][1]
    if final and s["seeds"] < seeds:  # a partial row says how many seeds
      early += " (n=%d)" % s["seeds"]
      final += " (n=%d)" % s["seeds"]
    various = row.placement != "all"
    scores = []
    if downstream_labels:
      for key, best in (("span", best_span), ("cls", best_cls)):
        mean, std = s.get(key, (None, None))
        cell = number(mean, best, "%.2f")
        scores.append(cell + (" (%.2f)" % std if cell and std is not None
                              else ""))
    cells = [row.label, *_heads_cells(row), d_k, d_v, early, final, *scores,
             number(s["step_time"], best_time, "%.4f"),
             "various" if various else str(s["params"]),
             "various" if various else _sci(s["multiplies"])]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines.append(
      "Params and multiplies per attention layer: costs.py with d_model = %s "
      "and %s (%s); dynamic projections counted folded, as the paper does."
      % ("/".join(str(d) for d in sorted(set(d_models))), length_note,
         "the paper's n=m=512" if scale == "base"
         else "the model's own input length"))
  if any(0 < s["seeds"] < seeds for s in summary):
    lines.append("")
    lines.append("(n=k): the row's mean and std are over the k of %d seeds "
                 "recorded so far." % seeds)
  return "\n".join(lines) + "\n"
