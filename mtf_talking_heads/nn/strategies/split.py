"""The split strategies: the core cut over the query length, the batch, or
both, on one mesh axis, while the projections stay heads-parallel.

SplitCore says how (every rename lowers to the collective it names: no
allconcat hides in a reshape); plans.py holds the renames of one call.
"""
import gin
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn.strategies import frame
from mtf_talking_heads.nn.strategies import heads_parallel
from mtf_talking_heads.nn.strategies import mesh_layout
from mtf_talking_heads.nn.strategies import plans

BATCH = mesh_layout.BATCH
LENGTH = mesh_layout.LENGTH
MEMORY_LENGTH = mesh_layout.MEMORY_LENGTH


class SplitCore(frame.Strategy):
  """Runs the core split over one non-heads dim S (query length or batch).

  On the strategy's mesh axis (size P) the core's heads dims are renamed to
  unsplit copies ("<name>_core") and S becomes [S_outer, core_shard,
  S_per_shard], core_shard being mapped to the axis (S_outer, named S and
  sized like the mesh axis S is already split on, exists only when S is split
  on another axis, e.g. batch on "batch").  Per tensor:

    * has S (Q, R_X, masks; K, V too when S is the batch): S is first cut
      into [S_outer, core_shard_local, S_per_shard] (a local reshape, no
      dim changes mesh axis), then core_shard_local becomes core_shard and
      the heads dims their unsplit copies: the axis moves from a heads dim
      to core_shard, an all-to-all (a free split if the tensor was
      replicated).  Two steps because mtf's reshape can only move a split to
      a boundary that already exists between tensor dims.  O goes back the
      same way.
    * lacks S (K, V, R_M under a query split; P_l, P_w; a mask without S):
      must be whole on every shard.  reduce_scatter=False renames the heads
      dims (an all-gather; the gradient is then an all-reduce inside the
      consuming einsum).  reduce_scatter=True broadcasts it over a new
      unsplit dim core_shard_local[P] and renames that to core_shard: an
      all-to-all that leaves a full copy at every shard, whose gradient is an
      all-to-all followed by a local sum over the copies: a reduce-scatter,
      half the bytes of the all-reduce.  A tensor not split on the axis is
      renamed for free either way.

  Args:
    mesh_axis: the mesh axis the core is split over (the one the heads are
      split over by the layout, usually "model").
    shard_dim: name of the dim indexing shards; the layout must map it to
      mesh_axis (see layout_rules()).
    reduce_scatter: write gathers so their gradients are reduce-scatters.
  """

  split_name = None  # the tensor dim split over the mesh axis

  def __init__(self, mesh_axis="model", shard_dim=spec.CORE_SHARD,
               reduce_scatter=True):
    self.mesh_axis = mesh_axis
    self.shard_dim = shard_dim
    self.reduce_scatter = reduce_scatter

  def layout_rules(self):
    return [(self.shard_dim, self.mesh_axis)]

  def _core_names(self, dims):
    """{layer heads name: core heads name} and the helper dim names."""
    rename = {d.name: d.name + mesh_layout.CORE_SUFFIX for d in
              (dims.heads_k, dims.heads, dims.heads_v)}
    helpers = [self.shard_dim + "_local", self.split_name + "_per_shard"]
    return rename, helpers

  def _check(self, dims, mesh, batch, length):
    """See Strategy.check; needs the shard rule and S % P == 0."""
    cls = type(self).__name__
    axis = self.mesh_axis
    if dims.groups is not None:
      raise ValueError(
          "%s does not split grouped talking heads (dim %r): grouped talking "
          "heads runs heads-parallel: lay out %s:%s and use HeadsParallel"
          % (cls, dims.groups.name, dims.groups.name, axis))
    if not mesh.has_axis(axis):
      raise ValueError(
          "%s splits the core over mesh axis %r, which mesh_shape %r lacks; "
          "set %s(mesh_axis=...) to one of its axes"
          % (cls, axis, mesh.mesh_shape_string, cls))
    mesh_layout.check_layout(dims, mesh, batch, length)
    if mesh.axis_of(self.shard_dim) != axis:
      raise ValueError(
          "%s needs dim %r on mesh axis %r: add '%s:%s' to the layout"
          % (cls, self.shard_dim, axis, self.shard_dim, axis))
    rename, helpers = self._core_names(dims)
    for name in list(rename.values()) + helpers:
      if mesh.axis_of(name) is not None:
        raise ValueError(
            "%s uses dim %r unsplit, but the layout maps it to mesh axis %r; "
            "drop that rule" % (cls, name, mesh.axis_of(name)))
    for name in self._split_names() + (MEMORY_LENGTH, dims.d_k.name,
                                       dims.d_v.name):
      if mesh.axis_of(name) == axis:
        raise ValueError(
            "%s splits the core over mesh axis %r, which the layout also "
            "gives to dim %r; drop %s:%s" % (cls, axis, name, name, axis))
    if mesh.axis_of(MEMORY_LENGTH) is not None:
      raise ValueError(
          "%s keeps dim %r whole (the softmax runs over it), but the layout "
          "maps it to mesh axis %r; drop that rule"
          % (cls, MEMORY_LENGTH, mesh.axis_of(MEMORY_LENGTH)))
    for d in (dims.heads_k, dims.heads, dims.heads_v):
      other = mesh.axis_of(d.name)
      if other not in (None, axis):
        raise ValueError(
            "%s gathers the heads over mesh axis %r only, but dim %r is on "
            "mesh axis %r; map it to %r or leave it unsplit"
            % (cls, axis, d.name, other, axis))
    self._check_sizes(mesh, batch, length)

  def core_layout(self, dims, mesh, batch, length):
    """See Strategy.core_layout: the core's heads dims are whole copies."""
    del dims, mesh, batch, length
    return None

  def _split_names(self):
    """The layer's dims the core is split over."""
    return (self.split_name,)

  def _check_sizes(self, mesh, batch, length):
    """S divisible by the axis (within the other axes' split of S)."""
    cls = type(self).__name__
    axis = self.mesh_axis
    size = {BATCH: batch, LENGTH: length}[self.split_name]
    outer_axis = mesh.axis_of(self.split_name)
    parts = mesh.axis_size(axis) * (
        mesh.axis_size(outer_axis) if outer_axis else 1)
    if size % parts:
      raise ValueError(
          "%s splits dim %r (size %d) over mesh axis %r (size %d)%s: %d is "
          "not a multiple of %d" % (
              cls, self.split_name, size, axis, mesh.axis_size(axis),
              (" within its split on mesh axis %r (size %d)"
               % (outer_axis, mesh.axis_size(outer_axis))) if outer_axis
              else "", size, parts))

  # ------------------------------------------------------------- renames
  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """Returns O[..., n, h_v, d_v], laid out as the layer's heads dims say."""
    split = None
    for d in q.shape.dims:
      if d.name == self.split_name:
        split = d
    if split is None:  # incremental decoding: q has no length dim
      return heads_parallel.HeadsParallel().core(
          context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
          dynamic_w, bias, dropout_fn)
    mesh = mesh_layout.required_model_layout(context, self)
    self._check(dims, mesh, mesh_layout.size_of(q, BATCH) or 1,
                mesh_layout.size_of(q, LENGTH) or
                mesh_layout.size_of(k, MEMORY_LENGTH))
    with tf.variable_scope(mesh_layout.CORE_SCOPE):
      plan = plans.Plan(self, dims, split, mesh)
      o = kernels.ordered_core(
          plan.to_core(q), plan.to_core(k), plan.to_core(v), memory_length,
          plan.dims, plan.to_core(p_l), plan.to_core(p_w),
          [plan.to_core(r) for r in dynamic_l],
          [plan.to_core(r) for r in dynamic_w], plan.to_core(bias),
          plan.dropout(dropout_fn, context), layout=mesh)
      return plan.from_core(o)


