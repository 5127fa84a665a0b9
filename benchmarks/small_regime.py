"""Step time of a small-regime table's rows, side by side: what "equal time" costs.

  .venv/bin/python benchmarks/small_regime.py --paper_table lm_heads \\
      [--output_dir sweeps/lm_heads] [--repeats 15]

Builds every row of a small-regime table with the test harness (one
training step = forward, backward, SGD update; one CPU device) and times
them interleaved: each round runs one step of every row, so a load change
on the machine hits all of them alike.  The decoder-only tables
(gin/experiments/lm_heads, lm_variants: models/lm_small.gin) are a
Unitransformer of 2 layers of attention + DenseReluDense(512), d_model 128,
batch 16, length 128, position embeddings; the encoder-decoder table
(encdec_heads: models/encdec_small.gin) is a Bitransformer of 2 + 2 such
layers (the decoder's with encoder-decoder attention, the row's variant in
all three placements), T5's relative position bias, 128 input and 128
target positions, batch 16.  Vocabulary 384 (the byte vocabulary padded as
mtf pads it).  Prints each row's median step time, the median over rounds
of its ratio to the multi-head row of the same heads, and the ratio of
attention-layer multiplies of the paper's formulas (costs.attention_costs).

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
from mtf_talking_heads.core import compat  # noqa: F401  (stack fixes first)
from mesh_tensorflow.transformer import transformer_layers

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers

D_MODEL, D_FF, LENGTH, BATCH, VOCAB, NUM_LAYERS = 128, 512, 128, 16, 384, 2
TABLES = ("lm_heads", "lm_variants", "encdec_heads")
# models/encdec_small.gin: T5's relative position bias in self-attention
RELATIVE = dict(relative_attention_type="bias_shared",
                relative_attention_num_buckets=32)


def attention_layer(row, encdec=False, **kwargs):
  """The row's self-attention layer (encdec: its attention over the
  encoder output), as its gin file configures it; kwargs go to the layer."""
  variant = spec.VARIANT[row.variant]
  args = dict(kwargs, heads=row.heads)
  if row.variant != spec.BILINEAR:  # its d_k = d_v = d_model
    args.update(d_k=row.d_k, d_v=row.d_v)
  if variant.project_logits:
    args["heads_k"] = row.heads_k
  if variant.project_weights:
    args["heads_v"] = row.heads_v
  if row.variant == spec.DYNAMIC:
    args["dynamic"] = list(row.dynamic)
  if row.variant == spec.GROUPED:
    args["groups"] = row.groups
  name = spec.layer_class_names(row.variant)[1 if encdec else 0]
  return getattr(layers, name)(**args)


def _dense():
  return transformer_layers.DenseReluDense(hidden_size=D_FF)


def make_model(row, num_layers=NUM_LAYERS, d_model=D_MODEL, batch=BATCH,
               length=LENGTH):
  """A Harness running one training step of the row's small model:
  models/lm_small.gin, or models/encdec_small.gin for encoder-decoder rows
  (the row's variant in every placement, as encdec_heads places it)."""
  if sweep.model_of(row) != "encdec":
    stack = []
    for _ in range(num_layers):
      stack += [attention_layer(row), _dense()]
    return harness.Harness(harness.name_layers(stack), d_model=d_model, vocab=VOCAB,
                           batch=batch, length=length, optimizer_step=True)
  encoder, decoder = [], []
  for _ in range(num_layers):
    encoder += [attention_layer(row, **RELATIVE), _dense()]
    decoder += [attention_layer(row, **RELATIVE),
                attention_layer(row, encdec=True), _dense()]
  return harness.Harness(harness.name_layers(decoder), d_model=d_model, vocab=VOCAB,
                         batch=batch, length=length, optimizer_step=True,
                         encoder_layers=harness.name_layers(encoder),
                         positional_embedding=False)


def multiplies(row):
  variant, dynamic = row.variant, row.dynamic
  if variant == spec.DYNAMIC:
    variant = spec.TALKING_HEADS
  return costs.attention_costs(variant, row.heads_k, row.heads, row.heads_v,
                               row.d_k, row.d_v, d_model=D_MODEL,
                               length=LENGTH, dynamic=dynamic,
                               groups=row.groups)["multiplies"]


def time_rows(rows, repeats=15, warmup=3, **model_kwargs):
  """{row name: [seconds per step, one per round]}, interleaved; kwargs go
  to make_model (smaller sizes for tests)."""
  models = [(row.name, make_model(row, **model_kwargs)) for row in rows]
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
