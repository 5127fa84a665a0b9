"""The attention core alone, forward + backward: fused op vs today's einsum core.

  .venv/bin/python benchmarks/fused_core.py                  # ~1 min
  .venv/bin/python benchmarks/fused_core.py --repeats 21 --batch 2
  .venv/bin/python benchmarks/fused_core.py --block_queries 8,16,32  # tuning

At the paper's t5.1.th.base attention (h_k = h = h_v = 24, d_k = d_v = 32,
n = m = 512; batch 2) it times one training step of the core alone, O and
the gradients of a fixed loss sum(O * dO) with respect to Q, K, V, P_l and
P_w, for talking heads and multi-head (no projections), each by
  einsum: kernels.ordered_core's algorithm in plain TF, heads-major
          (J = Q K^T and O = U V batched matmuls, the projections batched
          matmuls with P broadcast over the batch and P-first gradients as
          kernels.project_heads writes them, tf.nn.softmax on [-1, m] rows
          with kernels._softmax_grad's gradient); it keeps J, W, U (and L's
          softmax output) for the backward pass, like the strategies' cores;
  fused:  ops.attention_core (fused_core.cc), which keeps only O(n x h).
The four steps run interleaved, one of each per round (the order rotates),
in one process on the same inputs; the table shows median step times and
the medians of the per-round ratios, next to the ratio of the core's
multiplies.  Before timing, each fused step is checked against its einsum
twin (largest relative difference of O and of every gradient).
"""
import argparse
import statistics
import sys
import time

import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn.fused import ops


def _project(p, x):
  """einsum(P[g, r, s], X[b, g, r, n, m]) -> [b, g, s, n, m], P-first grads.

  kernels.project_heads in TF: P broadcast over the batch so the batch and
  group dims are batch dims of one batched matmul that never transposes X;
  dX = einsum(P, dY), dP = einsum(X, dY) summed over the batch.
  """
  batch = tf.shape(x)[0]

  @tf.custom_gradient
  def fn(p, x):
    pb = tf.broadcast_to(p[None], tf.concat([[batch], tf.shape(p)], 0))
    y = tf.einsum("bgrs,bgrnm->bgsnm", pb, x)

    def grad(dy):
      dp = tf.reduce_sum(tf.einsum("bgrnm,bgsnm->bgrs", x, dy), 0)
      return dp, tf.einsum("bgrs,bgsnm->bgrnm", pb, dy)
    return y, grad

  return fn(p, x)


@tf.custom_gradient
def _softmax_rows(l):
  """W = softmax over m on [-1, m] rows (kernels.softmax_last, on_rows)."""
  shape = tf.shape(l)
  w = tf.reshape(tf.nn.softmax(tf.reshape(l, [-1, shape[-1]])), shape)

  def grad(dw):
    return w * (dw - tf.reduce_sum(dw * w, -1, keepdims=True))
  return w, grad


def einsum_core(q, k, v, p_l=None, p_w=None, bias=None):
  """reference.core as kernels.ordered_core computes it (heads-major)."""
  j = tf.matmul(q, k, transpose_b=True)                    # J
  l = j if p_l is None else _project(p_l, j)               # L
  if bias is not None:
    l += bias[:, None] if bias.shape[1] == 1 else tf.reshape(
        bias, [bias.shape[0]] + l.shape.as_list()[1:])
  w = _softmax_rows(l)                                     # W
  u = w if p_w is None else _project(p_w, w)               # U
  return tf.matmul(u, v)                                   # O


def _inputs(batch, heads, length, d, talking, rng):
  shapes = [("q", [batch, 1, heads, length, d]),
            ("k", [batch, 1, heads, length, d]),
            ("v", [batch, 1, heads, length, d])]
  if talking:
    shapes += [("p_l", [1, heads, heads]), ("p_w", [1, heads, heads])]
  scale = {"q": d ** -0.5, "p_l": heads ** -0.5, "p_w": heads ** -0.5}
  return {name: tf.Variable((rng.randn(*shape) * scale.get(name, 1.0))
                            .astype(np.float32), name=name)
          for name, shape in shapes}


