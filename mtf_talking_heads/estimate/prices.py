"""What each sharding strategy sends: its price, without TensorFlow.

ring_elements(strategy, dims, mesh_shape, layout, ...) is the number of
elements one device sends for one attention layer, forward + backward, under
ring costs: docs/sharding.md's formulas ("The strategies, on paper"),
written per tensor so that any heads layout is priced.  strategies.Auto ranks
the strategies by it, `mtf_th comm --strategy auto` prints it, and
step_time.py and the planner price a model's attention layer with it
(attention_elements: the heads-parallel layout); tests/strategies/test_auto.py checks
it against mtf's counters.  The strategy names are strategy_table's.  Pure
Python: Layout answers mtf.LayoutRules' questions (which mesh axis a dim is
on, an axis' size) from the parsed strings; mesh_layout.MeshLayout is a Layout
that also holds the mtf objects.

Example (talking heads 24 x 32 on model:8, heads-parallel):
  attention_elements("heads_parallel",
                     make_spec("talking_heads", 24, 32, 32), d_model=768,
                     n=512, m=512, batch=8, model_axis=8)
  == 4 * 7/8 * (8*512*768) + 4 * 7/8 * (8*512*512*24)
"""
import collections
import math

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import strategy_table

BATCH = "batch"


class Layout(object):
  """A mesh shape and layout rules, asked by tensor-dimension name.

  mtf.LayoutRules' answers without mtf: a dim maps to the mesh axis of its
  rule if the mesh has that axis.

  Example:
    Layout("batch:2;model:4", "batch:batch;heads:model").axis_of("heads")
    == "model"
  """

  def __init__(self, mesh_shape, layout):
    self.mesh_pairs = spec_lib.parse_mesh_shape(mesh_shape)
    self.pairs = spec_lib.parse_layout(layout)
    self.mesh_shape_string = ";".join("%s:%d" % p for p in self.mesh_pairs)

  def axis_of(self, name):
    """The mesh axis name that tensor dims called `name` map to, or None."""
    axes = [n for n, _ in self.mesh_pairs]
    found = [m for t, m in self.pairs if t == name and m in axes]
    if len(found) > 1:
      raise ValueError("layout maps dim %r to more than one mesh axis" % name)
    return found[0] if found else None

  def axis_size(self, axis):
    """Size of mesh axis `axis` (1 if the mesh has no such axis)."""
    return dict(self.mesh_pairs).get(axis, 1)

  def has_axis(self, axis):
    return axis in dict(self.mesh_pairs)


Dim = collections.namedtuple("Dim", ["name", "size"])


class NamedDims(collections.namedtuple(
    "NamedDims", ["heads_k", "heads", "heads_v", "d_k", "d_v", "groups"])):
  """attention.AttentionDims without mtf: Dims named as the layers name them.

  Grouped: per-group heads sizes and a "groups" Dim.
  """

  @property
  def project_logits(self):
    return self.heads_k.name != self.heads.name

  @property
  def project_weights(self):
    return self.heads.name != self.heads_v.name


