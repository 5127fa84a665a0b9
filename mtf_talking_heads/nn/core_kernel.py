"""Which kernel computes a strategy's core: the fused op, or mtf einsums.

kernels.ordered_core computes O from Q, K, V either as mtf einsums (J, L,
W, U each an mtf tensor: the einsum core) or, where it applies, as one mtf
operation, FusedCore, whose every slice calls the fused C++ op of nn/fused
(ops.attention_core: O over blocks of queries, keeping for its gradient only
per-(query, head) softmax statistics: O(n h) memory, not J, W, U).  One gin
switch picks (gin/mtf_th.gin):

  mtf_th.core_kernel.kind = "auto"    # fused where it applies and loads
  mtf_th.core_kernel.kind = "fused"   # fused, or a one-line error
  mtf_th.core_kernel.kind = "einsum"  # the einsum core everywhere

It applies per call, to any strategy's per-slice core, when the core's
slices are independent: no dynamic projections (R tensors per query or
key), no attention dropout while training, float32 or float64 activations
(not bfloat16), a query length (not decoding one position at a time),
memory_length whole and, with talking-heads projections, every heads dim
whole on the mesh (the split strategies' cores always have them whole), on
CPU (not in a TPU program).  Where it does not apply, or the op cannot be
built or loaded, the einsum core runs and stderr says why in one line, once
per process and reason; under "fused" that is a ValueError (decoding one
position at a time excepted: it runs the einsum core).  A FusedCore lowered
by a mesh implementation other than PlacementMeshImpl (TPU's SimdMeshImpl,
for a graph built outside a TPU program) runs nn/fused/reference.py's
einsums per slice, never the C++ op.

Example (talking heads, batch 2, h = 4, n = m = 8, d = 16):
  o = fused_or_none(q, k, v, memory_length, dims, p_l, p_w, bias=bias)
  # q: [batch, length, heads_k, d_k] ... o: [batch, heads_v, length, d_v]
"""
import contextlib
import sys

import gin
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import binding_checks
from mtf_talking_heads.nn import fused_op

KINDS = binding_checks.CORE_KERNEL_KINDS  # checked as text before TensorFlow
_NOTED = set()  # reasons already written to stderr (one line each)
load = fused_op.load
FusedCore = fused_op.FusedCore


@gin.configurable("core_kernel", module="mtf_th")
def core_kernel(kind="auto"):
  """The kernel of the attention core: "auto", "fused" or "einsum".

  Args:
    kind: "auto": the fused op where it applies and loads, else the einsum
      core (one line on stderr says why); "fused": the fused op, or a
      ValueError naming why not; "einsum": always the einsum core.
  Returns:
    kind.
  Raises:
    ValueError: kind is none of KINDS.
  """
  if kind not in KINDS:
    raise ValueError("mtf_th.core_kernel.kind: unknown %r; choose \"auto\", "
                     "\"fused\" or \"einsum\"" % (kind,))
  return kind


@contextlib.contextmanager
def bound(kind):
  """mtf_th.core_kernel.kind = kind while the block builds graphs, then the
  binding it had (benchmarks and tests build both kernels in one process).

  Example:
    with core_kernel.bound("einsum"):
      run = harness.Harness(...)
  """
  key = "mtf_th.core_kernel.kind"
  try:
    old = gin.query_parameter(key)
  except ValueError:
    old = None
  with gin.unlock_config():
    gin.bind_parameter(key, kind)
  try:
    yield
  finally:
    with gin.unlock_config():
      gin.bind_parameter(key, "auto" if old is None else old)


def in_tpu_program():
  """Whether the graph being built is a TPU computation (TPUEstimator calls
  mtf's model function inside tpu.replicate): there the einsum core runs."""
  try:
    from tensorflow.python.tpu import tpu_replication  # pylint: disable=g-import-not-at-top
    return tpu_replication._enclosing_tpu_context_and_graph()[0] is not None  # pylint: disable=protected-access
  except (ImportError, AttributeError, ValueError):  # ValueError: not inside
    return False


def fused_error(reason):
  """The one-line error of kind "fused" where the fused core cannot run."""
  return ValueError(
      "mtf_th.core_kernel.kind = \"fused\", but the fused attention core "
      "cannot run: %s; set mtf_th.core_kernel.kind = \"auto\" (the einsum "
      "core where the fused one cannot run) or \"einsum\"" % reason)


def note(reason):
  """Writes "the einsum core runs: reason" to stderr once per reason."""
  if reason in _NOTED:
    return
  _NOTED.add(reason)
  print("[attention core] einsum, not fused: %s" % reason, file=sys.stderr,
        flush=True)


