"""Sharding strategies for the n x m x heads core of the attention layers.

A strategy decides where an attention layer's tensors live; the layer
computes them.  The layer calls its strategy once per call and the strategy
never calls the layer back: the layer (layers.AttentionLayer.call) tells its
strategy what it is about to compute in an ``AttentionCall`` (its dims,
dynamic terms, context, X and the encoder output M), and
``strategy.frame(call)`` returns a ``Frame``: where the layer runs its
projections (``gather_weights``, ``to_core`` for X, M and the bias,
``from_core`` for Y), the heads dims they carry (``dims``) and the ``core``
the layer calls with Q, K, V (J, L, W, U, O; see attention.attention_core).
The default Frame keeps Q, K, V and Y as the layout lays them out, and the
strategy moves only the core (``strategy.core(...)``); GatheredBatchSplit's
moves the whole layer; Auto returns the frame of the strategy it picks.  A
strategy may rename dims (each rename is an mtf reshape: free, an all-gather
or an all-to-all, depending on the layout) as long as the result equals the
unsharded one.

Select one per layer class with gin, and add the rules it names
(``strategy.layout_rules()``) to the layout::

  mtf_th.TalkingHeadsAttention.strategy = @mtf_th.BatchSplit()
  layout = "heads_k:model;heads_v:model;core_shard:model"

Strategies (docs/sharding.md derives what each moves, per device, under ring
costs; P = size of the mesh axis, S = elements of one tensor):

  HeadsParallel   the core keeps the layer's heads dims as laid out.  With
                  heads_k and heads_v split, L = J P_l and dW = dU P_w^T
                  all-reduce whole n x m x h tensors: 2 (P-1)/P b n m h each.
  QuerySplit      Q goes heads-split -> query-split (all-to-all), K and V are
                  gathered (all-gather; with reduce_scatter=True written as
                  broadcast + all-to-all so that their gradients are
                  all-to-all + local sum, i.e. reduce-scatters), O goes back.
                  Needs length % P == 0.  Every n x m x heads slice is 1/P.
  BatchSplit      Q, K, V go heads-split -> batch-split (all-to-all), O goes
                  back: 4 all-to-alls, (P-1)/P^2 b n h d_k per device each,
                  forward and backward.  Needs batch % P == 0 (per group of
                  the other mesh axes).
  BatchQuerySplit the core split gcd(batch, P) ways over the batch and the
                  rest over queries (batches below P); BatchSplit and
                  QuerySplit are its two ends.
  GatheredBatchSplit
                  the whole layer split over the batch (X cut for free), the
                  weights gathered and their gradients reduce-scattered, Y
                  all-gathered: 0.875x multi-head at t5.1.th.base, any P.
  Auto            the default: prices every strategy that applies with
                  prices.predict (the strategies' ring-cost formulas,
                  TensorFlow-free in prices.py) and runs the fastest of
                  those predicted to fit (planner.price_layer, pick).

All of them compute the core with kernels.ordered_core: the paper's J, L, W,
U, O with the n x m x heads tensors heads-major, the projections as batched
matmuls with P-first gradients (project_heads) and a fused softmax
(softmax_last); HeadsParallel(ordered=False) keeps attention.attention_core
as the paper lays it out, the reference the tests compare with.

The split strategies read the layout from ``context.model.layout`` and
``context.model.mesh_shape`` (t5's utils.build_model and the test harness
pass them to the model, as mtf's MoE layers require too) and run
``check(...)`` before building anything, so a layout they cannot serve fails
with a ValueError naming the dim and the mesh axis.  Every rename is written
so that mtf lowers it to the collective named above (no allconcat hides in a
reshape), see ``_SplitCore``.
"""
import collections
import functools

import gin
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import attention
from mtf_talking_heads.core import compat
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.estimate import perf
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.core import spec
from mtf_talking_heads.nn import validation

