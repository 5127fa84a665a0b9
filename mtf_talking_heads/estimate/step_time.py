"""Predicted time of one training step of a whole model on named hardware.

Pure Python (no TensorFlow).  A roofline model summed over operations:

  step = sum over ops of max(mxu_flops / (peak * matmul_eff),
                              bytes / (hbm * memory_eff))
         + ring_bytes / (ici * network_eff)

* Ops run one after another on a device (XLA runs one fused kernel at a
  time), so their times add; inside one op the matrix unit and the memory
  system overlap, so an op costs the larger of its two times.  The ring
  bytes of the collectives are added, not overlapped: mtf places its
  all-reduces inside the step's single program, between the ops that need
  them.
* One training step = forward + backward + optimizer update, of every
  layer: embedding lookup, each attention layer (any variant, the n x m x
  heads tensors included), feed-forward, RMS norms and residual adds, the
  output softmax and its loss, and Adafactor's update of every parameter.
* Each einsum counts three times (forward and its two backward einsums),
  2 FLOPs per multiply; the attention multiplies are costs.attention_terms'
  (the paper's section 5 formulas).  On a TPU an einsum whose contraction
  is shorter than the 128-deep matrix unit is charged as if padded to it
  (mxu_flops).
* Memory traffic: each einsum reads its inputs and writes its output once;
  element-wise work is counted in passes over its tensor
  (ELEMENTWISE_PASSES: norms, softmax, loss, optimizer).
* Ring bytes per device: the gradient all-reduce over the data-parallel
  axis, and on a `model` axis the heads-parallel all-reduces whose formulas
  docs/sharding.md derives (prices.attention_elements) and `mtf_th
  comm` measures.

Example (the paper's T5, 12 heads of d_k = 64, on 32 TPU v3 cores):

  >>> model = model_lib.paper_model(heads=12, d_k=64, variant="multi_head")
  >>> r = predict(model, "tpu_v3", mesh_shape="batch:32", impl="mtf")
  >>> round(r["step_s"], 3), round(r["compute_s"], 3)
  (0.096, 0.054)

Everything is per device: an mtf device, a TensorCore on TPU v3, a chip on
v4 (megacore) and v5e (hardware.py: the catalogue and the implementations;
model.py: the Model; prices.py: the collectives' elements).
"""
import collections

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import strategy_table

# HBM passes over the elements of element-wise work, forward + backward
# (reads + writes, counted as XLA fuses them):
ELEMENTWISE_PASSES = {
    # RMS norm: fwd read x, write y; bwd read x, dy, write dx.
    "norm": 5,
    # residual add: fwd read 2, write 1; bwd read 1, write 2.
    "residual": 6,
    # softmax over m: fwd reduce (read L), normalize (read L, write W); bwd
    # reduce (read dW, W), then read dW, W, write dL.
    "softmax": 8,
    # relative position bias: its add is fused into the softmax; its
    # gradient sums dL over the batch (read dL).
    "bias": 1,
    # sum of two n x m x heads einsum outputs (dynamic terms, "separate" and
    # "mtf"): fwd read 2 write 1, bwd the gradient is read once per operand.
    "add": 5,
    # the output softmax cross-entropy (with z-loss) over the vocabulary:
    # fwd reduce + loss (read 2), bwd write the gradient of the logits
    # (read 1, write 1).
    "loss": 4,
    # embedding lookup: fwd write x; bwd read dx (scatter-add).
    "embedding": 2,
}
# HBM passes per parameter element of each optimizer's update (float32):
OPTIMIZER_PASSES = {
    # Adafactor (T5, the paper): read the weight, read the gradient twice
    # (factored second moments, then the update), write the weight.
    "adafactor": 4,
    # BERT's AdamW with global-norm clipping (optimizers.py): read the
    # gradient for its norm, read weight, gradient, m, v, write weight, m, v.
    "adam": 8,
    # LAMB (ALBERT): Adam's passes + the weight and the update read again
    # for the layer-wise trust ratio's norms.
    "lamb": 10,
}
Op = collections.namedtuple("Op", ["part", "name", "flops", "bytes",
                                 "contraction"])
Op.__doc__ = """One op of a step on one device: FLOPs and HBM bytes.

part: "embedding", "enc_self", "dec_self", "encdec", "ffn", "norm",
"logits", "optimizer"; name: the tensor it makes ("J", "dJ/a", ...);
contraction: the size of the dim an einsum sums over (None: element-wise).
"""