def refusal(dynamic=(), dropout=False, dtype=tf.float32, decoding=False,
            split=()):
  """Why the fused core cannot run a call (None: it can), before loading.

  Args:
    dynamic: the layer's dynamic terms (or R tensors).
    dropout: attention dropout while training.
    dtype: the activations' dtype.
    decoding: the queries are one position (incremental decoding).
    split: (dim name, mesh axis, why) of dims the layout splits that the
      fused core cannot take.
  Returns:
    a short reason, or None.
  """
  if dynamic:
    return "dynamic projections (their R tensors vary per query or key)"
  if dropout:
    return "attention dropout in training (dropout_rate > 0)"
  if tf.as_dtype(dtype) not in (tf.float32, tf.float64):
    return ("%s activations (the fused op takes float32 or float64)"
            % tf.as_dtype(dtype).name)
  if decoding:
    return "decoding one position at a time"
  for name, axis, why in split:
    return "dim %r split over mesh axis %r (%s)" % (name, axis, why)
  return None


def split_refusals(dims, memory_length, layout):
  """[(dim name, mesh axis, why)] of the layout's splits the fused core
  refuses: memory_length, and with projections any heads dim.

  Args:
    dims: the core's attention.AttentionDims.
    memory_length: the m Dimension.
    layout: anything with axis_of(name) (a MeshLayout), or None (unsplit).
  """
  if layout is None:
    return []

  def split_on(name):  # an axis of size 1 splits nothing
    axis = layout.axis_of(name)
    return axis if axis and layout.axis_size(axis) > 1 else None

  out = []
  axis = split_on(memory_length.name)
  if axis:
    out.append((memory_length.name, axis, "the softmax runs over it"))
  if dims.project_logits or dims.project_weights:
    for d in (dims.heads_k, dims.heads, dims.heads_v):
      axis = split_on(d.name)
      if axis and (d.name, axis) not in [o[:2] for o in out]:
        out.append((d.name, axis, "talking-heads projections mix heads "
                    "across devices"))
  return out


def check_before_graph(layers, mesh=None, dtype=tf.float32, train=True,
                       tpu=False, batch=1, length=1):
  """Under kind "fused": raises where a layer's core cannot run fused.

  What is known before a graph: the op loads, not a TPU, no dynamic
  projections, no attention dropout while training, no bfloat16
  activations and (the layer's strategy's core_layout) no split
  memory_length or split heads with projections.  Auto's choice is priced here without the
  model's memory, so a graph may still pick otherwise; its core then
  raises the same error.

  Args:
    layers: the model's attention layers (others are skipped: general
      bilinear attention has no Q, K, V core).
    mesh: a MeshLayout (None: one device).
    dtype: the activation dtype.
    train: a training run (dropout applies).
    tpu: a TPU run.
    batch, length: the batch and sequence length (Auto's choice).
  Raises:
    ValueError: fused_error(reason), one line.
  """
  if core_kernel() != "fused":
    return
  if tpu:
    raise fused_error("the fused op runs on CPU, not on a TPU (--tpu)")
  for layer in layers:
    strategy = getattr(layer, "strategy", None)
    if strategy is None or not hasattr(layer, "dims"):
      continue
    layout = None if mesh is None else strategy.core_layout(
        layer.dims, mesh, batch, length)
    reason = refusal(layer.dynamic, train and layer.dropout_rate > 0, dtype,
                     split=split_refusals(layer.dims, mtf.Dimension(
                         "memory_length", length), layout))
    if reason is not None:
      raise fused_error("%s in %s" % (reason, type(layer).__name__))
  if load()[0] is None:
    raise fused_error(load()[1])


def memory_kernel(hardware):
  """The kernel memory.predict prices a graph's attention layers with, as
  fused_or_none will build them: "fused" on CPU outside a TPU program when
  mtf_th.core_kernel.kind is "fused", or "auto" and the op loads (memory.py
  then fuses only the layers the op applies to); else "einsum".

  Example:
    with core_kernel.bound("einsum"):
      assert core_kernel.memory_kernel("cpu") == "einsum"
  """
  kind = core_kernel()
  if hardware != "cpu" or kind == "einsum" or in_tpu_program():
    return "einsum"
  return "fused" if kind == "fused" or load()[0] is not None else "einsum"