# Every op a strategy builds for the core (and, by mtf's naming, every
# gradient op of those) lives under this variable scope; comm.py finds the
# n x m x heads activations by it.
CORE_SCOPE = "attention_core"
BATCH = "batch"
LENGTH = "length"
MEMORY_LENGTH = "memory_length"
D_MODEL = "d_model"
BYTES_PER_ELEMENT = 4  # ring bytes are priced in float32 elements
_CORE_SUFFIX = "_core"  # heads dims inside a split core: whole, on no axis


class MeshLayout(prices.Layout):
  """prices.Layout (a mesh shape and layout rules, asked by tensor-dim name)
  with the mtf objects validation checks against.

  Also takes a model's own mtf.Shape and mtf.LayoutRules.

  Example:
    MeshLayout("batch:2;model:4", "batch:batch;heads:model").axis_of("heads")
    == "model"
  """

  def __init__(self, mesh_shape, layout):
    super().__init__(validation.parse_mesh_shape(mesh_shape),
                     validation.parse_layout(layout))
    self.mesh_shape = mtf.Shape([mtf.Dimension(n, k)
                                 for n, k in self.mesh_pairs])
    self.rules = mtf.LayoutRules(self.pairs)

  def names_on(self, axis):
    """Tensor-dim names the layout maps to mesh axis `axis`."""
    return [t for t, m in self.pairs if m == axis]


def attention_tensor_shapes(dims, batch, length):
  """{tensor: [Dimension]} of every tensor the attention core touches.

  The layer's view (its heads dims), as the layout rules see it:
  Q, K, V, J, L, W, U, O and P_l / P_w where the variant has them; each with
  `groups` before its heads dims when the layer is grouped.
  """
  shapes = spec.activation_shapes(
      dims, [mtf.Dimension(BATCH, batch)], mtf.Dimension(LENGTH, length),
      mtf.Dimension(MEMORY_LENGTH, length))
  g = dims.group_dims
  if dims.project_logits:
    shapes["P_l"] = g + [dims.heads_k, dims.heads]
  if dims.project_weights:
    shapes["P_w"] = g + [dims.heads, dims.heads_v]
  return shapes


def check_layout(dims, mesh, batch, length):
  """Divisibility and obstacle 1 for the attention tensors, before any graph.

  Runs validation.check_mesh_and_layout (non-strict: rules for other dims of
  the model are fine) on attention_tensor_shapes.

  Args:
    dims: attention.AttentionDims.
    mesh: a MeshLayout.
    batch: the batch size.
    length: the sequence length (n = m for self-attention).
  Raises:
    ValueError: naming the dim and mesh axis, if a dim mapped to an axis is
      not divisible by its size, or two dims of one tensor map to one axis.
  """
  validation.check_mesh_and_layout(
      mesh.mesh_shape, mesh.rules, attention_tensor_shapes(dims, batch, length),
      strict=False)


def _model_layout(context):
  """The MeshLayout the model was built for (None if it was not told)."""
  model = getattr(context, "model", None)
  layout = getattr(model, "layout", None)
  mesh_shape = getattr(model, "mesh_shape", None)
  if layout is None and mesh_shape is None:
    return None
  return MeshLayout(mesh_shape, layout)


def _required_model_layout(context, strategy):
  """_model_layout(context), or a ValueError naming how to provide it."""
  mesh = _model_layout(context)
  if mesh is None:
    raise ValueError(
        "%s reads the layout from the model: build the Unitransformer / "
        "Bitransformer with layout= and mesh_shape= (t5's "
        "utils.build_model does)" % type(strategy).__name__)
  return mesh


def _size_of(tensor, name):
  for d in tensor.shape.dims:
    if d.name == name:
      return d.size
  return None


def is_core_activation(shape, dims):
  """Whether a tensor built in a strategy's core is an n x m x heads one.

  True for J, L, W, U, the softmax intermediates and their gradients (in
  any layout: heads dims under their own or their "_core" names, the query
  length whole or split); false for Q, K, V, O (they have d_k or d_v), the
  softmax sums (no memory_length) and P_l, P_w, R_l, R_w (two heads dims).
  """
  names = [d.name for d in shape.dims]
  heads = set()
  for d in (dims.heads_k, dims.heads, dims.heads_v):
    heads.update((d.name, d.name + _CORE_SUFFIX))
  return (MEMORY_LENGTH in names and dims.d_k.name not in names and
          dims.d_v.name not in names and
          len([n for n in names if n in heads]) == 1)