def _step(core, x, d_o, causal):
  """(a scalar that needs O and every gradient, [O] + gradients)."""
  names = sorted(x)
  bias = None
  if causal:
    n = x["q"].shape[3]
    bias = tf.constant(np.triu(np.full([n, n], -1e9, np.float32), 1)
                       [None, None])
  o = core(x["q"], x["k"], x["v"], x.get("p_l"), x.get("p_w"), bias)
  grads = tf.gradients(tf.reduce_sum(o * d_o), [x[n] for n in names])
  # A scalar of every output (a tf.group of them gets pruned to nothing
  # after the first run).
  return tf.add_n([tf.reduce_sum(t) for t in [o] + grads]), [o] + grads


def _relative(a, b):
  return float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))


def _multiplies(heads, length, d, talking):
  """Multiplies of the core's forward + backward (einsum: J, O and the two
  projections, each once forward and twice backward; the fused core's
  gradient recomputes J and the projections once more)."""
  qk = 2 * heads * length * length * d  # J and O
  mix = 2 * heads * heads * length * length if talking else 0
  return 3 * (qk + mix), 3 * (qk + mix) + qk // 2 + mix


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--heads", type=int, default=24)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--d", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--causal", action="store_true",
                      help="add a causal mask bias [1, 1, n, n]")
  parser.add_argument("--block_queries", default="0",
                      help="comma list of fused block sizes (0: automatic)")
  args = parser.parse_args(argv)
  module, reason = ops.load()
  if module is None:
    print("fused core not available: %s" % reason, file=sys.stderr)
    return 1
  blocks = [int(b) for b in args.block_queries.split(",")]
  rng = np.random.RandomState(0)
  tf.disable_eager_execution()
  steps, outputs = {}, {}
  for variant, talking in (("talking_heads", True), ("multi_head", False)):
    x = _inputs(args.batch, args.heads, args.length, args.d, talking, rng)
    d_o = tf.constant(rng.randn(*x["v"].shape.as_list()).astype(np.float32))
    cores = {"einsum": einsum_core}
    for b in blocks:
      cores["fused" if b == 0 else "fused_bq%d" % b] = (
          lambda *a, b=b: ops.fused_core_with_stats(*a, block_queries=b)[0])
    for name, core in cores.items():
      steps[variant, name], outputs[variant, name] = _step(
          core, x, d_o, args.causal)
  with tf.Session() as session:
    session.run(tf.global_variables_initializer())
    print("check (largest relative difference of O and each gradient, "
          "fused vs einsum):")
    for variant, name in steps:
      if name != "einsum":
        got, want = session.run([outputs[variant, name],
                                 outputs[variant, "einsum"]])
        print("  %s %s: %.1e" % (variant, name, max(
            _relative(w, g) for w, g in zip(want, got))))
    keys = list(steps)
    for key in keys:  # warm-up
      session.run(steps[key])
    times = {key: [] for key in keys}
    for r in range(args.repeats):
      for key in keys[r % len(keys):] + keys[:r % len(keys)]:
        start = time.perf_counter()
        session.run(steps[key])
        times[key].append(time.perf_counter() - start)
  _report(args, keys, times)
  return 0


def _report(args, keys, times):
  print("\nfwd+bwd of the core alone: batch %d, heads %d, n = m = %d, "
        "d_k = d_v = %d%s; median of %d interleaved rounds"
        % (args.batch, args.heads, args.length, args.d,
           ", causal mask" if args.causal else "", args.repeats))
  print("| variant | core | median step (ms) | / einsum (same variant) |")
  print("|---|---|---|---|")
  for key in keys:
    ratio = statistics.median(
        a / b for a, b in zip(times[key], times[key[0], "einsum"]))
    print("| %s | %s | %.1f | %.3f |" % (
        key[0], key[1], 1e3 * statistics.median(times[key]), ratio))
  th_mult, th_fused_mult = _multiplies(args.heads, args.length, args.d, True)
  mh_mult, mh_fused_mult = _multiplies(args.heads, args.length, args.d, False)
  print("\n| ratio | measured (median per round) | multiplies |")
  print("|---|---|---|")
  cores = sorted({key[1] for key in keys})
  for core in cores:
    ratio = statistics.median(a / b for a, b in zip(
        times["talking_heads", core], times["multi_head", core]))
    mult = (th_mult / mh_mult if core == "einsum"
            else th_fused_mult / mh_fused_mult)
    print("| %s talking heads / multi-head | %.3f | %.3f |"
          % (core, ratio, mult))


if __name__ == "__main__":
  sys.exit(main())