# ---------------------------------------------------------------------------
# Ops.

def _matmul(part, name, dims, a, b, c):
  """An einsum C = A.B and its two backward einsums (dA, dB).

  dims: (batch, M, K, N) for A[batch, M, K] . B[batch, K, N]; a, b, c: bytes
  of the operands.  Each of the three einsums costs 2 * batch*M*K*N FLOPs,
  reads its two inputs and writes its output; they contract over K
  (C = A.B), N (dA = dC.B^T) and M (dB = A^T.dC).
  """
  batch, m, k, n = dims
  flops = 2 * batch * m * k * n
  return [Op(part, name, flops, a + b + c, k),
          Op(part, "d%s/a" % name, flops, c + b + a, n),
          Op(part, "d%s/b" % name, flops, a + c + b, m)]


def _elementwise(part, name, passes, nbytes):
  """An element-wise op making `passes` HBM passes over `nbytes` bytes."""
  return [Op(part, name, 0, passes * nbytes, None)]


def _core_einsum_count(n_dynamic, mode):
  """n x m einsums of one talking-heads projection with n_dynamic terms."""
  if mode == "folded" or n_dynamic == 0:
    return 1
  if mode == "mtf":
    return n_dynamic
  return n_dynamic + 1


def _projection(part, out, dynamic, which, heads_in, heads_out, d, n, m, b,
                impl, groups=1):
  """Ops of L = J.P_l (which="l") or U = W.P_w ("w") with dynamic terms.

  Each dynamic term first projects its source (X: n rows, M: m rows) to
  R[rows, heads_in, heads_out]; then impl.dynamic_einsums decides how many
  n x m einsums mix the heads (their outputs are summed).  Grouped talking
  heads mixes within `groups` groups: each einsum is `groups` times as many
  matmuls of heads_in/groups x heads_out/groups.
  """
  e, ec = impl.activation_bytes, impl.core_bytes
  terms = [t for t in dynamic if t[-1] == which]
  mixing = heads_in * heads_out // groups
  block = (heads_in // groups, heads_out // groups)  # one group's P_l / P_w
  ops = []
  for t in terms:
    rows = b * (n if t[0] == "x" else m)
    ops += _matmul(part, "R_" + t, (1, rows, d, mixing), rows * d * e,
                   d * mixing * e, rows * mixing * e)
  count = _core_einsum_count(len(terms), impl.dynamic_einsums)
  src, dst = b * n * m * heads_in * ec, b * n * m * heads_out * ec
  for i in range(count):
    if i < len(terms):  # (static +) R: one projection per row of X or M
      rows, other = (n, m) if terms[i][0] == "x" else (m, n)
      proj, dims = (b * rows * mixing * e,
                    (b * rows * groups, other) + block)
    else:
      proj, dims = mixing * e, (groups, b * n * m) + block
    ops += _matmul(part, "%s%d" % (out, i), dims, src, proj, dst)
  if count > 1:
    ops += _elementwise(part, out + "_sum",
                        ELEMENTWISE_PASSES["add"] * (count - 1), dst)
  return ops


def _bilinear_ops(part, h, d, n, m, b, impl):
  """General bilinear (section 6): XP = X.P, L = XP.M, W, WM = W.M, Y."""
  e, ec = impl.activation_bytes, impl.core_bytes
  x, mem = b * n * d * e, b * m * d * e
  xp, a_h = b * n * d * h * e, b * n * m * h * ec
  return (_matmul(part, "XP", (1, b * n, d, d * h), x, d * d * h * e, xp) +
          _matmul(part, "L", (b * h, n, d, m), xp, mem, a_h) +
          _elementwise(part, "softmax", ELEMENTWISE_PASSES["softmax"], a_h) +
          _matmul(part, "WM", (b * h, n, m, d), a_h, mem, xp) +
          _matmul(part, "Y", (1, b * n, d * h, d), xp, d * d * h * e, x))


def _projected_ops(part, att, terms, d, n, m, b, impl):
  """Q, K, V, J, [L = J.P_l], W, [U = W.P_w], O, Y (sections 3-4, app. A)."""
  hk, h, hv = terms["heads_k"], terms["heads"], terms["heads_v"]
  dk, dv = terms["d_k"], terms["d_v"]
  e, ec = impl.activation_bytes, impl.core_bytes
  x, mem = b * n * d * e, b * m * d * e
  q, k = b * n * dk * hk * e, b * m * dk * hk * e
  v, o = b * m * dv * hv * e, b * n * dv * hv * e
  a_hk, a_h, a_hv = (b * n * m * hk * ec, b * n * m * h * ec,
                     b * n * m * hv * ec)
  has_l, has_w = "P_l" in terms["params"], "P_w" in terms["params"]
  ops = _matmul(part, "Q", (1, b * n, d, dk * hk), x, d * dk * hk * e, q)
  ops += _matmul(part, "K", (1, b * m, d, dk * hk), mem, d * dk * hk * e, k)
  ops += _matmul(part, "V", (1, b * m, d, dv * hv), mem, d * dv * hv * e, v)
  ops += _matmul(part, "J", (b * hk, n, dk, m), q, k, a_hk)
  g = terms["groups"] or 1
  if has_l:
    ops += _projection(part, "L", att.dynamic, "l", hk, h, d, n, m, b, impl,
                       g)
  ops += _elementwise(part, "softmax", ELEMENTWISE_PASSES["softmax"], a_h)
  if has_w:
    ops += _projection(part, "U", att.dynamic, "w", h, hv, d, n, m, b, impl,
                       g)
  ops += _matmul(part, "O", (b * hv, n, m, dv), a_hv if has_w else a_h, v, o)
  ops += _matmul(part, "Y", (1, b * n, dv * hv, d), o, d * dv * hv * e, x)
  return ops


def attention_ops(att, d_model, n, m, batch, impl, part, bias=False):
  """The ops of one attention layer (forward + backward) on `batch` rows.

  Example: multi-head, h = 12, d_k = d_v = 64, d_model = 768, n = m = 512,
  batch 4, impl "mtf": Q, dQ/a, dQ/b, K, ..., J (dims (48, 512, 64, 512):
  2 * 48 * 512 * 64 * 512 FLOPs; bytes 2 * (Q + K + J) = 2 * (1572864 +
  1572864 + 12582912) elements in bfloat16), its dJ/a and dJ/b, softmax (8
  passes over J's 12582912 elements), O and Y with their gradients.

  Args:
    att: an Attention.
    d_model: d_X = d_M = d_Y.
    n, m: query and memory lengths.
    batch: examples on this device.
    impl: an Implementation.
    part: label of the ops.
    bias: add the relative-position-bias gradient pass.
  Returns:
    [Op].
  """
  terms = costs.attention_terms(att.variant, att.heads_k, att.heads,
                                att.heads_v, att.d_k, att.d_v, d_model,
                                max(n, m), dynamic=att.dynamic,
                                fold_dynamic=True, groups=att.groups)
  if att.variant == spec_lib.BILINEAR:
    ops = _bilinear_ops(part, terms["heads"], d_model, n, m, batch, impl)
  else:
    ops = _projected_ops(part, att, terms, d_model, n, m, batch, impl)
  if bias:
    ops += _elementwise(part, "bias", ELEMENTWISE_PASSES["bias"],
                        batch * n * m * terms["heads"] * impl.core_bytes)
  return ops


def ffn_ops(d_model, d_ff, rows, impl):
  """DenseReluDense on `rows` positions: two einsums (ReLU fused)."""
  e = impl.activation_bytes
  x, hidden, w = rows * d_model * e, rows * d_ff * e, d_model * d_ff * e
  return (_matmul("ffn", "H", (1, rows, d_model, d_ff), x, w, hidden) +
          _matmul("ffn", "Y_ff", (1, rows, d_ff, d_model), hidden, w, x))


def _sublayer_ops(rows, d_model, impl):
  """RMS norm before and residual add after one sublayer."""
  x = rows * d_model * impl.activation_bytes
  return (_elementwise("norm", "rms_norm", ELEMENTWISE_PASSES["norm"], x) +
          _elementwise("norm", "residual", ELEMENTWISE_PASSES["residual"], x))


def model_ops(model, batch, impl):
  """Every op of one training step of `model` on `batch` examples.

  These are the ops of one data-parallel group's share of the batch,
  before device_ops splits them over the model axis.

  Returns:
    [Op] (the optimizer's are in optimizer_ops).
  """
  e = impl.activation_bytes
  d = model.d_model
  ops = []
  for stack, n, layers in model_lib.stacks(model):
    rows = batch * n
    ops += _elementwise("embedding", "lookup_" + stack,
                        ELEMENTWISE_PASSES["embedding"], rows * d * e)
    layer = []
    for placement, m in layers:
      att = getattr(model, placement)
      layer += attention_ops(att, d, n, m, batch, impl, placement,
                             bias=model.relative_bias and m == n and
                             placement != "encdec")
      layer += _sublayer_ops(rows, d, impl)
    layer += ffn_ops(d, model.d_ff, rows, impl)
    layer += _sublayer_ops(rows, d, impl)
    ops += layer * model.num_layers
    ops += _elementwise("norm", "final_norm", ELEMENTWISE_PASSES["norm"],
                        rows * d * e)
  rows = batch * model_lib.loss_positions(model)
  ops += _matmul("logits", "logits", (1, rows, d, model.vocab), rows * d * e,
                 model.vocab * d * e, rows * model.vocab * e)
  ops += _elementwise("logits", "loss", ELEMENTWISE_PASSES["loss"],
                      rows * model.vocab * e)
  return ops


def optimizer_ops(params, impl, optimizer="adafactor"):
  """The optimizer's update of `params` parameter elements."""
  return _elementwise("optimizer", optimizer, OPTIMIZER_PASSES[optimizer],
                      params * impl.state_bytes)


# ---------------------------------------------------------------------------
# Ring bytes.

def _replicated_core(att):
  """True if heads-parallel leaves the softmax whole on every device:
  variants that mix heads (h_k / h_v split, h whole).  Grouped talking
  heads is laid out groups:model: split like multi-head."""
  return att.mixes_heads


def model_ring_elements(model, batch, model_axis):
  """Activation elements sent per device on the model axis for one step:
  attention (prices.attention_elements, heads-parallel), feed-forward
  (d_ff split: all-reduce of its output and of dX) and the vocabulary-split
  embedding and softmax (all-reduce of the embedded inputs forward, of dX
  of the logits backward)."""
  p = model_axis
  if p == 1:
    return 0
  f = (p - 1) / p
  d = model.d_model
  total = 0
  for _, n, layers in model_lib.stacks(model):
    rows = batch * n
    layer = 4 * f * rows * d
    for placement, m in layers:
      layer += prices.attention_elements(
          strategy_table.HEADS_PARALLEL, getattr(model, placement), d, n, m,
          batch, p)
    total += layer * model.num_layers + 2 * f * rows * d
  total += 2 * f * batch * model_lib.loss_positions(model) * d
  return total


def _split(op, model_axis, replicated):
  if model_axis == 1 or replicated:
    return op
  return op._replace(flops=op.flops / model_axis, bytes=op.bytes / model_axis)


# ---------------------------------------------------------------------------
# Prediction.

def mxu_flops(op, mxu):
  """The FLOPs an einsum occupies a systolic matrix unit of side `mxu` for.

  The unit is `mxu` multiply-adds deep along the contraction: one that sums
  over K < mxu elements (J = Q.K over d_k = 32, say) leaves mxu - K of them
  idle, so it costs ceil(K / mxu) * mxu / K times its FLOPs.  The other two
  dims stream through and are not padded.
  """
  if not op.contraction or mxu <= 1:
    return op.flops
  k = op.contraction
  return op.flops * (-(-k // mxu) * mxu) / k


def op_seconds(op, hw, eff):
  """(compute time, memory time) of one op; it costs the larger."""
  return (mxu_flops(op, hw.mxu) / (hw.peak_flops * eff.matmul),
          op.bytes / (hw.hbm_bytes_per_s * eff.memory))


def _check_mesh(model, mesh, mesh_shape):
  """Batch divisible by the batch axis; split dims by the model axis."""
  if model.batch % mesh["batch"]:
    raise ValueError("batch %d is not divisible by the mesh's batch axis "
                     "(%d); choose a --mesh_shape whose batch size divides "
                     "it" % (model.batch, mesh["batch"]))
  p = mesh["model"]
  split = [("d_ff", model.d_ff), ("vocab", model.vocab)]
  for placement in model_lib.PLACEMENTS:
    att = getattr(model, placement)
    if att is not None and att.groups:  # laid out groups:model
      split += [("%s groups" % placement, att.groups)]
    elif att is not None:
      split += [("%s heads_k" % placement, att.heads_k),
                ("%s heads_v" % placement, att.heads_v)]
  for name, size in split:
    if size % p:
      raise ValueError("%s (%d) is not divisible by the model axis of "
                       "--mesh_shape %r (%d); choose a model axis that "
                       "divides it" % (name, size, mesh_shape, p))


def device_ops(model, batch, model_axis, impl):
  """The ops of one device: a batch share, split over the model axis.

  Heads-parallel: attention, feed-forward and logits ops are split P ways;
  norms, residuals and the embedding lookup are whole on every device, and
  so are the softmax and bias passes of the variants that mix heads (h_k
  and h_v are split, h is not).
  """
  ops = []
  for op in model_ops(model, batch, impl):
    att = getattr(model, op.part) if op.part in model_lib.PLACEMENTS else None
    replicated = op.part in ("norm", "embedding") or (
        att is not None and _replicated_core(att) and
        op.name in ("softmax", "bias"))
    ops.append(_split(op, model_axis, replicated))
  return ops


def ring_bytes(model, batch, mesh, impl, params):
  """Bytes each device sends: the gradient all-reduce over the batch axis
  (float32 state) + the model axis' activation all-reduces."""
  b_axis, p = mesh["batch"], mesh["model"]
  return (2 * (b_axis - 1) / b_axis * params / p * impl.state_bytes +
          model_ring_elements(model, batch, p) * impl.activation_bytes)


def predict(model, hardware, mesh_shape="batch:1", impl="mtf",
            efficiency=None):
  """Predicted seconds of one training step, per device.

  Args:
    model: a Model.
    hardware: a name from hardware.hardware_names() (or a Hardware).
    mesh_shape: "batch:B,model:P": B data-parallel groups (each gets
      batch / B examples, gradients all-reduced over B) of P devices that
      split heads, d_ff and the vocabulary (heads-parallel layout).
    impl: a key of hardware.IMPLEMENTATIONS (or an Implementation).
    efficiency: an Efficiency (None: the hardware's own).

  Returns:
    dict: step_s = compute_s + memory_s + network_s, where compute_s sums
    the ops bound by FLOPs and memory_s those bound by bytes; flops, bytes
    and ring_bytes per device; params; parts = {part: seconds}.
    E.g. predict(model.paper_model(12, 64), "tpu_v3", "batch:32")["step_s"] is
    0.096 (s).

  Raises:
    ValueError: naming the bad argument (before anything is computed).
  """
  hw = hardware_lib.get_hardware(hardware)
  if not isinstance(model, model_lib.Model):
    raise ValueError("model must be a Model (make_model / paper_model / "
                     "model_from_gin), got %r" % (model,))
  impl = hardware_lib.implementation(impl)
  efficiency = efficiency or hw.efficiency
  hardware_lib.check_efficiency(efficiency)
  mesh = model_lib.parse_mesh(mesh_shape)
  _check_mesh(model, mesh, mesh_shape)
  batch, p = model.batch // mesh["batch"], mesh["model"]
  params = model_lib.parameter_count(model)
  ops = device_ops(model, batch, p, impl) + optimizer_ops(
      params / p, impl, model.optimizer)
  ring = ring_bytes(model, batch, mesh, impl, params)
  compute_s = memory_s = 0.0
  parts = collections.OrderedDict()
  for op in ops:
    t_c, t_m = op_seconds(op, hw, efficiency)
    if t_c >= t_m:
      compute_s += t_c
    else:
      memory_s += t_m
    parts[op.part] = parts.get(op.part, 0.0) + max(t_c, t_m)
  network_s = ring / (hw.ici_bytes_per_s * efficiency.network)
  parts["network"] = network_s
  return dict(step_s=compute_s + memory_s + network_s, compute_s=compute_s,
              memory_s=memory_s, network_s=network_s,
              flops=sum(op.flops for op in ops),
              bytes=sum(op.bytes for op in ops), ring_bytes=ring,
              params=params, parts=parts, hardware=hw.name,
              mesh_shape=mesh_shape, implementation=impl.name)
