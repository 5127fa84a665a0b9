"""Step time of the small-regime models, side by side: what "equal time" costs.

  .venv/bin/python benchmarks/small_regime.py [--heads 4,8,16,32] [--repeats 15]

The models of gin/models/lm_small.gin (decoder-only, d_model 128, 2 layers
of attention + DenseReluDense(512), batch 16, length 128, vocab 384,
h * d_k = h * d_v = d_model) with multi-head and with talking-heads
attention at each head count, built with the test harness (one training
step = forward, backward, SGD update; one CPU device).  Steps are
interleaved: each round runs one step of every model, so a load change on
the machine hits all of them alike; the table gives each model's median
step time and the median over rounds of talking heads ÷ multi-head, next
to the ratio of attention-layer multiplies of the paper's formulas
(costs.attention_costs).  docs/results.md uses these ratios to read its
equal-time comparisons; a sweep's own step times come from runs that did
not run side by side.
"""
import argparse
import statistics
import sys
import time

# pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tensorflow.transformer import transformer_layers

from mtf_talking_heads import compat  # noqa: F401  (stack fixes first)
from mtf_talking_heads import costs
from mtf_talking_heads import harness
from mtf_talking_heads import layers

D_MODEL, D_FF, LENGTH, BATCH, VOCAB, NUM_LAYERS = 128, 512, 128, 16, 384, 2


def make_model(variant, heads):
  """A Harness running one training step of the lm_small model."""
  d_k = D_MODEL // heads
  stack = []
  for _ in range(NUM_LAYERS):
    if variant == "multi_head":
      attention = layers.MultiHeadAttention(heads=heads, d_k=d_k, d_v=d_k)
    else:
      attention = layers.TalkingHeadsAttention(
          heads_k=heads, heads=heads, heads_v=heads, d_k=d_k, d_v=d_k)
    stack += [attention, transformer_layers.DenseReluDense(hidden_size=D_FF)]
  return harness.Harness(stack, d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                         length=LENGTH, optimizer_step=True)


def multiplies_ratio(heads):
  d_k = D_MODEL // heads
  th, mh = (costs.attention_costs(v, heads, heads, heads, d_k, d_k,
                                  d_model=D_MODEL, length=LENGTH)
            for v in ("talking_heads", "multi_head"))
  return th["multiplies"] / mh["multiplies"]


def time_table(heads_list, repeats=15, warmup=3, out=sys.stdout):
  """Prints the table; returns {heads: (mh s, th s, median ratio)}."""
  models = {(v, h): make_model(v, h) for h in heads_list
            for v in ("multi_head", "talking_heads")}
  for model in models.values():
    for _ in range(warmup):
      model.step()
  times = {key: [] for key in models}
  for _ in range(repeats):
    for key, model in models.items():
      start = time.perf_counter()
      model.step()
      times[key].append(time.perf_counter() - start)
  for model in models.values():
    model.close()
  print("| heads | d_k = d_v | multi-head step (s) | talking-heads step (s) "
        "| TH ÷ MH (median of %d interleaved rounds) | attention multiplies "
        "TH ÷ MH |" % repeats, file=out)
  print("|---:|---:|---:|---:|---:|---:|", file=out)
  result = {}
  for h in heads_list:
    mh, th = times["multi_head", h], times["talking_heads", h]
    ratio = statistics.median(t / m for t, m in zip(th, mh))
    result[h] = (statistics.median(mh), statistics.median(th), ratio)
    print("| %d | %d | %.3f | %.3f | %.2f | %.2f |" % (
        h, D_MODEL // h, result[h][0], result[h][1], ratio,
        multiplies_ratio(h)), file=out)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--heads", default="4,8,16,32")
  parser.add_argument("--repeats", type=int, default=15)
  args = parser.parse_args(argv)
  heads = [int(h) for h in args.heads.split(",")]
  for h in heads:
    if h < 1 or D_MODEL % h:
      parser.error("--heads: %d does not divide d_model %d" % (h, D_MODEL))
  time_table(heads, repeats=args.repeats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
