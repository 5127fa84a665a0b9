"""FusedCore: the fused attention core as one mtf operation per slice.

nn/core_kernel.py decides where the fused core runs; this module is the
operation it builds: FusedCore (forward: the C++ op of nn/fused on each
device slice, with its softmax statistics) and FusedCoreGrad (the op's
gradient on the inputs prepared again, summed over the mesh axes an input
is whole on), and load(), which loads the op once per process.

Example (talking heads, one device, shapes of core_kernel._Shapes):
  o = FusedCore([q, k, v, p_l, p_w], ["q", "k", "v", "p_l", "p_w"],
                shapes).outputs[0]    # O[batch, heads_v, length, d_v]
"""
import functools

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

NAME = "fused_attention_core"
_LOADED = []  # [(_OpFunctions or None, reason)] once loaded


def load():
  """(the op's functions or None, reason): loads (building when needed)
  the fused op once per process; the reason is one line when it cannot.

  The functions: forward(q, k, v, p_l, p_w, bias, bias_grad) -> (O, lse)
  (ops.fused_core_with_stats) and grad(q, k, v, p_l, p_w, bias, lse, dO,
  bias_grad) -> (dQ, dK, dV, dP_l, dP_w, dbias) (the op
  FusedAttentionCoreGrad; absent inputs None, their gradients unused).
  """
  if not _LOADED:
    try:
      from mtf_talking_heads.nn.fused import ops  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      _LOADED.append((None, "the fused op's module cannot be imported (%s)"
                      % e))
    else:
      module, reason = ops.load()
      _LOADED.append((None if module is None else _OpFunctions(ops, module),
                      reason))
  return _LOADED[0]


class _OpFunctions(object):
  """The fused op's forward (with its statistics) and gradient."""

  def __init__(self, ops, module):
    self._ops, self._module = ops, module

  def forward(self, q, k, v, p_l=None, p_w=None, bias=None, bias_grad=False):
    return self._ops.fused_core_with_stats(q, k, v, p_l, p_w, bias,
                                           bias_grad)

  def grad(self, q, k, v, p_l, p_w, bias, lse, d_o, bias_grad=False):
    def given(x):
      return tf.zeros([0], q.dtype) if x is None else x
    return self._module.fused_attention_core_grad(
        q, k, v, given(p_l), given(p_w), given(bias), lse, d_o,
        has_p_l=p_l is not None, has_p_w=p_w is not None,
        has_bias=bias is not None, bias_grad=bool(bias_grad))


class _Reference(object):
  """nn/fused/reference.py's einsums with the op's forward signature (its
  statistics are not computed: TF differentiates the einsums)."""

  def forward(self, q, k, v, p_l=None, p_w=None, bias=None, bias_grad=False):
    del bias_grad
    from mtf_talking_heads.nn.fused import reference  # pylint: disable=g-import-not-at-top
    return reference.core(q, k, v, p_l, p_w, bias), None


def _trainable(t):
  """Whether mtf tensor t depends on a variable (T5's relative bias)."""
  seen, todo = set(), [t]
  while todo:
    op = todo.pop().operation
    if id(op) in seen:
      continue
    seen.add(id(op))
    if isinstance(op, mtf.Variable):
      return True
    todo.extend(op.inputs)
  return False


def _ordered(x, names, order):
  """tf slice x (dims named `names`) transposed to `order` (a subset of
  names; the others must be of size 1 and are dropped)."""
  rest = [n for n in names if n not in order]
  perm = [names.index(n) for n in order + rest]
  if perm != list(range(len(names))):
    x = tf.transpose(x, perm)
  if rest:
    x = tf.reshape(x, x.shape.as_list()[:len(order)])
  return x


def _product(values):
  out = 1
  for v in values:
    out *= v
  return out