def fused_or_none(q, k, v, memory_length, dims, p_l=None, p_w=None,
                  dynamic_l=(), dynamic_w=(), bias=None, dropout_fn=None,
                  layout=None):
  """O by the fused op if it applies and loads; else None (einsum core).

  Args:
    q, k, v, memory_length, dims, p_l, p_w, dynamic_l, dynamic_w, bias,
    dropout_fn: as kernels.ordered_core.
    layout: the MeshLayout the core is laid out by (None: unsplit).
  Returns:
    O[lead..., groups, h_v, n..., d_v] (mtf), or None: run the einsum core
    (stderr has said why, once).
  Raises:
    ValueError: kind "fused" where the fused core cannot run.
  """
  kind = core_kernel()
  if kind == "einsum":
    return None
  shape = _Shapes(q, k, memory_length, dims)
  reason = refusal(list(dynamic_l) + list(dynamic_w), dropout_fn is not None,
                   q.dtype, not shape.query,
                   split_refusals(dims, memory_length, layout))
  if reason is None:
    reason = shape.refusal(v, [p for p in (p_l, p_w) if p is not None],
                           bias)
  if reason is None and in_tpu_program():
    reason = "a TPU program (the fused op runs on CPU)"
  if reason is None and v.dtype != q.dtype:
    reason = "V is %s, Q %s" % (v.dtype.name, q.dtype.name)
  if reason is None:
    reason = load()[1] if load()[0] is None else None
  if reason is not None:
    if kind == "fused" and shape.query:
      raise fused_error(reason)
    note(reason)
    return None
  inputs, roles = [q, k, v], ["q", "k", "v"]
  for role, t in ([("p_l", p_l), ("p_w", p_w)] +
                  [("bias", t) for t in bias_terms(bias)]):
    if t is not None:
      inputs.append(t if t.dtype == q.dtype else mtf.cast(t, q.dtype))
      roles.append(role)
  return FusedCore(inputs, roles, shape).outputs[0]


def bias_terms(bias):
  """The addends of `bias` (mtf's add_n of masks and the relative bias),
  or [bias]; [] for None.  FusedCore takes them apart, so that its gradient
  keeps them (e.g. a mask [b, n, m] and a bias [h, n, m]) and adds them
  again, not their sum [b, h, n, m]."""
  if bias is None:
    return []
  op = bias.operation
  if type(op) is mtf.AddOperation and all(  # pylint: disable=unidiomatic-typecheck
      x.dtype.is_floating for x in op.inputs):
    return [t for x in op.inputs for t in bias_terms(x)]
  return [bias]


class _Shapes(object):
  """The core's dims by role, as ordered_core names them.

  lead: the batch-like dims Q and K share (the op's B), groups: [groups]
  or [] (G), query: Q's dims K lacks (N), besides the heads, d_k, d_v and
  memory_length dims.
  """

  def __init__(self, q, k, memory_length, dims):
    self.dims, self.memory_length = dims, memory_length
    heads = (dims.heads_k, dims.heads, dims.heads_v)
    skip = heads + (dims.d_k, dims.d_v, memory_length) + tuple(
        dims.group_dims)
    self.groups = list(dims.group_dims)
    self.lead = [d for d in q.shape.dims if d in k.shape.dims and
                 d not in skip]
    self.query = [d for d in q.shape.dims if d not in k.shape.dims and
                  d not in skip]
    self.extra_k = [d for d in k.shape.dims if d not in q.shape.dims and
                    d not in skip]
    self.o_dims = (self.lead + self.groups + [dims.heads_v] + self.query +
                   [dims.d_v])

  def refusal(self, v, ps, bias):
    """Why these shapes do not fit the op (None: they do); ps: P_l, P_w."""
    if self.extra_k:
      return "K has dims Q lacks (%s)" % ", ".join(
          d.name for d in self.extra_k)
    missing = [d.name for d in self.lead if d not in v.shape.dims]
    if missing:
      return "V lacks dims Q and K share (%s)" % ", ".join(missing)
    known = self.lead + self.groups + [self.dims.heads_v, self.dims.d_v,
                                       self.memory_length]
    other = [d.name for d in v.shape.dims if d not in known]
    if other:
      return "V has dims K lacks (%s)" % ", ".join(other)
    for p in ps:
      other = [d.name for d in p.shape.dims if d not in self.lead + self.groups
               + [self.dims.heads_k, self.dims.heads, self.dims.heads_v]]
      if other:
        return "P_l or P_w has dims Q and K lack (%s)" % ", ".join(other)
    known = (self.lead + self.groups + [self.dims.heads] + self.query +
             [self.memory_length])
    for term in bias_terms(bias):
      other = [d.name for d in term.shape.dims if d not in known]
      if other:
        return "the bias has dims the core lacks (%s)" % ", ".join(other)
    return None

  def splittable(self):
    """Names of the dims a slice may have cut (the rest must be whole)."""
    names = {d.name for d in self.lead + self.groups + self.query}
    names.add(self.dims.d_v.name)
    if not (self.dims.project_logits or self.dims.project_weights):
      names.add(self.dims.heads.name)
    return names
