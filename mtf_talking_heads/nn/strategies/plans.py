"""The renames of one split core: how the split strategies move tensors.

A plan turns a tensor from the layer's names into the core's layout (heads
whole, the split dim cut over the mesh axis) and back; see
split.SplitCore for the collectives each rename lowers to.  Plan serves
QuerySplit, BatchSplit and GatheredBatchSplit (one split dim),
BatchQueryPlan serves BatchQuerySplit (batch x query positions).
"""
import mesh_tensorflow as mtf

from mtf_talking_heads.estimate import prices
from mtf_talking_heads.nn.strategies import mesh_layout


class _PlanBase(object):
  """What both core plans share: heads renamed whole, the shard dims.

  Attributes: rename / restore ({layer heads name: core dim} and back),
  dims (the renamed AttentionDims), group (the shard dim, split on the
  axis), local (the same size, not split), split_on_axis.
  """

  def _set_heads(self, strategy, dims, mesh, rename, local_name):
    axis = strategy.mesh_axis
    self.strategy = strategy
    self.rename = {d.name: mtf.Dimension(rename[d.name], d.size)
                   for d in (dims.heads_k, dims.heads, dims.heads_v)}
    self.restore = {c.name: mtf.Dimension(n, c.size)
                    for n, c in self.rename.items()}
    self.dims = dims.renamed(rename)
    self.group = mtf.Dimension(strategy.shard_dim, mesh.axis_size(axis))
    self.local = mtf.Dimension(local_name, mesh.axis_size(axis))
    self.split_on_axis = set(mesh.names_on(axis))

  def _whole(self, t):
    """A tensor without the split dims (a weight) -> heads renamed; one
    split on the axis is gathered in reduce-scatter form if asked."""
    renamed = [self.rename.get(d.name, d) for d in t.shape.dims]
    split_here = any(d.name in self.split_on_axis for d in t.shape.dims)
    if not (self.strategy.reduce_scatter and split_here):
      return mtf.reshape(t, renamed)
    copies = mtf.broadcast(t, [self.local] + t.shape.dims)
    return mtf.reshape(copies, [self.group] + renamed)