class AttentionCall(collections.namedtuple("AttentionCall", [
    "layer_name", "dims", "dynamic", "context", "x", "memory"])):
  """What an attention layer tells its strategy before computing anything.

  Fields:
    layer_name: the layer's class name (Auto logs it).
    dims: the layer's attention.AttentionDims.
    dynamic: its dynamic terms, e.g. ("x2l", "m2w").
    context: the mtf transformer Context.
    x: X[batch..., length, d_model] (incremental: no length).
    memory: encoder attention's M[batch..., memory_length, d_model] (the
      encoder output); None for self-attention.
  """


class Frame(object):
  """Where a layer computes its projections, and the core it calls.

  The layer (layers.AttentionLayer.call) computes, in this order::

    weights = frame.gather_weights(weights)          # {name: weight}
    Q = compute_q(frame.to_core(X)), K, V, R_M from frame.to_core(M)
    O = frame.core(context, frame.dims, Q, K, V, ..., frame.to_core(bias))
    Y = frame.from_core(compute_y(O, P_o, frame.dims))

  This one changes nothing: the projections run as the layout lays them
  out, and `core` (a strategy's core, Strategy.core's arguments) moves
  what it needs.  GatheredBatchSplit's frame cuts the batch over the mesh
  axis instead (_Plan).

  Attributes:
    core: fn(context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
      dynamic_w, bias, dropout_fn) -> O[..., n, h_v, d_v].
    dims: the heads dims Q, K, V and the weights carry in this frame.
  """

  def __init__(self, core, dims):
    self.core = core
    self.dims = dims

  def gather_weights(self, weights):
    """{name: weight} as the projections use them."""
    return weights

  def to_core(self, t):
    """X, M or the bias as the projections and the core use them."""
    return t

  def from_core(self, y):
    """Y back in the layer's layout."""
    return y


class Strategy(object):
  """Base class: `frame` places a layer's projections, `core` computes O
  from Q, K, V, `check` validates a layout."""

  name = None

  def layout_rules(self):
    """(tensor-dim name, mesh axis) pairs this strategy's layout needs."""
    return []

  def check(self, dims, mesh_shape, layout, batch, length):
    """Raises ValueError (naming dim and mesh axis) if this cannot apply.

    Args:
      dims: attention.AttentionDims of the layer.
      mesh_shape: e.g. "model:8" or "batch:2;model:4".
      layout: layout rules, e.g. "heads_k:model;heads_v:model".
      batch: the batch size.
      length: the sequence length (n = m).
    """
    self._check(dims, MeshLayout(mesh_shape, layout), batch, length)

  def _check(self, dims, mesh, batch, length):
    """check() on a MeshLayout: the layer's layout must split cleanly."""
    check_layout(dims, mesh, batch, length)

  def frame(self, call):
    """The Frame the layer of `call` (an AttentionCall) computes in.

    This default keeps the projections as the layout lays them out (Q, K, V
    with the layer's heads dims, Y summed over them) and moves only the
    core (self.core), in every mode (train/eval, first_part, incremental).
    """
    return Frame(self.core, call.dims)

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """O[..., n, h_v, d_v] from Q, K, V (see attention.attention_core)."""
    raise NotImplementedError("%s.core" % type(self).__name__)


# The attention kernels every strategy's core runs (kernels.py); the names
# stay importable from here.
project_heads = kernels.project_heads
on_rows = kernels.on_rows
softmax_last = kernels.softmax_last
ordered_core = kernels.ordered_core


