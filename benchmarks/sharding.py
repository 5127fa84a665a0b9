"""Communication of every sharding strategy, and CPU step time: two tables.

  .venv/bin/python benchmarks/sharding.py             # both tables (~25 min)
  .venv/bin/python benchmarks/sharding.py --part comm  # communication only
  .venv/bin/python benchmarks/sharding.py --part time --repeats 9

1. Communication (markdown): multi-head vs talking heads under each strategy
   of strategies.STRATEGIES, on model:2, model:4, model:8 and batch:2 x model:4,
   for the t5.1.th.base dims (h_k = h = h_v = 24, d_k = d_v = 32, batch 8)
   and the paper's BERT row (768 heads, d_k = d_v = 1, batch 1; batch 2 on
   batch:2 x model:4, the least that mesh can split), d_model 768, length 512, measured with comm.measure (the `mtf_th comm` unit: one
   layer, forward + backward + SGD step, lowered, never run).  "ring" is the
   feasibility notes' unit (2 allreduce + allconcat + alltoall, millions of
   counted elements); "x MHA" divides ring bytes per device by those of
   multi-head under heads_parallel on the same mesh and dims.
2. CPU step time (markdown): one training step of a one-layer Unitransformer
   with our MultiHeadAttention, our TalkingHeadsAttention (default strategy,
   and with the paper's tensor layout, HeadsParallel(ordered=False)) and mtf
   0.1.21's SelfAttention / TalkingHeadsSelfAttention, all with the
   t5.1.th.base attention dims (batch 1, length 512, d_model 768, vocab 128),
   unsharded.  Repeats are interleaved (one step of each model per round);
   each round gives ratios, the table shows their medians, next to the ratio
   of multiplies of the paper's formulas (costs.attention_costs).
"""
import argparse
import statistics
import sys
import time

from mtf_talking_heads.core import compat

compat.split_cpu(8)

# pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tensorflow.transformer import transformer_layers

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies

# batch 1 cannot be split over a "batch" mesh axis: there the 768-heads
# rows use the smallest batch that can (2), and say so.
DIMS = {
    "t5.1.th.base (24/24/24, d_k=d_v=32)": dict(
        heads=24, d_k=32, d_v=32, batch=8),
    "BERT 768 heads (d_k=d_v=1)": dict(heads=768, d_k=1, d_v=1, batch=1),
}
MESHES = ("model:2", "model:4", "model:8", "batch:2;model:4")
VARIANTS = ("multi_head", "talking_heads")
D_MODEL, LENGTH = 768, 512


def comm_table(out=sys.stdout):
  """Prints the communication table; returns its rows as dicts."""
  cols = ["dims", "mesh", "variant", "strategy", "allreduce M", "alltoall M",
          "allconcat M", "ring M", "ring MB/device", "x MHA",
          "einsum repl.", "max slice M", "slice / whole"]
  print("| " + " | ".join(cols) + " |", file=out)
  print("|" + "|".join("---" if i < 4 else "---:"
                       for i in range(len(cols))) + "|", file=out)
  rows = []
  for dims_name, dims in DIMS.items():
    for mesh in MESHES:
      base = None
      batch = dims["batch"]
      for d in strategies.MeshLayout(mesh, "").mesh_shape.dims:
        if d.name == "batch" and batch % d.size:
          batch = d.size
      label = "%s, batch %d" % (dims_name, batch)
      for variant in VARIANTS:
        config = comm.make_config(variant, dims["heads"], dims["d_k"],
                                  dims["d_v"], D_MODEL, LENGTH, batch)
        for name in strategies.STRATEGIES:
          try:
            r = comm.measure(config, name, mesh)
          except ValueError as e:
            reason = str(e).splitlines()[0].split(";")[0]
            print("| %s | %s | %s | %s | does not apply: %s |%s" % (
                label, mesh, variant, name, reason.replace("|", "/"),
                " |" * (len(cols) - 5)), file=out)
            continue
          if variant == spec.MULTI_HEAD and name == "heads_parallel":
            base = r["ring_bytes_per_device"]
          r["dims"], r["mesh"] = label, mesh
          rows.append(r)
          ring = 2 * r["allreduce"] + r["alltoall"] + r["allconcat"]
          print("| %s | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s "
                "| %.3f | %.1f | 1/%g |" % (
                    label, mesh, variant, name, r["allreduce"] / 1e6,
                    r["alltoall"] / 1e6, r["allconcat"] / 1e6, ring / 1e6,
                    r["ring_bytes_per_device"] / 1e6,
                    "%.2f" % (r["ring_bytes_per_device"] / base) if base
                    else "-", r["einsum_replication"],
                    r["max_slice_elements"] / 1e6,
                    r["max_elements"] / max(r["max_slice_elements"], 1)),
                file=out)
          out.flush()
  return rows