class FusedCore(mtf.Operation):
  """O = the attention core of Q, K, V (P_l, P_w, bias), one op per slice.

  Each slice's Q, K, V are transposed to the op's layouts ([B, G, Hk, N,
  Dk] ...; B the product of the lead dims' slice sizes, N of the query
  dims'), P_l, P_w to [G, Hk, H], [G, H, Hv] and the bias terms, added, to
  [Bb, Hb, N, M] (ops.attention_core's contract, nn/fused/reference.py);
  O comes back in the core's dims, and with it the op's log-sum-exp of
  each softmax row ([lead, groups, heads, query]: the gradient's only
  statistics).  The gradient (FusedCoreGrad) calls the op's gradient on
  the same inputs prepared again once dO exists, so between the passes the
  slices keep Q, K, V, P, the bias terms and the log-sum-exp, nothing of
  n x m x heads (unless a bias term has those dims).

  Args:
    inputs: [Q, K, V], those of P_l, P_w that exist, and the bias terms.
    roles: their names ("q", "k", "v", "p_l", "p_w", "bias").
    shapes: the call's _Shapes.
  """

  def __init__(self, inputs, roles, shapes):
    super().__init__(inputs, name=NAME)
    self.roles, self.shapes = roles, shapes
    dims = shapes.dims
    # a bias term with a variable among its inputs (T5's relative bias)
    self.trainable = [r != "bias" or _trainable(t)
                      for r, t in zip(roles, inputs)]
    self.bias_grad = any(t for r, t in zip(roles, self.trainable)
                         if r == "bias")
    lse = shapes.lead + shapes.groups + [dims.heads] + shapes.query
    self._outputs = [
        mtf.Tensor(self, mtf.Shape(shapes.o_dims), inputs[0].dtype),
        mtf.Tensor(self, mtf.Shape(lse), inputs[0].dtype, index=1)]
    self._splittable_dims, self._unsplittable_dims = (
        self._initialize_splittable_and_unsplittable_dims(
            "unsplittable", sorted(shapes.splittable())))

  def core_shapes(self):
    """The n x m x heads shapes its slices compute blockwise (J, L/W, U):
    what measure/comm.py reports as the core's slices."""
    s = self.shapes
    return [mtf.Shape(s.lead + s.groups + [h] + s.query + [s.memory_length])
            for h in (s.dims.heads_k, s.dims.heads, s.dims.heads_v)]

  def gradient(self, grad_ys):
    grads = FusedCoreGrad(self, grad_ys[0]).outputs
    return [g if wanted else None
            for g, wanted in zip(grads, self.trainable)]

  def check_layout(self, mesh_impl):
    """Raises ValueError if the layout cuts a dim a slice needs whole."""
    allowed = self.shapes.splittable()
    for t in self.inputs + self.outputs:
      layout = mesh_impl.tensor_layout(t).tensor_axis_to_mesh_axis
      for d, axis in zip(t.shape.dims, layout):
        if (axis is not None and d.name not in allowed and
            mesh_impl.shape.dims[axis].size > 1):
          raise ValueError(
              "the fused attention core needs dim %r whole on every device, "
              "but the layout splits it over mesh axis %r; set "
              "mtf_th.core_kernel.kind = \"einsum\" for this layout"
              % (d.name, mesh_impl.shape.dims[axis].name))
    lead = {d.name for d in self.shapes.lead}
    for role, t in zip(self.roles, self.inputs):
      local = mesh_impl.slice_shape(t.shape)
      if role.startswith("p_") and _product(
          n for d, n in zip(t.shape.dims, local) if d.name in lead) != 1:
        raise ValueError(
            "the fused attention core takes one %s per slice, but %s has "
            "more on a slice; set mtf_th.core_kernel.kind = \"einsum\""
            % (role, t.shape))

  @staticmethod
  def functions(mesh_impl):
    """The per-slice op (load()'s), or on another mesh implementation than
    PlacementMeshImpl (TPU's SimdMeshImpl) nn/fused/reference.py's
    einsums, differentiated by TF."""
    if isinstance(mesh_impl, mtf.placement_mesh_impl.PlacementMeshImpl):
      return load()[0]
    return _Reference()

  def prepare(self, slices):
    """The op's inputs from one slice of each input: {"q": [B, G, Hk, N,
    Dk], "k", "v", "p_l": [G, Hk, H], "p_w", "bias": [Bb, Hb, N, M]} (absent
    ones None)."""
    s = self.shapes
    dims = s.dims
    lead = [d.name for d in s.lead]
    groups = [d.name for d in s.groups]
    query = [d.name for d in s.query]
    m = s.memory_length.name
    nl, ng = len(lead), len(groups)

    def as5(x, names, heads, rows, last):
      x = _ordered(x, names, lead + groups + [heads] + rows + [last])
      sizes = x.shape.as_list()
      return tf.reshape(x, [_product(sizes[:nl]),
                            _product(sizes[nl:nl + ng]), sizes[nl + ng],
                            _product(sizes[nl + ng + 1:-1]), sizes[-1]])

    def projection(x, names, a, b):
      x = _ordered(x, names, groups + [a, b])
      sizes = x.shape.as_list()
      return tf.reshape(x, [_product(sizes[:-2])] + sizes[-2:])

    out = dict(p_l=None, p_w=None, bias=None)
    sizes, terms = {}, []
    for role, t, x in zip(self.roles, self.inputs, slices):
      names = [d.name for d in t.shape.dims]
      sizes.update(zip(names, x.shape.as_list()))
      if role == "q":
        out["q"] = as5(x, names, dims.heads_k.name, query, dims.d_k.name)
      elif role == "k":
        out["k"] = as5(x, names, dims.heads_k.name, [m], dims.d_k.name)
      elif role == "v":
        out["v"] = as5(x, names, dims.heads_v.name, [m], dims.d_v.name)
      elif role == "p_l":
        out["p_l"] = projection(x, names, dims.heads_k.name, dims.heads.name)
      elif role == "p_w":
        out["p_w"] = projection(x, names, dims.heads.name, dims.heads_v.name)
      else:
        terms.append((x, names))
    if terms:
      out["bias"] = self._bias(terms, sizes)
    return out

  def _bias(self, terms, sizes):
    """The bias terms' slices as one [Bb, Hb, N, M]: each is broadcast to
    the lead, heads and query dims the terms have between them (B or 1, G H
    or 1), then they are added."""
    s = self.shapes
    heads = [d.name for d in s.groups] + [s.dims.heads.name]
    parts = [[d.name for d in s.lead], heads, [d.name for d in s.query],
             [s.memory_length.name]]
    present = {n for _, names in terms for n in names}
    keep = [bool(present & set(part)) or i >= 2  # N and M are always whole
            for i, part in enumerate(parts)]
    want = [sizes[n] if k else 1 for part, k in zip(parts, keep)
            for n in part]
    total = None
    for x, names in terms:
      order = [n for part in parts for n in part if n in names]
      x = tf.reshape(_ordered(x, names, order),
                     [sizes[n] if n in names else 1
                      for part in parts for n in part])
      total = x if total is None else total + x
    if total.shape.as_list() != want:
      total = tf.broadcast_to(total, want)
    out, start = [], 0
    for part in parts:
      out.append(_product(want[start:start + len(part)]))
      start += len(part)
    return tf.reshape(total, out)

  def local_shapes(self, slices):
    """The slice shapes of O and the log-sum-exp for these input slices."""
    sizes = {}
    for t, x in zip(self.inputs, slices):
      sizes.update(zip([d.name for d in t.shape.dims], x.shape.as_list()))
    return [[sizes[d.name] for d in out.shape.dims] for out in self.outputs]

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    self.check_layout(mesh_impl)
    fns = self.functions(mesh_impl)

    def fn(*slices):
      x = self.prepare(slices)
      o, lse = fns.forward(x["q"], x["k"], x["v"], x["p_l"], x["p_w"],
                           x["bias"], bias_grad=self.bias_grad)
      o_shape, lse_shape = self.local_shapes(slices)
      lse = (tf.zeros(lse_shape, o.dtype) if lse is None
             else tf.reshape(lse, lse_shape))
      return tf.reshape(o, o_shape), lse

    o, lse = mesh_impl.slicewise(fn, *[lowering.tensors[x]
                                       for x in self.inputs])
    lowering.set_tensor_lowering(self.outputs[0], o)
    lowering.set_tensor_lowering(self.outputs[1], lse)


