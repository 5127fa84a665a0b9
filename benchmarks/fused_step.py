"""Training-step time with the fused attention core and with einsums, side by side.

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/fused_step.py --repeats 15

Two settings, each multi-head and talking heads (h_k = h = h_v), each with
the einsum core and with the fused core (mtf_th.core_kernel.kind,
nn/core_kernel.py):

  base  one training step (forward, backward, SGD update; measure/harness.py)
        of a one-layer Unitransformer with the t5.1.th.base attention: 24
        heads, d_k = d_v = 32, d_model 768, batch 1, length 512, vocabulary
        128 (benchmarks/sharding.py's step), and the attention core alone
        (Q, K, V, P_l, P_w -> O and every gradient, the same dims);
  lm    one training step of the small LM of gin/experiments/lm_heads at 8
        heads of d_k = 16 (2 layers of attention + DenseReluDense(512),
        d_model 128, batch 16, length 128, vocabulary 384:
        benchmarks/small_regime.py's model).

All graphs are built first; then each round runs one step of every model in
turn (interleaved: a change of load on the machine hits all alike), and the
tables give the median step time of each and the median over rounds of each
ratio: talking heads / multi-head per kernel (next to the ratio of the
attention layer's multiplies, costs.attention_costs) and fused / einsum per
variant.  --settings base or lm runs one.  --profile R then traces R
rounds of the base steps' gradient run (fused; TensorFlow's step stats)
and prints each op type's median time, talking heads against multi-head,
largest difference first:

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/fused_step.py --settings base --repeats 5 --profile 10
"""
import argparse
import collections
import statistics
import sys
import time

# pylint: disable=g-import-not-at-top,wrong-import-position
from mtf_talking_heads.core import compat  # noqa: F401  (stack fixes first)
from mesh_tensorflow.transformer import transformer_layers
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.estimate import costs
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn import layers

KERNELS = ("einsum", "fused")
VARIANTS = {"MH": "multi_head", "TH": "talking_heads"}
SETTINGS = {
    # heads, d_k, d_model, batch, length, vocab, layers, d_ff (None: none)
    "base": dict(heads=24, d_k=32, d_model=768, batch=1, length=512,
                 vocab=128, num_layers=1, d_ff=None),
    "lm": dict(heads=8, d_k=16, d_model=128, batch=16, length=128,
               vocab=384, num_layers=2, d_ff=512),
}


def _attention(variant, s):
  if variant == "MH":
    return layers.MultiHeadAttention(heads=s["heads"], d_k=s["d_k"],
                                     d_v=s["d_k"])
  return layers.TalkingHeadsAttention(heads_k=s["heads"], heads=s["heads"],
                                      heads_v=s["heads"], d_k=s["d_k"],
                                      d_v=s["d_k"])


def make_step(setting, variant, kernel):
  """A harness.Harness running one training step (its .step())."""
  s = SETTINGS[setting]
  stack = []
  for _ in range(s["num_layers"]):
    stack.append(_attention(variant, s))
    if s["d_ff"]:
      stack.append(transformer_layers.DenseReluDense(hidden_size=s["d_ff"]))
  with core_kernel.bound(kernel):
    return harness.Harness(harness.name_layers(stack), d_model=s["d_model"],
                           vocab=s["vocab"], batch=s["batch"],
                           length=s["length"], optimizer_step=True)


class CoreAlone(object):
  """The attention core alone: O from Q, K, V (P_l, P_w) and the causal
  mask, forward and every gradient (of sum(O R)), on one device."""

  def __init__(self, setting, variant, kernel):
    s = SETTINGS[setting]
    h = s["heads"]
    dims = attention.make_dims(("heads", h) if variant == "MH" else
                               ("heads_k", h), ("heads", h),
                               ("heads", h) if variant == "MH" else
                               ("heads_v", h), s["d_k"], s["d_k"])
    self.graph = tf.Graph()
    with self.graph.as_default(), core_kernel.bound(kernel):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      batch = mtf.Dimension("batch", s["batch"])
      n = mtf.Dimension("length", s["length"])
      m = mtf.Dimension("memory_length", s["length"])

      def var(name, shape):
        return mtf.get_variable(mesh, name, mtf.Shape(shape),
                                initializer=tf.random_normal_initializer())
      q = var("q", [batch, n, dims.heads_k, dims.d_k])
      k = var("k", [batch, m, dims.heads_k, dims.d_k])
      v = var("v", [batch, m, dims.heads_v, dims.d_v])
      inputs = [q, k, v]
      p_l = p_w = None
      if variant == "TH":
        p_l = var("p_l", [dims.heads_k, dims.heads])
        p_w = var("p_w", [dims.heads, dims.heads_v])
        inputs += [p_l, p_w]
      visible = np.arange(s["length"])[None] <= np.arange(s["length"])[:, None]
      bias = mtf.import_tf_tensor(
          mesh, tf.constant(np.where(visible, 0.0, -1e9), tf.float32),
          mtf.Shape([n, m]))
      o = kernels.ordered_core(q, k, v, m, dims, p_l, p_w, bias=bias)
      r = mtf.import_tf_tensor(mesh, tf.ones(o.shape.to_integer_list),
                               o.shape)
      grads = mtf.gradients([mtf.reduce_sum(o * r)], inputs)
      lowering = mtf.Lowering(graph, {mesh: harness.mesh_impl("", "")})
      self.op = [lowering.export_to_tf_tensor(g) for g in grads]
      init = tf.global_variables_initializer()
      copy = lowering.copy_masters_to_slices()
    self.session = tf.Session(graph=self.graph)
    self.session.run(init)
    self.session.run(copy)

  def step(self):
    self.session.run(self.op)

  def close(self):
    self.session.close()