class Plan(_PlanBase):
  """The renames of one split.SplitCore.core call (see SplitCore)."""

  def __init__(self, strategy, dims, split, mesh):
    self.split = split
    p = mesh.axis_size(strategy.mesh_axis)
    outer_axis = mesh.axis_of(split.name)
    outer_size = mesh.axis_size(outer_axis) if outer_axis else 1
    rename, (local_name, inner_name) = strategy._core_names(dims)  # pylint: disable=protected-access
    self._set_heads(strategy, dims, mesh, rename, local_name)
    outer = ([mtf.Dimension(split.name, outer_size)] if outer_size > 1
             else [])
    inner = [mtf.Dimension(inner_name, split.size // (p * outer_size))]
    self.pieces = outer + [self.group] + inner
    self.local_pieces = outer + [self.local] + inner

  def to_core(self, t):
    """t (layer names) -> the core's layout: S split, heads whole."""
    if t is None:
      return None
    if self.split in t.shape.dims:
      local, new = [], []
      for d in t.shape.dims:
        local.extend(self.local_pieces if d == self.split else [d])
        new.extend(self.pieces if d == self.split else [self.rename.get(d.name, d)])
      return mtf.reshape(mtf.reshape(t, local), new)
    return self._whole(t)

  def gather_weights(self, weights):
    """{name: weight} whole on every shard, gradients reduce-scattered.

    A weight split on the axis is gathered in reduce-scatter form
    (to_core); when the batch is also split on another mesh axis (S_outer)
    the weight is first broadcast over S_outer (free: it is replicated
    there), so that its gradient is summed over that axis only after the
    reduce-scatter, on 1/P of the weight.
    """
    outer = self.pieces[:-2]
    gathered = {}
    for name, w in weights.items():
      if outer:
        w = mtf.broadcast(w, outer + w.shape.dims)
      gathered[name] = self.to_core(w)
    return gathered

  def from_core(self, o):
    """O in the core's layout -> the layer's names (heads split again)."""
    dims = o.shape.dims
    ordered = []
    for d in dims:
      if d in self.pieces:
        if d == self.pieces[0]:
          ordered.extend(self.pieces)
      else:
        ordered.append(d)
    if ordered != dims:
      o = mtf.transpose(o, ordered)
    local = [self.local if d == self.group else self.restore.get(d.name, d)
             for d in ordered]
    new = []
    for d in ordered:
      if d in self.pieces:
        if d == self.pieces[0]:
          new.append(self.split)
      else:
        new.append(self.restore.get(d.name, d))
    return mtf.reshape(mtf.reshape(o, local), new)

  def dropout(self, dropout_fn, context):
    """dropout_fn for U in the core layout, same noise broadcast as unsplit.

    The layer's dropout broadcasts its noise over the query length; when
    that dim is split, the noise is drawn for U without it and multiplied in.
    """
    if dropout_fn is None or self.split != context.length_dim:
      return dropout_fn
    def fn(u):
      noise_shape = [d for d in u.shape.dims if d not in self.pieces]
      return u * dropout_fn(mtf.ones(u.mesh, noise_shape, u.dtype))
    return fn


class BatchQueryPlan(_PlanBase):
  """The renames of one split.BatchQuerySplit.core call.

  batch -> [outer, cb, batch_per_shard], length -> [cq, length_per_shard]
  (local), a tensor lacking one of them is broadcast over its shard dim,
  (cb, cq) are merged into core_shard_local (local) and that is renamed to
  core_shard together with the heads (one all-to-all, or a free split).
  """

  def __init__(self, strategy, dims, batch, length, mesh):
    self.batch, self.length = batch, length
    p_b, p_q = prices.batch_query_factors(mesh, strategy.mesh_axis,
                                          batch.size)
    outer_axis = mesh.axis_of(mesh_layout.BATCH)
    outer_size = mesh.axis_size(outer_axis) if outer_axis else 1
    rename, (local, cb, cq, bps, nq) = strategy._core_names(dims)  # pylint: disable=protected-access
    self._set_heads(strategy, dims, mesh, rename, local)
    self.cb = mtf.Dimension(cb, p_b)
    self.cq = mtf.Dimension(cq, p_q)
    self.outer = ([mtf.Dimension(mesh_layout.BATCH, outer_size)]
                  if outer_size > 1 else [])
    self.bps = mtf.Dimension(bps, batch.size // (outer_size * p_b))
    self.nq = mtf.Dimension(nq, length.size // p_q)

  def to_core(self, t):
    """t (layer names) -> [outer, core_shard, rest...], heads whole."""
    if t is None:
      return None
    dims = t.shape.dims
    if self.batch not in dims and self.length not in dims:
      return self._whole(t)
    cut = []
    for d in dims:
      if d == self.batch:
        cut.extend(self.outer + [self.cb, self.bps])
      elif d == self.length:
        cut.extend([self.cq, self.nq])
      else:
        cut.append(d)
    t = mtf.reshape(t, cut)
    rest = [d for d in cut if d not in self.outer + [self.cb, self.cq]]
    t = mtf.broadcast(t, self.outer + [self.cb, self.cq] + rest)
    t = mtf.reshape(t, self.outer + [self.local] + rest)
    return mtf.reshape(t, self.outer + [self.group] +
                       [self.rename.get(d.name, d) for d in rest])

  def from_core(self, o):
    """O [outer, core_shard, ...] -> the layer's batch, length and heads."""
    rest = [d for d in o.shape.dims if d not in self.outer + [self.group]]
    o = mtf.transpose(o, self.outer + [self.group] + rest)
    restored = [self.restore.get(d.name, d) for d in rest]
    o = mtf.reshape(o, self.outer + [self.local] + restored)
    o = mtf.reshape(o, self.outer + [self.cb, self.cq] + restored)
    others = [d for d in restored if d not in (self.bps, self.nq)]
    # dims the layer has before its batch (mtf's outer_batch in utils.run's
    # training and eval graphs) stay first, as the residual expects
    leading = [d for d in others
               if d.name not in self.rename and d != self.dims.d_v]
    others = [d for d in others if d not in leading]
    o = mtf.transpose(o, leading + self.outer +
                      [self.cb, self.bps, self.cq, self.nq] + others)
    return mtf.reshape(o, leading + [self.batch, self.length] + others)

  def dropout(self, dropout_fn):
    """dropout_fn for U in the core layout, noise shared over own queries."""
    if dropout_fn is None:
      return None
    def fn(u):
      noise_shape = [d for d in u.shape.dims if d != self.nq]
      return u * dropout_fn(mtf.ones(u.mesh, noise_shape, u.dtype))
    return fn
