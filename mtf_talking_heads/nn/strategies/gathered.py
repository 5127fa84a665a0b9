"""GatheredBatchSplit: the whole layer split over the batch (FSDP-style)."""
import gin
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import spec
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn.strategies import frame
from mtf_talking_heads.nn.strategies import mesh_layout
from mtf_talking_heads.nn.strategies import plans
from mtf_talking_heads.nn.strategies import split

_CACHING_MODES = ("first_part", "incremental")  # decoding: K, V cached


@gin.configurable(module="mtf_th")
class GatheredBatchSplit(split.BatchSplit):
  """The whole layer split over the batch, its weights gathered (FSDP-style).

  X stays replicated over the mesh axis (as the rest of the model keeps the
  residual stream), so cutting it into [core_shard, batch_per_shard] is
  free; each device then computes Q, K, V, the core and Y of its own
  batch_per_shard sequences with every head.  The weights stay stored
  sharded (heads_k:model etc.) and are gathered for use in reduce-scatter
  form (broadcast + all-to-all, see split.SplitCore), so their gradients are
  reduce-scattered; Y is all-gathered back to the replicated stream, and
  the gradient of the free cut is an all-gather of dX.  Per device, with
  P the axis size, X = b n d, W the four d x h x d_k weights:

    2 (P-1)/P X  +  2 (P-1)/P (|P_q| + |P_k| + |P_v| + |P_o| + |P_l| + |P_w|)

  against multi-head's 4 (P-1)/P X: 0.5 + 2 W/X (0.875 at t5.1.th.base,
  batch 8, length 512, for any P).  Needs batch % P == 0 (per group of the
  other mesh axes) and d_model, length unsplit on the axis.  While decoding
  ("first_part", "incremental": K and V are cached in the layer's heads
  layout) it runs as BatchSplit.
  """

  def __init__(self, mesh_axis="model", shard_dim=spec.CORE_SHARD):
    super().__init__(mesh_axis=mesh_axis, shard_dim=shard_dim,
                     reduce_scatter=True)

  @property
  def name(self):
    return "batch_split_gathered"

  def _check(self, dims, mesh, batch, length):
    super()._check(dims, mesh, batch, length)
    for name in (mesh_layout.D_MODEL, mesh_layout.LENGTH):
      if mesh.axis_of(name) is not None:
        raise ValueError(
            "%s keeps dim %r of the residual stream whole (it splits X over "
            "the batch only), but the layout maps it to mesh axis %r; drop "
            "%s:%s or choose another strategy"
            % (type(self).__name__, name, mesh.axis_of(name), name,
               mesh.axis_of(name)))

  def _plan(self, context, dims, x):
    """The plans.Plan that cuts x's batch over the axis (checks the layout)."""
    mesh = mesh_layout.required_model_layout(context, self)
    cut, = [d for d in x.shape.dims if d.name == mesh_layout.BATCH]
    self._check(dims, mesh, cut.size,
                mesh_layout.size_of(x, mesh_layout.LENGTH))
    return plans.Plan(self, dims, cut, mesh)

  def frame(self, call):
    """See Strategy.frame: X cut over the batch for free, the weights
    gathered, Q, K, V, the core and Y on the cut batch, Y all-gathered.
    Self-attention derives M from the cut X, so that X's gradient is
    gathered once.  While decoding: BatchSplit's (the layer's frame)."""
    if call.context.mode in _CACHING_MODES:
      return super().frame(call)
    return _GatheredFrame(self._plan(call.context, call.dims, call.x))


class _GatheredFrame(frame.Frame):
  """GatheredBatchSplit's Frame: its plans.Plan's cut, gather and all-gather."""

  def __init__(self, plan):  # pylint: disable=super-init-not-called
    self.plan = plan
    self.dims = plan.dims

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """kernels.ordered_core on the cut batch (Q, K, V already there)."""
    with tf.variable_scope(mesh_layout.CORE_SCOPE):
      return kernels.ordered_core(q, k, v, memory_length, dims, p_l, p_w,
                                  dynamic_l, dynamic_w, bias,
                                  self.plan.dropout(dropout_fn, context))

  def gather_weights(self, weights):
    return self.plan.gather_weights(weights)

  def to_core(self, t):
    return self.plan.to_core(t)

  def from_core(self, y):
    return self.plan.from_core(y)