@gin.configurable(module="mtf_th")
class HeadsParallel(Strategy):
  """The baseline: the core keeps the layer's heads dims, as laid out by the
  layout rules (e.g. heads:model).  Talking-heads projections mix heads, so a
  split heads dim makes them collectives over n x m x heads tensors.

  Args:
    ordered: True: ordered_core (heads-major n x m x heads tensors, fast on
      CPU); False: attention.attention_core exactly as the paper's
      pseudocode lays it out (the reference the tests compare against).
  """

  name = "heads_parallel"

  def __init__(self, ordered=True):
    self.ordered = ordered

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """Returns O[..., n, h_v, d_v] (dims in any order; Y contracts by name)."""
    mesh = _model_layout(context)
    if mesh is not None and _size_of(q, LENGTH) is not None:
      check_layout(dims, mesh, _size_of(q, BATCH) or 1, _size_of(q, LENGTH))
    with tf.variable_scope(CORE_SCOPE):
      if not self.ordered:
        return attention.attention_core(q, k, v, memory_length, dims, p_l,
                                        p_w, dynamic_l, dynamic_w, bias,
                                        dropout_fn)
      return ordered_core(
          q, k, v, memory_length, dims, p_l, p_w, dynamic_l, dynamic_w, bias,
          dropout_fn, fused_softmax=not (
              mesh and mesh.axis_of(memory_length.name)))