class FusedCoreGrad(mtf.Operation):
  """The gradients of a FusedCore's inputs.

  Per slice, once dO exists (a control dependency), the op's inputs are
  prepared again from Q, K, V, P and the bias terms, the op's gradient
  runs on them, the log-sum-exp and dO, and TF carries its dQ ... dbias
  back through the preparation (transposes, the bias terms' sum).  On a
  mesh implementation without the op (FusedCore.functions: the reference
  einsums) TF differentiates the forward slice instead.  A slice's gradient
  of an input that is whole on a mesh axis the core is cut over (P_l, P_w;
  K, V under a query split; a bias term without the batch) is that slice's
  share: it is summed over those axes (an all-reduce), as mtf's einsum
  gradients sum a weight's.
  """

  def __init__(self, forward, do):
    super().__init__(forward.inputs + forward.outputs + [do],
                     name=NAME + "_grad")
    self.forward, self.do = forward, do
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype, index=i)
                     for i, x in enumerate(forward.inputs)]

  def _slice_grads(self, fns, xs, o, lse, do):
    """[d input] of one slice (None where not trainable)."""
    fwd = self.forward
    wanted = [x for x, w in zip(xs, fwd.trainable) if w]
    if isinstance(fns, _Reference):
      grads = tf.gradients(ys=o, xs=wanted, grad_ys=do,
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
    else:
      with tf.control_dependencies([do]):  # not during the forward pass
        p = fwd.prepare(xs)
      g = fns.grad(p["q"], p["k"], p["v"], p["p_l"], p["p_w"], p["bias"],
                   tf.reshape(lse, p["q"].shape.as_list()[:2] +
                              [-1, p["q"].shape.as_list()[3]]),
                   tf.reshape(do, p["v"].shape.as_list()[:3] +
                              p["q"].shape.as_list()[3:4] +
                              p["v"].shape.as_list()[4:]),
                   bias_grad=fwd.bias_grad)
      pairs = [(p[r], g[i]) for i, r in enumerate(
          ("q", "k", "v", "p_l", "p_w", "bias")) if p[r] is not None and (
              r != "bias" or fwd.bias_grad)]
      grads = tf.gradients(ys=[y for y, _ in pairs], xs=wanted,
                           grad_ys=[d for _, d in pairs],
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grads = iter(grads)
    return [next(grads) if w else None for w in fwd.trainable]

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    fwd = self.forward
    fns = fwd.functions(mesh_impl)

    def slices(t):
      return lowering.tensors[t].to_laid_out_tensor().tensor_list

    xs = [slices(x) for x in fwd.inputs]
    o, lse = slices(fwd.outputs[0]), slices(fwd.outputs[1])
    dos = slices(self.do)
    devices = [None] * len(dos)  # SimdMeshImpl: one tensor, the program's
    if isinstance(mesh_impl, mtf.placement_mesh_impl.PlacementMeshImpl):
      devices = mesh_impl.devices
    grads = []
    for i, device in enumerate(devices):
      with tf.device(device):
        grads.append(self._slice_grads(fns, [x[i] for x in xs], o[i],
                                       lse[i], dos[i]))
    used = set()
    for t in fwd.inputs + fwd.outputs:
      used.update(a for a in mesh_impl.tensor_layout(t).tensor_axis_to_mesh_axis
                  if a is not None)
    for j, (x, out) in enumerate(zip(fwd.inputs, self.outputs)):
      laid = mesh_impl.LaidOutTensor(
          [g[j] if g[j] is not None else tf.zeros_like(xs[j][i])
           for i, g in enumerate(grads)])
      own = {a for a in mesh_impl.tensor_layout(x).tensor_axis_to_mesh_axis
             if a is not None}
      whole_on = sorted(used - own)
      if whole_on and fwd.trainable[j]:
        laid = mtf.LazyAllreduceSum(mesh_impl, laid, whole_on,
                                    add_counter_fn=functools.partial(
                                        lowering.add_counter,
                                        "allreduce/%s/fused_core_grad"
                                        % whole_on,
                                        lowering.laid_out_size(out)))
      lowering.set_tensor_lowering(out, laid)