def named_dims(spec, d_model=None):
  """The NamedDims of an AttentionSpec (general bilinear: d_k = d_v =
  d_model, one heads dim)."""
  sizes = spec.dim_sizes()
  g = spec.groups or 1

  def heads(name, total):
    return Dim(name if name in sizes else "heads", total // g)

  d_k = spec.d_k if spec.d_k is not None else d_model
  d_v = spec.d_v if spec.d_v is not None else d_model
  return NamedDims(heads("heads_k", spec.heads_k), heads("heads", spec.heads),
                   heads("heads_v", spec.heads_v), Dim("d_k", d_k),
                   Dim("d_v", d_v),
                   Dim("groups", spec.groups) if spec.groups else None)


def heads_parallel_layout(dims, mesh_axis="model"):
  """The heads-parallel rules that keep every attention weight sharded.

  grouped: groups:<axis>; else heads_k, then heads_v, each unless a weight
  already pairs it with a dim on the axis (P_l[h_k, h], P_w[h, h_v] may not
  have both dims on one axis): multi-head heads:model, talking heads
  heads_k:model;heads_v:model, project logits heads_k:model, project
  weights heads:model.
  """
  if dims.groups is not None:
    return [(dims.groups.name, mesh_axis)]
  pairs = [(dims.heads_k.name, dims.heads.name),
           (dims.heads.name, dims.heads_v.name)]
  chosen = []
  for d in (dims.heads_k, dims.heads_v):
    if d.name in chosen:
      continue
    if any(d.name in pair and set(pair) & set(chosen) for pair in pairs):
      continue
    chosen.append(d.name)
  return [(name, mesh_axis) for name in chosen]


def attention_elements(strategy_name, spec, d_model, n, m, batch, model_axis,
                       batch_axis=1):
  """Elements one device sends for one attention layer of a model.

  predict on the mesh batch:<batch_axis>;model:<model_axis> with the
  heads-parallel layout (heads_parallel_layout, the batch on `batch`): what
  step_time.py charges per attention layer (strategy "heads_parallel") and
  the planner and Auto's pricing per strategy.  With P the model axis,
  X = b n d and A_h = b n m h, heads-parallel sends
    multi-head, general bilinear: 4 (P-1)/P X    (all-reduce of Y and dX)
    talking heads:     4 (P-1)/P (X + A_h)   (+ L forward, dW backward)
    project logits: 4 (P-1)/P X + 2 (P-1)/P A_h; project weights the same
      with A_hv = b n m h_v (U = W P_w is all-reduced).
    grouped talking heads (groups:model): 4 (P-1)/P X, as multi-head.
  (docs/sharding.md; `mtf_th comm` measures it, tests/measure/test_perf_comm.py
  checks it.)  Dynamic terms add no heads-parallel collective (R is split
  like J or U).

  Args:
    strategy_name: a strategy_table name.
    spec: the layer's AttentionSpec (model.Attention).
    d_model, n, m: model size, query and memory lengths.
    batch: the examples of one data-parallel group.
    model_axis: P, the size of the `model` axis (1: nothing is sent).
    batch_axis: the size of the `batch` axis.
  Returns:
    elements per device (0 on a model axis of 1).
  """
  if model_axis == 1:
    return 0
  dims = named_dims(spec, d_model)
  mesh = Layout("batch:%d;model:%d" % (batch_axis, model_axis),
                [(BATCH, "batch")] + heads_parallel_layout(dims))
  return predict(strategy_name, dims, mesh, batch * batch_axis, n, d_model,
                 spec.dynamic, "model", m)


def batch_query_factors(mesh, axis, batch):
  """(p_b, p_q): the axis (size P) split gcd(batch per group, P) x the rest."""
  p = mesh.axis_size(axis)
  outer_axis = mesh.axis_of(BATCH)
  per_group = batch // (mesh.axis_size(outer_axis) if outer_axis else 1)
  p_b = math.gcd(per_group, p)
  return p_b, p // p_b



class _Sizes(object):
  """Per-group tensor sizes of one attention layer (docs/sharding.md).

  A group is the devices of one position on the mesh axes other than the
  strategy's: X, Q, K, V, O and the n x m x heads tensors are divided by
  the size of the axis the batch is split on (if any); weights are whole.
  Grouped talking heads (g groups of per-group heads h_k, h, h_v): the
  tensors hold g h_k, g h, g h_v heads, P_l and P_w g h_k h and g h h_v.
  """

  def __init__(self, dims, mesh, axis, batch, length, d_model,
               dynamic=(), memory_length=None):
    batch_axis = mesh.axis_of(BATCH)
    self.groups = mesh.axis_size(batch_axis) if batch_axis else 1
    b = batch // self.groups
    n, m = length, memory_length or length
    g = dims.groups.size if dims.groups is not None else 1
    hk, h, hv = dims.heads_k.size, dims.heads.size, dims.heads_v.size
    ghk, gh, ghv = g * hk, g * h, g * hv  # all heads, over the groups
    self.p = mesh.axis_size(axis)
    self.x = b * n * d_model
    self.q = b * n * ghk * dims.d_k.size
    self.k = b * m * ghk * dims.d_k.size
    self.v = b * m * ghv * dims.d_v.size
    self.o = b * n * ghv * dims.d_v.size
    self.a = {name: b * n * m * size for name, size in
              ((dims.heads_k.name, ghk), (dims.heads.name, gh),
               (dims.heads_v.name, ghv))}
    self.b = b
    self.weights = {"p_q": d_model * ghk * dims.d_k.size,
                    "p_k": d_model * ghk * dims.d_k.size,
                    "p_v": d_model * ghv * dims.d_v.size,
                    "p_o": d_model * ghv * dims.d_v.size}
    self.p_l = ghk * h if dims.project_logits else 0
    self.p_w = gh * hv if dims.project_weights else 0
    self.r = {"x2l": b * n * ghk * h, "m2l": b * m * ghk * h,
              "x2w": b * n * gh * hv, "m2w": b * m * gh * hv}
    self.r_weights = {"x2l": d_model * ghk * h, "m2l": d_model * ghk * h,
                      "x2w": d_model * gh * hv, "m2w": d_model * gh * hv}
    self.dynamic = tuple(dynamic)


def ring_elements(strategy_name, dims, mesh_shape, layout, batch, length,
                  d_model, dynamic=(), mesh_axis="model", memory_length=None):
  """Elements one device sends for one attention layer, forward + backward.

  Ring costs (all-reduce 2 (P-1)/P S, all-gather and reduce-scatter
  (P-1)/P S, all-to-all (P-1)/P^2 S, for S elements within a group of P)
  of the collectives over the strategy's mesh axis that the layer's
  activations and weights need; the terms are docs/sharding.md's
  ("The strategies, on paper"), written per tensor so that any heads
  layout is priced.  What every strategy sends alike (the data-parallel
  all-reduce of weight gradients over a batch axis, the rest of the model)
  is left out, so predictions rank strategies; tests/strategies/test_auto.py checks
  that they differ from mtf's counters by one constant per configuration.

  Args:
    strategy_name: a strategy_table name.
    dims: attention.AttentionDims of the layer (or spec.named_dims).
    mesh_shape, layout: as Strategy.check (the strategy's rules included).
    batch, length: batch size and sequence length (n = m).
    d_model: the model dimension.
    dynamic: the layer's dynamic terms (subset of x2l, m2l, x2w, m2w).
    mesh_axis: the strategy's mesh axis.
    memory_length: m, if not the sequence length (attention over the
      encoder output).
  Returns:
    float: elements per device (x 4 for float32 bytes).
  """
  return predict(strategy_name, dims, Layout(mesh_shape, layout), batch,
                 length, d_model, dynamic, mesh_axis, memory_length)


def predict(strategy_name, dims, mesh, batch, length, d_model, dynamic,
            mesh_axis, memory_length):
  """ring_elements on a Layout (or mesh_layout.MeshLayout)."""
  if strategy_name not in strategy_table.ROWS:
    raise ValueError("strategy: no formula for %r; choose from %s"
                     % (strategy_name, ", ".join(strategy_table.NAMES)))
  if (dims.groups is not None and
      strategy_name != strategy_table.HEADS_PARALLEL):
    raise ValueError(
        "strategy %r: no formula for grouped talking heads (dim %r), which "
        "runs heads-parallel: lay out %s:%s and use heads_parallel"
        % (strategy_name, dims.groups.name, dims.groups.name, mesh_axis))
  if not mesh.has_axis(mesh_axis):
    return 0.0
  z = _Sizes(dims, mesh, mesh_axis, batch, length, d_model, dynamic,
             memory_length)
  p = z.p
  f = (p - 1.0) / p

  def on(d):
    return mesh.axis_of(d.name) == mesh_axis

  # a tensor is split on the axis by its heads dim or, grouped, by `groups`
  # (then P_l, P_w and J, L, W, U are split alike: no collective mixes them)
  grouped = dims.groups is not None and on(dims.groups)
  kq, kh, kv = [on(d) or grouped
                for d in (dims.heads_k, dims.heads, dims.heads_v)]
  if strategy_name == "batch_split_gathered":
    gathered = sum(z.weights.values()) + z.p_l + z.p_w + sum(
        z.r_weights[t] for t in z.dynamic)
    return 2 * f * z.x + 2 * f * gathered
  # Y = O P_o all-reduced if h_v is split; dX of the Q, K (h_k split) and
  # V (h_v split) paths: one all-reduce if all are split (they sum lazily),
  # else one per split path
  total = 2 * f * z.x if kv else 0.0
  if kq and kv:
    total += 2 * f * z.x
  else:
    total += 2 * f * z.x * (2 * kq + kv)
  if strategy_name == "heads_parallel":
    if dims.project_logits:
      if kq and not kh:
        total += 2 * f * z.a[dims.heads.name]      # L = J P_l
      if kh and not kq:
        total += 2 * f * z.a[dims.heads_k.name]    # dJ = dL P_l^T
    if dims.project_weights:
      if kh and not kv:
        total += 2 * f * z.a[dims.heads_v.name]    # U = W P_w
      if kv and not kh:
        total += 2 * f * z.a[dims.heads.name]      # dW = dU P_w^T
    return total
  query = strategy_name.startswith("query_split")
  scatter = strategy_name != "query_split_allgather"
  p_q = 1  # copies of a tensor without the query length (batch_query_split)
  if strategy_name == "batch_query_split":
    p_q = batch_query_factors(mesh, mesh_axis, batch)[1]

  def with_split(size, split_here, copies=1):
    # cut S (after `copies` broadcast copies): all-to-all each way if split
    # on the axis, else a free split whose gradient is an all-gather
    size *= copies
    return 2 * f * size / p if split_here else f * size

  def without_split(size, split_here, lead=1):
    # needed whole on every shard: gathered (reduce-scatter form: each way
    # (P-1)/P S; plain: all-gather, gradient all-reduced at lead x S);
    # renamed for free if not split, its gradient all-reduced
    if not split_here:
      return 2 * f * size * lead
    return 2 * f * size if scatter else f * size + 2 * f * size * lead

  total += with_split(z.q, kq) + with_split(z.o, kv)
  if query:
    total += without_split(z.k, kq) + without_split(z.v, kv)
  else:
    total += with_split(z.k, kq, p_q) + with_split(z.v, kv, p_q)
  lead = 1 if scatter else (z.b if query else z.b // p)
  # P_l, P_w split on the axis are used whole inside the core, where the
  # batch is also split over the other axes (size G): their gradients are
  # summed over those at h^2 per device, not h^2 / P as heads-parallel does
  g = (z.groups - 1.0) / z.groups
  if dims.project_logits:
    total += without_split(z.p_l, kq or kh, lead)
    total += 2 * g * z.p_l * (1 - 1.0 / p) * (kq or kh)
  if dims.project_weights:
    total += without_split(z.p_w, kh or kv, lead)
    total += 2 * g * z.p_w * (1 - 1.0 / p) * (kh or kv)
  for term in z.dynamic:
    split_here = on(dims.heads_k if term.endswith("l") else dims.heads_v) \
        or on(dims.heads)
    if term.startswith("x"):
      total += with_split(z.r[term], split_here)
    elif not query:
      total += with_split(z.r[term], split_here, p_q)
    else:
      total += without_split(z.r[term], split_here)
  return total
