"""Recompute the attention core in the backward pass (memory for time).

The n x m x heads tensors (J, W, U of talking heads) are most of what a
talking-heads step keeps for its backward pass (docs/costs.md, "Memory per
device").  RecomputeCore wraps another strategy's core in
mtf.recompute_grad: the forward pass keeps only the core's inputs (Q, K,
V, P_l, P_w, the bias and the dynamic R tensors) and its output O, and the
backward pass runs the core's forward ops again, one layer at a time,
before their gradients.  The step then does the core's forward einsums and
softmax twice (planner.py prices them) and no longer keeps those tensors
(memory.predict(..., recompute=True)).

  mtf_th.TalkingHeadsAttention.strategy = @mtf_th.RecomputeCore()

Where mtf allows it: mtf.recompute_grad clones the core's forward ops for
the backward pass, but a mtf.custom_gradient op among them keeps handing
its gradient function the original forward tensors, which the capture
has made unusable ("Operation ... has unusable input ...softmax:0",
mesh-tensorflow 0.1.21).  The ordered core of every strategy writes its
talking-heads projections and softmax with custom gradients
(kernels.project_heads, softmax_last), so RecomputeCore runs
HeadsParallel(ordered=False): attention.attention_core, the paper's
layout, plain mtf ops (its gradients equal the ordered core's to 2.4e-7
in tests/estimate/test_plan.py).  The split strategies are refused.

Dropout on the attention weights draws a new mask when recomputed, so the
gradients would not be those of the forward pass: the core refuses it.

Under the fused core (mtf_th.core_kernel.kind "auto" or "fused", where it
applies: nn/core_kernel.py) RecomputeCore runs the fused op as it is, not
under mtf.recompute_grad: it keeps no n x m x heads tensor either (only
O(n x h) softmax statistics), and its gradient already recomputes J, L, W,
U blockwise; recomputing it would only add a forward pass.
"""
import gin
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn.strategies import frame
from mtf_talking_heads.nn.strategies import heads_parallel
from mtf_talking_heads.nn.strategies import mesh_layout


@gin.configurable(module="mtf_th")
class RecomputeCore(frame.Strategy):
  """`strategy`'s core, recomputed in the backward pass.

  Args:
    strategy: the strategy whose core is recomputed: HeadsParallel(
      ordered=False), the default (see the module docstring).
  Raises:
    ValueError: for any other strategy.
  """

  name = "recompute"

  def __init__(self, strategy=None):
    strategy = strategy or heads_parallel.HeadsParallel(ordered=False)
    if type(strategy) is not heads_parallel.HeadsParallel or strategy.ordered:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(
          "RecomputeCore.strategy: mtf.recompute_grad cannot recompute a "
          "core with custom gradients (%s); use HeadsParallel(ordered=False)"
          " (the default)" % type(strategy).__name__)
    self.strategy = strategy

  def layout_rules(self):
    return self.strategy.layout_rules()

  def check(self, dims, mesh_shape, layout, batch, length):
    self.strategy.check(dims, mesh_shape, layout, batch, length)

  def _check(self, dims, mesh, batch, length):
    self.strategy._check(dims, mesh, batch, length)  # pylint: disable=protected-access

  def core_layout(self, dims, mesh, batch, length):
    return self.strategy.core_layout(dims, mesh, batch, length)

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """O from the inner core, under mtf.recompute_grad (same arguments)."""
    if dropout_fn is not None:
      raise ValueError(
          "RecomputeCore: dropout on the attention weights would draw a "
          "different mask when the core is recomputed; set the layer's "
          "dropout_rate = 0.0 or drop RecomputeCore")
    mesh = mesh_layout.model_layout(context)
    with tf.variable_scope(mesh_layout.CORE_SCOPE):
      o = core_kernel.fused_or_none(q, k, v, memory_length, dims, p_l, p_w,
                                    dynamic_l, dynamic_w, bias, None, mesh)
    if o is not None:
      return o
    optional = [("p_l", p_l), ("p_w", p_w), ("bias", bias)]
    names = ["q", "k", "v"] + [n for n, t in optional if t is not None]
    tensors = [q, k, v] + [t for _, t in optional if t is not None]
    n_l = len(dynamic_l)
    tensors += list(dynamic_l) + list(dynamic_w)

    def fn(*inputs):
      given = dict(zip(names, inputs))
      rest = list(inputs[len(names):])
      return self.strategy.core(
          context, dims, given["q"], given["k"], given["v"], memory_length,
          given.get("p_l"), given.get("p_w"), rest[:n_l], rest[n_l:],
          given.get("bias"), None)

    return mtf.recompute_grad(fn, tensors)
