"""The sweep's figures, drawn with matplotlib (imported at the first plot).

Owns plot_heads (ln(PPL) vs heads, the paper's central claim), plot_loss
(training loss curves) and plot_step_time (seconds per step vs multiplies),
each of which takes report.summarize() rows, and plot_scaling (held-out loss
vs training FLOPs over model sizes, scaling.py's); each writes one PNG.
"""
import collections
import math
import textwrap

from mtf_talking_heads.core import spec as spec_lib


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_heads(summary, eval_steps, path, title=""):
  """ln(PPL) vs number of heads h, one line per (variant, h_k*d_k) family.

  The paper's central claim: multi-head gets worse with many small heads,
  talking heads keeps improving.  Error bars: std over seeds; dashed: the
  early eval step.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  families = collections.OrderedDict()
  for s in summary:
    row = s["row"]
    if row.placement != "all" or s["final"][0] is None:
      continue
    key = (row.label, row.heads_k * row.d_k)
    families.setdefault(key, []).append(s)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, ((label, width), items) in enumerate(families.items()):
    items = sorted(items, key=lambda s: s["row"].heads)
    heads = [s["row"].heads for s in items]
    color = colors[i % len(colors)]
    name = "%s (h·d_k=%d)" % (label, width)
    for key, style, step in (("final", "-", eval_steps[-1]),
                             ("early", "--", eval_steps[0])):
      means = [s[key][0] for s in items]
      stds = [s[key][1] or 0.0 for s in items]
      ax.errorbar(heads, means, yerr=stds, fmt="o" + style, color=color,
                  capsize=3, label="%s, %d steps" % (name, step),
                  alpha=1.0 if key == "final" else 0.5)
  ax.set_xscale("log", base=2)
  all_heads = sorted({s["row"].heads for f in families.values() for s in f})
  if all_heads:
    ax.set_xticks(all_heads)
    ax.set_xticklabels([str(h) for h in all_heads])
  ax.set_xlabel("heads h (d_k = d_v shrink as h grows)")
  ax.set_ylabel("held-out ln(PPL)")
  ax.set_title("ln(PPL) vs heads: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  if families:
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_loss(summary, curves, path, title=""):
  """Training loss vs step per row, one line per seed, from train_log.csv.

  train_log.csv has a row per step; each line is its running mean over
  1/50 of the steps (at least 1) so that rows can be told apart.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7.0, 4.6))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, s in enumerate(summary):
    row = s["row"]
    color = colors[i % len(colors)]
    for j, log_rows in enumerate(curves.get(row.name, [])):
      if not log_rows:
        continue
      window = max(1, len(log_rows) // 50)
      losses = [r[1] for r in log_rows]
      smooth = [sum(losses[max(0, k - window + 1):k + 1])
                / (k + 1 - max(0, k - window + 1)) for k in range(len(losses))]
      ax.plot([r[0] for r in log_rows], smooth, color=color, lw=1.0,
              alpha=0.8,
              label=("%s (%s)" % (row.name, row.label)) if j == 0 else None)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss (running mean)")
  ax.set_title("loss curves: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  if ax.lines:
    ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_step_time(summary, path, title=""):
  """Measured seconds per step vs multiplies executed per attention layer."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for s in summary:
    t, m = s["step_time"], s["multiplies_executed"]
    if t is None or m is None or math.isnan(t):
      continue
    marker = "o" if s["row"].variant == spec_lib.MULTI_HEAD else "s"
    ax.scatter([m], [t], marker=marker)
    ax.annotate(s["row"].name, (m, t), fontsize=6, xytext=(3, 3),
                textcoords="offset points")
  ax.set_xlabel("multiplies per attention layer (executed)")
  ax.set_ylabel("seconds per training step")
  ax.set_title("step time vs multiplies: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_scaling(series, fits, path, caption=""):
  """Held-out ln(PPL) vs training FLOPs (log x): curves and power-law fits.

  Args:
    series: [dict(label, group, baseline, flops, means, ses)], one per
      variant and size: its evaluated points (error bars: the standard
      errors, 0 for one seed); the last point (the fit's) is drawn larger.
    fits: [dict(label, group, a, b)]: L = a * C^-b, dashed over the FLOPs
      of its group's points, in its group's colour.
    path: the PNG.
    caption: the command that made it, under the plot.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7.6, 5.2))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  groups = list(collections.OrderedDict.fromkeys(s["group"] for s in series))
  color = {g: colors[i % len(colors)] for i, g in enumerate(groups)}
  markers = "osD^v<>p"
  sizes = collections.defaultdict(int)
  for s in series:
    marker = markers[sizes[s["group"]] % len(markers)]
    sizes[s["group"]] += 1
    ax.errorbar(s["flops"], s["means"], yerr=s["ses"], fmt=marker + "-",
                color=color[s["group"]], ms=4, capsize=2, lw=1.0,
                alpha=0.9 if s["baseline"] else 1.0, label=s["label"])
    ax.plot(s["flops"][-1:], s["means"][-1:], marker, ms=9, mfc="none",
            color=color[s["group"]])
  for fit in fits:
    xs = [x for s in series if s["group"] == fit["group"] for x in s["flops"]]
    if not xs:
      continue
    lo, hi = math.log(min(xs)), math.log(max(xs))
    grid = [math.exp(lo + (hi - lo) * i / 50.0) for i in range(51)]
    ax.plot(grid, [fit["a"] * c ** -fit["b"] for c in grid], "--",
            color=color[fit["group"]], lw=1.2, label=fit["label"])
  ax.set_xscale("log")
  # label the minor ticks at 2 and 5 x 10^k too: the curve spans 1-2 decades
  ax.xaxis.set_minor_formatter(plt.FuncFormatter(
      lambda x, _: "%.0e" % x if ("%.0e" % x)[0] in "25" else ""))
  ax.tick_params(axis="x", which="minor", labelsize=7)
  ax.set_xlabel("training FLOPs")
  ax.set_ylabel("held-out ln(PPL) (nats per byte)")
  ax.set_title("held-out loss vs training compute (large open markers: "
               "the points fitted)", fontsize=9)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7)
  lines = textwrap.wrap(caption, 150)
  for i, line in enumerate(reversed(lines)):
    fig.text(0.01, 0.01 + 0.02 * i, line, fontsize=6, family="monospace")
  fig.tight_layout(rect=(0, 0.02 + 0.02 * len(lines) if lines else 0, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)