@gin.configurable(module="mtf_th")
class QuerySplit(SplitCore):
  """The core split over query positions; projections stay heads-parallel.

  Q: heads-split -> query-split (all-to-all), K and V gathered (see
  SplitCore for reduce_scatter), O back to heads-split (all-to-all).  Every
  n x m x heads tensor is split P ways whatever the batch, so this is the
  strategy for long sequences and small batches (e.g. 768 heads, batch 1).
  """

  split_name = LENGTH

  @property
  def name(self):
    return "query_split" if self.reduce_scatter else "query_split_allgather"


@gin.configurable(module="mtf_th")
class BatchSplit(SplitCore):
  """The core split over the batch; projections stay heads-parallel.

  Q, K, V: heads-split -> batch-split (all-to-all); O back (all-to-all); only
  P_l, P_w (and a mask without batch) are gathered.  Needs batch divisible by
  the mesh axis (within each group of other axes the batch is split on).
  """

  split_name = BATCH

  @property
  def name(self):
    return "batch_split" if self.reduce_scatter else "batch_split_allgather"


@gin.configurable(module="mtf_th")
class BatchQuerySplit(SplitCore):
  """The core split over batch x query positions, for small batches.

  The axis (size P) is split p_b = gcd(batch per group, P) ways over the
  batch and p_q = P / p_b ways over the query positions; the projections
  stay heads-parallel, as in BatchSplit.  Q, O (and R_X, masks) go
  heads-split -> (batch, query)-split by all-to-all; K, V (and R_M) go to
  the p_q shards of their batch slice, all heads: broadcast over the query
  shards and one all-to-all, whose gradient is the reverse all-to-all and a
  local sum (a reduce-scatter).  Per device, P the axis size:

    4 (P-1)/P X + 2 (P-1)/P^2 (Q + O) + 2 (P-1)/(P p_b) (K + V) + P_l, P_w

  i.e. 1 + 1/P + 1/p_b times multi-head at h d_k = d_model: BatchSplit
  (p_b = P, 1 + 2/P) and QuerySplit (p_b = 1, 2 + 1/P) are its ends; batch 4
  on model:8 gives 1.375.  Needs length % p_q == 0.  With dropout the noise
  is drawn per shard (broadcast over the shard's query positions only).
  """

  split_name = BATCH

  @property
  def name(self):
    return "batch_query_split"

  def _split_names(self):
    return (BATCH, LENGTH)

  def _core_names(self, dims):
    rename, _ = super()._core_names(dims)
    helpers = [self.shard_dim + suffix for suffix in
               ("_local", "_batch", "_query")] + [
                   BATCH + "_per_shard", LENGTH + "_per_shard"]
    return rename, helpers

  def _check_sizes(self, mesh, batch, length):
    _, p_q = prices.batch_query_factors(mesh, self.mesh_axis, batch)
    if length % p_q:
      raise ValueError(
          "%s splits dim %r (size %d) %d ways (mesh axis %r, size %d, over "
          "gcd(batch per group, %d) batch shards): %d is not a multiple of %d"
          % (type(self).__name__, LENGTH, length, p_q, self.mesh_axis,
             mesh.axis_size(self.mesh_axis), mesh.axis_size(self.mesh_axis),
             length, p_q))

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """Returns O[..., n, h_v, d_v], laid out as the layer's heads dims say."""
    length = [d for d in q.shape.dims if d.name == LENGTH]
    if not length:  # incremental decoding: q has no length dim
      return heads_parallel.HeadsParallel().core(
          context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
          dynamic_w, bias, dropout_fn)
    mesh = mesh_layout.required_model_layout(context, self)
    batch, = [d for d in q.shape.dims if d.name == BATCH]
    self._check(dims, mesh, batch.size, length[0].size)
    with tf.variable_scope(mesh_layout.CORE_SCOPE):
      plan = plans.BatchQueryPlan(self, dims, batch, length[0], mesh)
      o = kernels.ordered_core(
          plan.to_core(q), plan.to_core(k), plan.to_core(v), memory_length,
          plan.dims, plan.to_core(p_l), plan.to_core(p_w),
          [plan.to_core(r) for r in dynamic_l],
          [plan.to_core(r) for r in dynamic_w], plan.to_core(bias),
          plan.dropout(dropout_fn), layout=mesh)
      return plan.from_core(o)

