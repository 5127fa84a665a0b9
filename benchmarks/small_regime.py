"""Step time of a small-regime table's rows, side by side: what "equal time" costs.

  .venv/bin/python benchmarks/small_regime.py --paper_table lm_heads \\
      [--output_dir sweeps/lm_heads] [--repeats 15]

Builds every row of a decoder-only small-regime table (gin/experiments/
lm_heads or lm_variants: models/lm_small.gin, d_model 128, 2 layers of
attention + DenseReluDense(512), batch 16, length 128, vocab 384) with the
test harness (one training step = forward, backward, SGD update; one CPU
device) and times them interleaved: each round runs one step of every row,
so a load change on the machine hits all of them alike.  Prints each row's
median step time, the median over rounds of its ratio to the multi-head row
of the same heads, and the ratio of attention-layer multiplies of the
paper's formulas (costs.attention_costs).

With --output_dir (a sweep of the same table) it writes
<output_dir>/step_times.csv (row, step_time_sec, ratio_to_multi_head; a
row's step_time_sec is its multi-head row's median times the median ratio,
so that ratios of these times are the interleaved ratios); the
sweep's comparison.md then reads its equal-time columns with these step
times instead of the runs' own, which ran at different times on a shared
machine (`mtf_th sweep ... --report` rewrites comparison.md).
"""
import argparse
import csv
import os
import statistics
import sys
import time

# pylint: disable=g-import-not-at-top,wrong-import-position
from mtf_talking_heads import compat  # noqa: F401  (stack fixes first)
from mesh_tensorflow.transformer import transformer_layers

from mtf_talking_heads import comparison
from mtf_talking_heads import costs
from mtf_talking_heads import harness
from mtf_talking_heads import layers
from mtf_talking_heads import sweep

D_MODEL, D_FF, LENGTH, BATCH, VOCAB, NUM_LAYERS = 128, 512, 128, 16, 384, 2
TABLES = ("lm_heads", "lm_variants")


def attention_layer(row):
  """The row's self-attention layer, as its gin file configures it."""
  dims = dict(d_k=row.d_k, d_v=row.d_v)
  if row.variant == "multi_head":
    return layers.MultiHeadAttention(heads=row.heads, **dims)
  if row.variant == "project_logits":
    return layers.ProjectLogitsAttention(heads_k=row.heads_k, heads=row.heads,
                                         **dims)
  if row.variant == "project_weights":
    return layers.ProjectWeightsAttention(heads=row.heads,
                                          heads_v=row.heads_v, **dims)
  heads = dict(heads_k=row.heads_k, heads=row.heads, heads_v=row.heads_v)
  if row.variant == "dynamic_projections":
    return layers.DynamicProjectionsAttention(dynamic=list(row.dynamic),
                                              **heads, **dims)
  if row.variant == "grouped_talking_heads":
    return layers.GroupedTalkingHeadsAttention(groups=row.groups, **heads,
                                               **dims)
  return layers.TalkingHeadsAttention(**heads, **dims)


def make_model(row):
  """A Harness running one training step of models/lm_small.gin."""
  stack = []
  for _ in range(NUM_LAYERS):
    stack += [attention_layer(row),
              transformer_layers.DenseReluDense(hidden_size=D_FF)]
  return harness.Harness(stack, d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                         length=LENGTH, optimizer_step=True)


def multiplies(row):
  variant, dynamic = row.variant, row.dynamic
  if variant == "dynamic_projections":
    variant = "talking_heads"
  return costs.attention_costs(variant, row.heads_k, row.heads, row.heads_v,
                               row.d_k, row.d_v, d_model=D_MODEL,
                               length=LENGTH, dynamic=dynamic,
                               groups=row.groups)["multiplies"]


def time_rows(rows, repeats=15, warmup=3):
  """{row name: [seconds per step, one per round]}, interleaved."""
  models = [(row.name, make_model(row)) for row in rows]
  for _, model in models:
    for _ in range(warmup):
      model.step()
  times = {name: [] for name, _ in models}
  for _ in range(repeats):
    for name, model in models:
      start = time.perf_counter()
      model.step()
      times[name].append(time.perf_counter() - start)
  for _, model in models:
    model.close()
  return times


def table(rows, times, out=sys.stdout):
  """Prints the markdown table; returns [(row name, median s, ratio)]."""
  baselines = dict((row.name, base.name)
                   for row, base in comparison.pairs(rows))
  base_mult = {r.name: multiplies(r) for r in rows}
  print("| row | heads | d_k | median step (s) | ÷ multi-head (median of "
        "%d interleaved rounds) | attention multiplies ÷ multi-head |"
        % len(next(iter(times.values()))), file=out)
  print("|---|---:|---:|---:|---:|---:|", file=out)
  result = []
  for row in rows:
    base = baselines.get(row.name, row.name)
    ratio = statistics.median(
        t / b for t, b in zip(times[row.name], times[base]))
    median = statistics.median(times[row.name])
    result.append((row.name, median, ratio))
    print("| %s | %d | %d | %.3f | %.2f | %.2f |" % (
        row.label, row.heads, row.d_k, median, ratio,
        base_mult[row.name] / base_mult[base]), file=out)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--paper_table", choices=TABLES, default="lm_heads")
  parser.add_argument("--rows", help="only these rows (1-based, e.g. 2,6)")
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--output_dir",
                      help="a sweep of the same table: write step_times.csv")
  args = parser.parse_args(argv)
  rows = sweep.select_rows(sweep.paper_table_rows(args.paper_table),
                           args.rows)
  result = table(rows, time_rows(rows, repeats=args.repeats))
  if args.output_dir:
    path = os.path.join(args.output_dir, comparison.STEP_TIMES)
    with open(path, "w", newline="") as f:
      writer = csv.writer(f, lineterminator="\n")
      writer.writerow(["row", "step_time_sec", "ratio_to_multi_head"])
      baselines = dict((r.name, b.name) for r, b in comparison.pairs(rows))
      medians = {name: median for name, median, _ in result}
      for name, median, ratio in result:
        # a variant's time = its baseline's median x the median ratio, so
        # that the comparison's ratios are the interleaved ones
        base = baselines.get(name)
        seconds = medians[base] * ratio if base in medians else median
        writer.writerow([name, "%.5f" % seconds, "%.4f" % ratio])
    print("wrote %s" % path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