def build(settings):
  """{(setting, what, variant, kernel): runnable}; what: "step" or "core"."""
  runs = {}
  for setting in settings:
    for variant in VARIANTS:
      for kernel in KERNELS:
        runs[setting, "step", variant, kernel] = run = make_step(
            setting, variant, kernel)
        fused = any(op.type == "FusedAttentionCore"
                    for op in run.graph.get_operations())
        assert fused == (kernel == "fused"), (setting, variant, kernel)
        if setting == "base":
          runs[setting, "core", variant, kernel] = CoreAlone(setting, variant,
                                                             kernel)
  return runs


def timed(runs, repeats, warmup=2):
  """{key: [seconds per run, one per round]}, interleaved."""
  for run in runs.values():
    for _ in range(warmup):
      run.step()
  times = {key: [] for key in runs}
  for _ in range(repeats):
    for key, run in runs.items():
      start = time.perf_counter()
      run.step()
      times[key].append(time.perf_counter() - start)
  return times


def _ratio(times, a, b):
  return statistics.median(x / y for x, y in zip(times[a], times[b]))


def report(times, out=sys.stdout):
  """Prints the two tables; returns {name: median ratio}."""
  keys = sorted(times, key=lambda k: (k[0] != "base", k[1] != "step", k[2],
                                      k[3]))
  rounds = len(next(iter(times.values())))
  print("| setting | what | variant | kernel | median (s) |", file=out)
  print("|---|---|---|---|---:|", file=out)
  for key in keys:
    print("| %s | %s | %s | %s | %.4f |" % (key + (statistics.median(
        times[key]),)), file=out)
  print("\n| ratio (median of %d interleaved rounds) | measured | "
        "multiplies |" % rounds, file=out)
  print("|---|---:|---:|", file=out)
  result = {}
  for setting, what in sorted({k[:2] for k in keys},
                              key=lambda x: (x[0] != "base", x[1])):
    s = SETTINGS[setting]
    mult = {v: costs.attention_costs(VARIANTS[v], s["heads"], s["heads"],
                                     s["heads"], s["d_k"], s["d_k"],
                                     d_model=s["d_model"],
                                     length=s["length"])["multiplies"]
            for v in VARIANTS}
    lines = [("TH / MH, %s" % k, (setting, what, "TH", k),
              (setting, what, "MH", k), "%.3f" % (mult["TH"] / mult["MH"]))
             for k in KERNELS]
    lines += [("%s fused / einsum" % v, (setting, what, v, "fused"),
               (setting, what, v, "einsum"), "1") for v in VARIANTS]
    lines.append(("TH fused / MH einsum", (setting, what, "TH", "fused"),
                  (setting, what, "MH", "einsum"),
                  "%.3f" % (mult["TH"] / mult["MH"])))
    for name, a, b, m in lines:
      ratio = _ratio(times, a, b)
      label = "%s %s: %s" % (setting, what, name)
      result[label] = ratio
      print("| %s | %.3f | %s |" % (label, ratio, m), file=out)
  return result


def _op_times(run):
  """{op type: milliseconds} of one traced gradient run (summed over ops)."""
  options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
  metadata = tf.RunMetadata()
  run.session.run(run._grad_slices, options=options,  # pylint: disable=protected-access
                  run_metadata=metadata)
  types = {op.name: op.type for op in run.graph.get_operations()}
  out = collections.defaultdict(float)
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      op_type = types.get(node.node_name.split(":")[0])
      if op_type:
        out[op_type] += node.all_end_rel_micros / 1e3
  return out


def profile(runs, rounds, out=sys.stdout, top=8):
  """Per op type, the median over traced rounds of its time in the base
  steps' gradient run (fused kernel), TH against MH; returns the rows."""
  pair = {v: runs["base", "step", v, "fused"] for v in VARIANTS}
  samples = {v: collections.defaultdict(list) for v in VARIANTS}
  for _ in range(rounds):
    for v, run in pair.items():
      for op_type, ms in _op_times(run).items():
        samples[v][op_type].append(ms)
  rows = []
  for op_type in set(samples["MH"]) | set(samples["TH"]):
    mh, th = (statistics.median(samples[v][op_type] or [0.0])
              for v in ("MH", "TH"))
    rows.append((th - mh, op_type, mh, th))
  rows.sort(reverse=True)
  print("\n| op type (base step's gradient run, fused; median of %d traced "
        "rounds) | MH (ms) | TH (ms) | TH - MH |" % rounds, file=out)
  print("|---|---:|---:|---:|", file=out)
  for diff, op_type, mh, th in rows[:top] + [
      (sum(r[0] for r in rows), "all op types", sum(r[2] for r in rows),
       sum(r[3] for r in rows))]:
    print("| %s | %.2f | %.2f | %+.2f |" % (op_type, mh, th, diff), file=out)
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--settings", default="base,lm",
                      help="comma-separated: base, lm")
  parser.add_argument("--profile", type=int, default=0, metavar="ROUNDS",
                      help="then trace ROUNDS gradient runs of the base "
                      "steps (fused) and print per-op-type times")
  args = parser.parse_args(argv)
  settings = args.settings.split(",")
  unknown = sorted(set(settings) - set(SETTINGS))
  if unknown or args.repeats < 1:
    parser.error("--settings takes base and lm, --repeats a positive count")
  if args.profile < 0 or (args.profile and "base" not in settings):
    parser.error("--profile takes a positive count of rounds and needs the "
                 "base setting")
  fn, reason = core_kernel.load()
  if fn is None:
    parser.error("the fused op did not load: %s" % reason)
  runs = build(settings)
  try:
    times = timed(runs, args.repeats)
    report(times)
    if args.profile:
      profile(runs, args.profile)
  finally:
    for run in runs.values():
      run.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