def _timing_layers():
  """name -> factory of a one-layer attention stack, t5.1.th.base dims."""
  th = dict(heads_k=24, heads=24, heads_v=24, d_k=32, d_v=32)
  return {
      "MHA (ours)": lambda: layers.MultiHeadAttention(heads=24, d_k=32,
                                                      d_v=32),
      "TH (ours)": lambda: layers.TalkingHeadsAttention(**th),
      "TH (ours, paper layout)": lambda: layers.TalkingHeadsAttention(
          strategy=strategies.HeadsParallel(ordered=False), **th),
      "MHA (mtf 0.1.21)": lambda: transformer_layers.SelfAttention(
          num_heads=24, key_value_size=32),
      "TH (mtf 0.1.21)": lambda: transformer_layers.TalkingHeadsSelfAttention(
          key_heads_dims=[("heads_k", 24)],
          softmax_heads_dims=[("heads", 24)],
          value_heads_dims=[("heads_v", 24)], key_size=32, value_size=32),
  }


class ProjectionEinsums(object):
  """The six einsums talking heads adds to a training step, alone.

  L = P_l J, U = P_w W (forward), dJ = P_l dL, dW = P_w dU, dP_l = J dL^T,
  dP_w = W dU^T (backward), on random float32 tensors laid out as
  kernels.ordered_core lays them out ([batch, heads, n, m]); one session
  run of all six.  Their time over the multi-head step bounds from below
  what talking heads can cost on this machine.
  """

  def __init__(self, heads=24, batch=1, length=LENGTH):
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    self.graph = tf.Graph()
    with self.graph.as_default():
      shape = [batch, heads, length, length]
      ops = []
      for _ in ("P_l", "P_w"):
        # inputs are variables, so each run computes only the einsums
        p = tf.Variable(tf.random.normal([batch, heads, heads]))
        x = tf.Variable(tf.random.normal(shape))
        dy = tf.Variable(tf.random.normal(shape))
        ops += [tf.einsum("bkh,bknm->bhnm", p, x),   # forward
                tf.einsum("bkh,bhnm->bknm", p, dy),  # gradient of X
                tf.einsum("bknm,bhnm->bkh", x, dy)]  # gradient of P
      # fetch one element of each (a NoOp grouping stateless ops is pruned)
      self.op = [x[0, 0, 0] for x in ops]
      init = tf.global_variables_initializer()
      self.session = tf.Session(graph=self.graph)
      self.session.run(init)

  def step(self):
    self.session.run(self.op)

  def close(self):
    self.session.close()


RATIOS = [("TH (ours)", "MHA (ours)"), ("TH (ours)", "TH (mtf 0.1.21)"),
          ("TH (ours, paper layout)", "TH (ours)"),
          ("TH (mtf 0.1.21)", "MHA (mtf 0.1.21)"),
          ("MHA (ours)", "MHA (mtf 0.1.21)"),
          ("6 projection einsums alone", "MHA (ours)")]


def time_table(repeats=9, warmup=2, out=sys.stdout):
  """Prints median step times and median ratios of interleaved steps."""
  runs = {}
  for name, make in _timing_layers().items():
    runs[name] = harness.Harness([make()], d_model=D_MODEL, vocab=128,
                                 batch=1, length=LENGTH, optimizer_step=True)
  runs["6 projection einsums alone"] = ProjectionEinsums()
  for run in runs.values():
    for _ in range(warmup):
      run.step()
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      run.step()
      times[name].append(time.perf_counter() - start)
  for run in runs.values():
    run.close()
  mult = {v: costs.attention_costs(v, 24, 24, 24, 32, 32, d_model=D_MODEL,
                                   length=LENGTH)["multiplies"]
          for v in ("multi_head", "talking_heads")}
  print("| model | median step (s) |", file=out)
  print("|---|---:|", file=out)
  for name in runs:
    print("| %s | %.3f |" % (name, statistics.median(times[name])), file=out)
  print("", file=out)
  print("| ratio (median of %d interleaved rounds) | measured | multiplies |"
        % repeats, file=out)
  print("|---|---:|---:|", file=out)
  result = {}
  for a, b in RATIOS:
    ratio = statistics.median(x / y for x, y in zip(times[a], times[b]))
    result[a, b] = ratio
    if a.startswith("TH") and b.startswith("MHA"):
      mult_ratio = "%.3f" % (mult["talking_heads"] / mult["multi_head"])
    elif a.startswith("6"):
      mult_ratio = "%.3f" % (mult["talking_heads"] / mult["multi_head"] - 1)
    else:
      mult_ratio = "1"
    print("| %s / %s | %.3f | %s |" % (a, b, ratio, mult_ratio), file=out)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("all", "comm", "time"),
                      default="all")
  parser.add_argument("--repeats", type=int, default=9)
  args = parser.parse_args(argv)
  if args.part in ("all", "comm"):
    comm_table()
    print()
  if args.part in ("all", "time"):
    time_table(args.repeats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