class _SplitCore(Strategy):
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
    rename = {d.name: d.name + _CORE_SUFFIX for d in
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
    check_layout(dims, mesh, batch, length)
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
      return HeadsParallel().core(context, dims, q, k, v, memory_length, p_l,
                                  p_w, dynamic_l, dynamic_w, bias, dropout_fn)
    mesh = _required_model_layout(context, self)
    self._check(dims, mesh, _size_of(q, BATCH) or 1,
                _size_of(q, LENGTH) or _size_of(k, MEMORY_LENGTH))
    with tf.variable_scope(CORE_SCOPE):
      plan = _Plan(self, dims, split, mesh)
      o = ordered_core(
          plan.to_core(q), plan.to_core(k), plan.to_core(v), memory_length,
          plan.dims, plan.to_core(p_l), plan.to_core(p_w),
          [plan.to_core(r) for r in dynamic_l],
          [plan.to_core(r) for r in dynamic_w], plan.to_core(bias),
          plan.dropout(dropout_fn, context))
      return plan.from_core(o)


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


class _Plan(_PlanBase):
  """The renames of one _SplitCore.core call (see _SplitCore)."""

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


@gin.configurable(module="mtf_th")
class QuerySplit(_SplitCore):
  """The core split over query positions; projections stay heads-parallel.

  Q: heads-split -> query-split (all-to-all), K and V gathered (see
  _SplitCore for reduce_scatter), O back to heads-split (all-to-all).  Every
  n x m x heads tensor is split P ways whatever the batch, so this is the
  strategy for long sequences and small batches (e.g. 768 heads, batch 1).
  """

  split_name = LENGTH

  @property
  def name(self):
    return "query_split" if self.reduce_scatter else "query_split_allgather"


@gin.configurable(module="mtf_th")
class BatchSplit(_SplitCore):
  """The core split over the batch; projections stay heads-parallel.

  Q, K, V: heads-split -> batch-split (all-to-all); O back (all-to-all); only
  P_l, P_w (and a mask without batch) are gathered.  Needs batch divisible by
  the mesh axis (within each group of other axes the batch is split on).
  """

  split_name = BATCH

  @property
  def name(self):
    return "batch_split" if self.reduce_scatter else "batch_split_allgather"


_batch_query_factors = prices.batch_query_factors


@gin.configurable(module="mtf_th")
class BatchQuerySplit(_SplitCore):
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
    _, p_q = _batch_query_factors(mesh, self.mesh_axis, batch)
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
      return HeadsParallel().core(context, dims, q, k, v, memory_length, p_l,
                                  p_w, dynamic_l, dynamic_w, bias, dropout_fn)
    mesh = _required_model_layout(context, self)
    batch, = [d for d in q.shape.dims if d.name == BATCH]
    self._check(dims, mesh, batch.size, length[0].size)
    with tf.variable_scope(CORE_SCOPE):
      plan = _BatchQueryPlan(self, dims, batch, length[0], mesh)
      o = ordered_core(
          plan.to_core(q), plan.to_core(k), plan.to_core(v), memory_length,
          plan.dims, plan.to_core(p_l), plan.to_core(p_w),
          [plan.to_core(r) for r in dynamic_l],
          [plan.to_core(r) for r in dynamic_w], plan.to_core(bias),
          plan.dropout(dropout_fn))
      return plan.from_core(o)


class _BatchQueryPlan(_PlanBase):
  """The renames of one BatchQuerySplit.core call.

  batch -> [outer, cb, batch_per_shard], length -> [cq, length_per_shard]
  (local), a tensor lacking one of them is broadcast over its shard dim,
  (cb, cq) are merged into core_shard_local (local) and that is renamed to
  core_shard together with the heads (one all-to-all, or a free split).
  """

  def __init__(self, strategy, dims, batch, length, mesh):
    self.batch, self.length = batch, length
    p_b, p_q = _batch_query_factors(mesh, strategy.mesh_axis, batch.size)
    outer_axis = mesh.axis_of(BATCH)
    outer_size = mesh.axis_size(outer_axis) if outer_axis else 1
    rename, (local, cb, cq, bps, nq) = strategy._core_names(dims)  # pylint: disable=protected-access
    self._set_heads(strategy, dims, mesh, rename, local)
    self.cb = mtf.Dimension(cb, p_b)
    self.cq = mtf.Dimension(cq, p_q)
    self.outer = ([mtf.Dimension(BATCH, outer_size)] if outer_size > 1
                  else [])
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
    o = mtf.transpose(o, self.outer + [self.cb, self.bps, self.cq, self.nq]
                      + others)
    return mtf.reshape(o, [self.batch, self.length] + others)

  def dropout(self, dropout_fn):
    """dropout_fn for U in the core layout, noise shared over own queries."""
    if dropout_fn is None:
      return None
    def fn(u):
      noise_shape = [d for d in u.shape.dims if d != self.nq]
      return u * dropout_fn(mtf.ones(u.mesh, noise_shape, u.dtype))
    return fn


_CACHING_MODES = ("first_part", "incremental")  # decoding: K, V cached


@gin.configurable(module="mtf_th")
class GatheredBatchSplit(BatchSplit):
  """The whole layer split over the batch, its weights gathered (FSDP-style).

  X stays replicated over the mesh axis (as the rest of the model keeps the
  residual stream), so cutting it into [core_shard, batch_per_shard] is
  free; each device then computes Q, K, V, the core and Y of its own
  batch_per_shard sequences with every head.  The weights stay stored
  sharded (heads_k:model etc.) and are gathered for use in reduce-scatter
  form (broadcast + all-to-all, see _SplitCore), so their gradients are
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
    for name in (D_MODEL, LENGTH):
      if mesh.axis_of(name) is not None:
        raise ValueError(
            "%s keeps dim %r of the residual stream whole (it splits X over "
            "the batch only), but the layout maps it to mesh axis %r; drop "
            "%s:%s or choose another strategy"
            % (type(self).__name__, name, mesh.axis_of(name), name,
               mesh.axis_of(name)))

  def _plan(self, context, dims, x):
    """The _Plan that cuts x's batch over the axis (checks the layout)."""
    mesh = _required_model_layout(context, self)
    split, = [d for d in x.shape.dims if d.name == BATCH]
    self._check(dims, mesh, split.size, _size_of(x, LENGTH))
    return _Plan(self, dims, split, mesh)

  def frame(self, call):
    """See Strategy.frame: X cut over the batch for free, the weights
    gathered, Q, K, V, the core and Y on the cut batch, Y all-gathered.
    Self-attention derives M from the cut X, so that X's gradient is
    gathered once.  While decoding: BatchSplit's (the layer's frame)."""
    if call.context.mode in _CACHING_MODES:
      return super().frame(call)
    return _GatheredFrame(self._plan(call.context, call.dims, call.x))


class _GatheredFrame(Frame):
  """GatheredBatchSplit's Frame: its _Plan's cut, gather and all-gather."""

  def __init__(self, plan):  # pylint: disable=super-init-not-called
    self.plan = plan
    self.dims = plan.dims

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """ordered_core on the cut batch (Q, K, V already there)."""
    with tf.variable_scope(CORE_SCOPE):
      return ordered_core(q, k, v, memory_length, dims, p_l, p_w, dynamic_l,
                          dynamic_w, bias,
                          self.plan.dropout(dropout_fn, context))

  def gather_weights(self, weights):
    return self.plan.gather_weights(weights)

  def to_core(self, t):
    return self.plan.to_core(t)

  def from_core(self, y):
    return self.plan.from_core(y)


# ------------------------------------------------------------- prediction
def predict_ring_elements(strategy_name, dims, mesh_shape, layout, batch,
                          length, d_model, dynamic=(), mesh_axis="model",
                          memory_length=None):
  """Elements one device sends for one attention layer: prices.ring_elements
  (the strategies' price, TensorFlow-free, next to this module)."""
  return prices.ring_elements(strategy_name, dims, mesh_shape, layout, batch,
                              length, d_model, dynamic, mesh_axis,
                              memory_length)


_LOGGED = set()  # Auto's choices already logged (one line each)


def add_layout_rules(layout, rules):
  """Adds the missing (tensor dim, mesh axis) `rules` to `layout` in place.

  How Auto adds its split strategies' rule: compat.add_layout_rules on the
  model's mtf.LayoutRules (anything else is left alone).

  Returns:
    the pairs added (those the layout did not have).
  """
  if not isinstance(layout, mtf.LayoutRules):
    return []
  return compat.add_layout_rules(layout, rules)


def describe_choice(layer_name, mesh, batch, length, name, predicted, table,
                    memory_length=None):
  """The one line Auto logs: its pick, predicted bytes, the others'."""
  memory = ("" if memory_length in (None, length)
            else ", memory length %d" % memory_length)
  return ("mtf_th.Auto: %s on %s, batch %d, length %d%s: %s, %d bytes/device "
          "predicted (%s)" % (
              layer_name, mesh.mesh_shape_string, batch, length, memory, name,
              predicted, ", ".join(
                  "%s %s" % (n, "n/a" if isinstance(v, str) else int(v))
                  for n, v in table.items() if n != name)))


@gin.configurable(module="mtf_th")
class Auto(Strategy):
  """The fastest strategy that fits, chosen when the layer is built.

  Reads the mesh and layout the model was built for, the batch size and
  the lengths, prices every candidate that applies with
  predict_ring_elements (the formulas that tests/test_auto.py checks
  against mtf's counters) and, with the planner's predictors
  (planner.price_layer: those bytes over `hardware`'s network plus the
  softmax a split strategy stops replicating, perf.py's; memory.py's step
  memory for the model gin describes, when it describes one), runs the
  fastest of those predicted to fit one device of `hardware`
  (planner.pick; ties: the earlier candidate), or, if none fits, the
  smallest, saying so in one logged line.  It logs one line with its
  pick's predicted bytes per device and those of the others.  Its
  layout rule (core_shard on the mesh axis) is the split strategies' one:
  when it picks one of them and the layout lacks the rule, it adds it to
  the model's mtf.LayoutRules (add_layout_rules), the object the mesh
  implementation lowers with.  On a mesh without that axis, or a model
  built without a layout, it runs heads_parallel.  The default strategy of
  every attention layer.

  Args:
    mesh_axis: the axis the split strategies use.
    shard_dim: their shard dim (the layout must map it to mesh_axis).
    candidates: names (keys of STRATEGIES) to choose from, in order of
      preference on ties.
    hardware: the perf.py hardware whose step time and device memory it
      predicts (None: "cpu", the logical CPU devices `mtf_th train` runs
      the mesh on here; launch/tpu.py binds the slice's, e.g. "tpu_v3").
  """

  name = "auto"

  def __init__(self, mesh_axis="model", shard_dim=spec.CORE_SHARD,
               candidates=("heads_parallel", "batch_split_gathered",
                           "batch_split", "batch_query_split", "query_split",
                           "query_split_allgather"), hardware=None):
    if hardware is not None:
      perf.get_hardware(hardware)  # a bad name fails naming the valid ones
    for c in candidates:
      if c not in STRATEGIES:
        raise ValueError("candidates: unknown strategy %r; choose from %s"
                         % (c, ", ".join(STRATEGIES)))
    if not candidates:
      raise ValueError("candidates must name at least one strategy")
    self.mesh_axis = mesh_axis
    self.shard_dim = shard_dim
    self.candidates = tuple(candidates)
    self.hardware = hardware or "cpu"
    self.picked = None  # the name of the strategy last run
    self.note = None  # the line saying nothing fits, if nothing did
    self.priced = None  # [planner.Priced] of the last choice (None: one)

  def layout_rules(self):
    return [(self.shard_dim, self.mesh_axis)]

  def _make(self, name):
    strategy = STRATEGIES[name]()
    if isinstance(strategy, _SplitCore):
      strategy.mesh_axis = self.mesh_axis
      strategy.shard_dim = self.shard_dim
    return strategy

  def with_rule(self, mesh):
    """`mesh` plus this strategy's rule (shard_dim on mesh_axis), when the
    mesh has that axis and the layout puts shard_dim on no axis yet."""
    if (not mesh.has_axis(self.mesh_axis) or
        mesh.axis_of(self.shard_dim) is not None):
      return mesh
    return MeshLayout(mesh.mesh_shape_string,
                      validation.parse_layout(mesh.rules) +
                      [(self.shard_dim, self.mesh_axis)])

  def choose(self, dims, mesh, batch, length, d_model, dynamic=(),
             memory_length=None, add_rule=True, model=None, layer_class=None):
    """(strategy, predicted bytes per device, {name: bytes or reason}).

    Args:
      dims: attention.AttentionDims.
      mesh: a MeshLayout (mesh shape and layout).
      batch, length, d_model, dynamic, memory_length: as
        predict_ring_elements.
      add_rule: price the split strategies as if the layout had this
        strategy's rule (with_rule), which _chosen then adds.
      model: the whole perf.Model (planner.model_from_live_gin), or None:
        memory not predicted.
      layer_class: the layer's class name (planner.attention_of).
    Raises:
      ValueError: if no candidate applies (the first one's reason).
    """
    if add_rule:
      mesh = self.with_rule(mesh)
    table, first_error = {}, None
    for name in self.candidates:
      strategy = self._make(name)
      try:
        strategy._check(dims, mesh, batch, length)  # pylint: disable=protected-access
      except ValueError as e:
        table[name] = str(e)
        first_error = first_error or e
        continue
      table[name] = BYTES_PER_ELEMENT * prices.predict(
          name, dims, mesh, batch, length, d_model, dynamic, self.mesh_axis,
          memory_length)
    priced = [n for n in self.candidates if not isinstance(table[n], str)]
    if not priced:
      raise first_error
    best = self._pick(dims, mesh, batch, length, d_model, dynamic,
                      memory_length, {n: table[n] / BYTES_PER_ELEMENT
                                      for n in priced}, model, layer_class)
    return self._make(best), table[best], table

  def _pick(self, dims, mesh, batch, length, d_model, dynamic, memory_length,
            rings, model, layer_class):
    """planner.pick over planner.price_layer; sets note and priced."""
    self.note = self.priced = None
    if len(rings) == 1:
      return next(iter(rings))
    batch_axis = mesh.axis_of(BATCH)
    groups = mesh.axis_size(batch_axis) if batch_axis else 1
    p = mesh.axis_size(self.mesh_axis)
    axes = {d.name for d in mesh.mesh_shape.dims}
    shape = rules = None
    if model is not None and axes <= {batch_axis, self.mesh_axis}:
      shape = "batch:%d,model:%d" % (groups, p)
      names = {batch_axis: "batch", self.mesh_axis: "model"}
      rules = ";".join("%s:%s" % (d, names[a]) for d, a in
                       compat.layout_pairs(mesh.rules) if a in names)
    else:
      model = None
    priced = planner.price_layer(
        rings, planner.attention_of(dims, dynamic, layer_class), d_model,
        length, memory_length or length, batch // groups, p, self.hardware,
        model=model, mesh_shape=shape, layout=rules)
    usable = planner.usable_bytes(self.hardware, groups * p)
    best, fits = planner.pick(priced, usable)
    self.priced = priced
    if not fits:
      self.note = (
          "mtf_th.Auto: no strategy is predicted to fit %s (%.2f GiB usable "
          "per device): running %s, the smallest (%.2f GiB per device); see "
          "mtf_th plan" % (self.hardware, usable / 2 ** 30, best.name,
                           best.memory / 2 ** 30))
    return best.name

  def check(self, dims, mesh_shape, layout, batch, length):
    """See Strategy.check: raises if no candidate applies."""
    self.choose(dims, MeshLayout(mesh_shape, layout), batch, length, 1)

  def _chosen(self, call, memory_length):
    context = call.context
    mesh = _model_layout(context)
    if mesh is None:
      return HeadsParallel()
    batch = _size_of(call.x, BATCH) or 1
    length = context.length_dim.size
    layout = context.model.layout
    # the rule can be added where the layout lacks it and is the object
    # the mesh implementation lowers with (an mtf.LayoutRules)
    ruled = self.with_rule(mesh)
    can_add = isinstance(layout, mtf.LayoutRules) and ruled is not mesh
    vocab = getattr(getattr(context.model, "output_vocab_dim", None) or
                    getattr(context.model, "input_vocab_dim", None), "size",
                    None)  # an encoder's stack has no output vocabulary
    d_model, name = context.model.model_dim.size, call.layer_name
    model = vocab and planner.model_for_layer(
        vocab, batch, planner.attention_of(call.dims, call.dynamic, name),
        d_model, length)
    strategy, predicted, table = self.choose(
        call.dims, ruled if can_add else mesh, batch, length, d_model,
        call.dynamic, memory_length, add_rule=False, model=model or None,
        layer_class=name)
    added = (add_layout_rules(layout, strategy.layout_rules()) if can_add
             else [])
    line = describe_choice(call.layer_name, mesh, batch, length,
                           strategy.name, predicted, table, memory_length)
    if predicted > min(v for v in table.values() if not isinstance(v, str)):
      line += "; the fastest predicted on %s%s" % (
          self.hardware, " that fits" if model is not None else "")
    if added:
      line += "; added %s to the layout" % ";".join("%s:%s" % r for r in added)
    self.picked = strategy.name
    if line not in _LOGGED:
      _LOGGED.add(line)
      tf.logging.info(line)
    if self.note and self.note not in _LOGGED:
      _LOGGED.add(self.note)
      tf.logging.warning(self.note)
    return strategy

  def frame(self, call):
    """The chosen strategy's frame (see Strategy.frame)."""
    memory_length = (None if call.memory is None
                     else _size_of(call.memory, MEMORY_LENGTH))
    return self._chosen(call, memory_length).frame(call)


# Every named strategy (what `mtf_th comm --strategy all` measures).
STRATEGIES = {
    "heads_parallel": HeadsParallel,
    "query_split_allgather": functools.partial(QuerySplit,
                                               reduce_scatter=False),
    "query_split": QuerySplit,
    "batch_split": BatchSplit,
    "batch_split_gathered": GatheredBatchSplit,
    "batch_query_split": BatchQuerySplit,
}


def make_strategy(name):
  """The strategy registered as `name` (a key of STRATEGIES, or "auto")."""
  if name == Auto.name:
    return Auto()
  if name not in STRATEGIES:
    raise ValueError("strategy: unknown %r; choose from %s, auto"
                     % (name, ", ".join(STRATEGIES)))
  return STRATEGIES[name]()
