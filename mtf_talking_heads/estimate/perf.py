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
  docs/sharding.md derives and `mtf_th comm` measures.

Example (the paper's T5, 12 heads of d_k = 64, on 32 TPU v3 cores):

  >>> model = paper_model(heads=12, d_k=64, variant="multi_head")
  >>> r = predict(model, "tpu_v3", mesh_shape="batch:32", impl="mtf")
  >>> round(r["step_s"], 3), round(r["compute_s"], 3)
  (0.096, 0.054)

Everything is per device: an mtf device, a TensorCore on TPU v3, a chip on
v4 (megacore) and v5e.  The TPU figures are public specifications
(docs/costs.md cites each); `cpu` is measured on this machine by
benchmarks/calibrate_cpu.py (stored in perf_cpu.py).
"""
import collections
import os

from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.core import gin_text as gin_reader

# ---------------------------------------------------------------------------
# Hardware.

Efficiency = collections.namedtuple("Efficiency",
                                    ["matmul", "memory", "network"])
Efficiency.__doc__ = """Fractions of the peak figures an op reaches.

matmul: of peak_flops in a compute-bound einsum; memory: of the HBM
bandwidth in a memory-bound op; network: of the ICI bandwidth.
"""
# The three factors of the model, fixed a priori (not fitted): a well-shaped
# bf16 matmul on a TPU reaches about half of peak once the MXU pipeline
# fill, padding and the vector work around it are paid; streaming ops reach
# most of the HBM bandwidth; collectives most of the link bandwidth.
DEFAULT_EFFICIENCY = Efficiency(matmul=0.5, memory=0.8, network=0.8)


Hardware = collections.namedtuple("Hardware", [
    "name", "peak_flops", "hbm_bytes_per_s", "ici_bytes_per_s",
    "devices_per_chip", "mxu", "source", "efficiency"])
Hardware.__doc__ = """Per-device figures (an mtf device).

Attributes:
  name: the --hardware name.
  peak_flops: peak dense matmul FLOP/s (bf16 on TPU; float32 on cpu).
  hbm_bytes_per_s: memory bandwidth.
  ici_bytes_per_s: ring bandwidth of a collective, per device.
  devices_per_chip: mtf devices per chip (the chip figures are divided).
  mxu: side of the systolic matrix unit (128 on TPU v2-v5e): an einsum's
    contraction is padded to a multiple of it (1: no padding).
  source: where the figures come from.
  efficiency: the Efficiency predict() uses by default (peak figures need
    DEFAULT_EFFICIENCY; measured ones, as cpu's, are already achieved).
"""


def _tpu(name, chip_flops, chip_hbm, pod_allreduce, pod_chips, devices,
         source):
  """A TPU entry from per-chip figures; ICI = the pod's all-reduce
  bandwidth shared by its chips; MXU 128 x 128 (cloud.google.com/tpu/docs/
  system-architecture-tpu-vm)."""
  return Hardware(name, chip_flops / devices, chip_hbm / devices,
                  pod_allreduce / pod_chips / devices, devices, 128, source,
                  DEFAULT_EFFICIENCY)


_TPU_HARDWARE = (
    # TPU v2 (Jouppi et al. 2020, "A Domain Specific Supercomputer for
    # Training Deep Neural Networks", CACM 63(7), Table 3; cloud.google.com/
    # tpu/docs/v2 points there): 46 TFLOP/s bf16 and 700 GB/s HBM per chip,
    # 16 GiB HBM per chip (8 GiB per TensorCore), two TensorCores per chip,
    # 256-chip pods; ICI 4 links x 496 Gbit/s against v3's 4 x 656: the
    # all-reduce bandwidth is v3's per chip scaled by 496/656.
    _tpu("tpu_v2", 46e12, 700e9, 340e12 / 1024 * 256 * 496 / 656, 256, 2,
         "Jouppi et al. 2020 (CACM), Table 3"),
    # https://cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16 and HBM2
    # 900 GBps per chip, all-reduce 340 TB/s per 1024-chip pod; two
    # TensorCores per chip, each an mtf device.
    _tpu("tpu_v3", 123e12, 900e9, 340e12, 1024, 2,
         "cloud.google.com/tpu/docs/v3"),
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 1200 GBps, all-reduce
    # 1.1 PB/s per 4096-chip pod; megacore: one device per chip.
    _tpu("tpu_v4", 275e12, 1200e9, 1.1e15, 4096, 1,
         "cloud.google.com/tpu/docs/v4"),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 819 GBps,
    # all-reduce 51.2 TB/s per 256-chip pod (= half of the 400 GBps
    # bidirectional ICI per chip); one TensorCore per chip.
    _tpu("tpu_v5e", 197e12, 819e9, 51.2e12, 256, 1,
         "cloud.google.com/tpu/docs/v5e"),
)


def _cpu_hardware():
  from mtf_talking_heads.estimate import perf_cpu  # pylint: disable=g-import-not-at-top
  c = perf_cpu.CPU
  # Logical CPU devices exchange data through memory: "ICI" = memory.
  return Hardware("cpu", c["matmul_flops"], c["memory_bytes_per_s"],
                  c["memory_bytes_per_s"], 1, 1,
                  "benchmarks/calibrate_cpu.py, %s" % c["measured"],
                  Efficiency(1.0, 1.0, 1.0))


def hardware_names():
  return tuple(h.name for h in _TPU_HARDWARE) + ("cpu",)


def get_hardware(name):
  """The Hardware called `name`.

  Raises:
    ValueError: naming --hardware and the valid names.
  """
  if isinstance(name, Hardware):
    return name
  for h in _TPU_HARDWARE:
    if h.name == name:
      return h
  if name == "cpu":
    return _cpu_hardware()
  raise ValueError("--hardware %r is unknown; choose one of: %s"
                   % (name, ", ".join(hardware_names())))


# ---------------------------------------------------------------------------
# Implementations: what the step's code stores and computes.

Implementation = collections.namedtuple("Implementation", [
    "name", "activation_bytes", "core_bytes", "state_bytes",
    "dynamic_einsums"])
Implementation.__doc__ = """How the step's code stores and computes things.

Attributes:
  activation_bytes: bytes per activation element (2: bfloat16).
  core_bytes: bytes per element of the n x m x heads tensors (J, L, W, U).
  state_bytes: bytes per parameter element in the optimizer update (float32
    variables and gradients).
  dynamic_einsums: how many n x m einsums a talking-heads projection with
    dynamic terms runs: "mtf" (mtf 0.1.x, which the paper used: the static
    projection is added to the first dynamic term, one einsum per dynamic
    term; this project's layers fold the same way, attention.fold_dynamic,
    costs.py's default count), "separate" (one per term plus the static one:
    the appendix A pseudocode, costs.py's fold_dynamic="none") or "folded"
    (one: costs.py's fold_dynamic="paper", the paper's multiplies column).
"""
IMPLEMENTATIONS = {
    # mesh_tensorflow 0.1.x layers on TPU as the paper ran them: bfloat16
    # activations, softmax in bfloat16 too (docs/tpu.md, stack README).
    "mtf": Implementation("mtf", 2, 2, 4, "mtf"),
    # this project's layers on TPU: bfloat16 activations, float32 logits
    # and softmax (docs/tpu.md), dynamic terms folded as mtf folds them.
    "mtf_th": Implementation("mtf_th", 2, 4, 4, "mtf"),
    # this project's layers in float32 (the CPU runs: activation_dtype
    # float32 in gin/mtf_th.gin).
    "mtf_th_float32": Implementation("mtf_th_float32", 4, 4, 4, "mtf"),
}

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
# The model.

Attention = spec_lib.AttentionSpec  # groups: grouped_talking_heads only
Model = collections.namedtuple("Model", [
    "kind", "num_layers", "d_model", "d_ff", "vocab", "batch",
    "inputs_length", "targets_length", "enc_self", "dec_self", "encdec",
    "relative_bias", "optimizer", "shared_layers"])
Model.__doc__ = """A whole transformer, as its gin files configure it.

Attributes:
  kind: "bitransformer" (encoder + decoder), "lm" (decoder only, on
    targets_length) or "encoder" (encoder only, on inputs_length).
  num_layers: layers per stack.
  d_model, d_ff, vocab: sizes (embedding shared with the softmax).
  batch: sequences per step (whole mesh).
  inputs_length, targets_length: sequence lengths.
  enc_self, dec_self, encdec: the Attention of each placement (None where
    the model has none).
  relative_bias: True if self-attention adds a T5 relative position bias.
  optimizer: a key of OPTIMIZER_PASSES.
  shared_layers: True if the layers of a stack share their weights (ALBERT):
    the work is per layer, the parameters (optimizer, all-reduce) once.
"""
KINDS = ("bitransformer", "lm", "encoder")
PLACEMENTS = ("enc_self", "dec_self", "encdec")
# The attention placements each kind of model has.
KIND_PLACEMENTS = {"bitransformer": PLACEMENTS, "lm": ("dec_self",),
                   "encoder": ("enc_self",)}


def make_attention(variant, heads, d_k=None, d_v=None, heads_k=None,
                   heads_v=None, dynamic=(), groups=None):
  """An Attention, validated by costs.resolve_config.

  variant "dynamic_projections" is talking heads with `dynamic` terms; d_v
  defaults to d_k; groups: the head groups of grouped_talking_heads.
  """
  d_v = d_k if d_v is None else d_v
  if variant == spec_lib.DYNAMIC:
    if not dynamic:
      raise ValueError("variant 'dynamic_projections' needs dynamic terms "
                       "(a subset of %s)" % ", ".join(costs.DYNAMIC_TERMS))
    variant = spec_lib.TALKING_HEADS
  if variant == spec_lib.BILINEAR:
    d_k = d_v = None  # d_model, known only with the model
  # d_model and length do not matter to these checks: any valid value
  cfg = costs.resolve_config(variant, heads_k, heads, heads_v, d_k, d_v,
                             d_model=d_k or 1, length=1, dynamic=dynamic,
                             groups=groups)
  return Attention(variant, cfg["heads_k"], cfg["heads"], cfg["heads_v"],
                   d_k if variant != spec_lib.BILINEAR else None,
                   d_v if variant != spec_lib.BILINEAR else None,
                   cfg["dynamic"], cfg["groups"])


def make_model(kind, num_layers, d_model, d_ff, vocab, batch, inputs_length,
               targets_length, enc_self=None, dec_self=None, encdec=None,
               relative_bias=True, optimizer="adafactor",
               shared_layers=False):
  """A validated Model (see Model's attributes)."""
  if kind not in KINDS:
    raise ValueError("kind=%r is unknown; choose one of: %s"
                     % (kind, ", ".join(KINDS)))
  for name, value in (("num_layers", num_layers), ("d_model", d_model),
                      ("d_ff", d_ff), ("vocab", vocab), ("batch", batch),
                      ("inputs_length", inputs_length),
                      ("targets_length", targets_length)):
    spec_lib.positive_int(name, value)
  if optimizer not in OPTIMIZER_PASSES:
    raise ValueError("optimizer=%r is not modelled; choose one of: %s"
                     % (optimizer, ", ".join(OPTIMIZER_PASSES)))
  needed = KIND_PLACEMENTS[kind]
  given = dict(enc_self=enc_self, dec_self=dec_self, encdec=encdec)
  for name in needed:
    if not isinstance(given[name], Attention):
      raise ValueError("a %s model needs an Attention for %s" % (kind, name))
  return Model(kind, num_layers, d_model, d_ff, vocab, batch, inputs_length,
               targets_length, *(given[n] if n in needed else None
                                 for n in PLACEMENTS),
               relative_bias=bool(relative_bias), optimizer=optimizer,
               shared_layers=bool(shared_layers))


# The paper's T5 (section 7.1): 12 + 12 layers, d_model 768, d_ff 3072,
# batch 128 x (512 inputs, 114 targets); T5's SentencePiece vocabulary of
# 32000 pieces + 100 sentinels, padded by mtf to a multiple of 128.
PAPER_T5 = dict(kind="bitransformer", num_layers=12, d_model=768, d_ff=3072,
                vocab=32128, batch=128, inputs_length=512,
                targets_length=114)


def paper_model(heads, d_k=None, variant=spec_lib.MULTI_HEAD, heads_k=None,
                heads_v=None, d_v=None, dynamic=(), placement="all"):
  """The paper's T5 with one attention configuration.

  placement "all" puts it in every attention layer; "enc_self", "dec_self"
  or "encdec" in that kind only, multi-head (same heads, d_k, d_v)
  elsewhere (Table 4, tab:dp_enc_only).
  """
  d_v = d_k if d_v is None else d_v
  att = make_attention(variant, heads, d_k, d_v, heads_k, heads_v, dynamic)
  mh = make_attention(spec_lib.MULTI_HEAD, heads, d_k or PAPER_T5["d_model"],
                      d_v or PAPER_T5["d_model"])
  if placement != "all" and placement not in PLACEMENTS:
    raise ValueError("placement=%r is unknown; choose all or one of %s"
                     % (placement, ", ".join(PLACEMENTS)))
  chosen = {p: att if placement in ("all", p) else mh for p in PLACEMENTS}
  return make_model(**dict(PAPER_T5, **chosen))


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


def _product(xs):
  out = 1
  for x in xs:
    out *= x
  return out


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


def _stacks(model):
  """[(stack, length, [(placement, memory length)])] of the model."""
  n_in, n_out = model.inputs_length, model.targets_length
  if model.kind == "encoder":
    return [("encoder", n_in, [("enc_self", n_in)])]
  if model.kind == "lm":
    return [("decoder", n_out, [("dec_self", n_out)])]
  return [("encoder", n_in, [("enc_self", n_in)]),
          ("decoder", n_out, [("dec_self", n_out), ("encdec", n_in)])]


def _positions(model):
  """Positions per example that get a softmax over the vocabulary."""
  return model.inputs_length if model.kind == "encoder" else \
      model.targets_length


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
  for stack, n, layers in _stacks(model):
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
  rows = batch * _positions(model)
  ops += _matmul("logits", "logits", (1, rows, d, model.vocab), rows * d * e,
                 model.vocab * d * e, rows * model.vocab * e)
  ops += _elementwise("logits", "loss", ELEMENTWISE_PASSES["loss"],
                      rows * model.vocab * e)
  return ops


def parameter_count(model):
  """Learned parameters: attention (costs.py), feed-forward, norms,
  relative-position biases, the shared embedding."""
  d = model.d_model
  total = model.vocab * d
  for _, _, layers in _stacks(model):
    per_layer = 2 * d * model.d_ff + d  # FFN + its norm
    for placement, _ in layers:
      att = getattr(model, placement)
      terms = costs.attention_terms(att.variant, att.heads_k, att.heads,
                                    att.heads_v, att.d_k, att.d_v, d, 1,
                                    dynamic=att.dynamic, groups=att.groups)
      per_layer += sum(_product(s) for s in terms["params"].values()) + d
    copies = 1 if model.shared_layers else model.num_layers
    total += per_layer * copies + d  # + final norm
    if model.relative_bias:
      total += 32 * getattr(model, layers[0][0]).heads  # 32 buckets, shared
  return total


def optimizer_ops(params, impl, optimizer="adafactor"):
  """The optimizer's update of `params` parameter elements."""
  return _elementwise("optimizer", optimizer, OPTIMIZER_PASSES[optimizer],
                      params * impl.state_bytes)


# ---------------------------------------------------------------------------
# Mesh and ring bytes.

def parse_mesh(mesh_shape):
  """{"batch": B, "model": P} from "batch:4,model:8" (either may be absent).

  Raises:
    ValueError: naming --mesh_shape.
  """
  sizes = {"batch": 1, "model": 1}
  for item in spec_lib.split_rules(mesh_shape):
    try:
      (name, size), = spec_lib.parse_mesh_shape(item)
    except ValueError:
      name = None
    if name not in sizes:
      raise ValueError(
          "--mesh_shape %r: %r is not NAME:SIZE with NAME batch or model and "
          "a positive SIZE (e.g. batch:16 or batch:2,model:8)"
          % (mesh_shape, item))
    sizes[name] = size
  return sizes


def _replicated_core(att):
  """True if heads-parallel leaves the softmax whole on every device:
  variants that mix heads (h_k / h_v split, h whole).  Grouped talking
  heads is laid out groups:model: split like multi-head."""
  return att.mixes_heads


def attention_ring_elements(att, d_model, n, m, batch, model_axis):
  """Elements sent per device by one heads-parallel attention layer.

  prices.heads_parallel_elements: the strategy's own price (docs/sharding.md,
  which `mtf_th comm` measures; tests/test_perf.py checks it against its
  measured figures).  With P the model axis, X = b n d and A_h = b n m h:
    multi-head, general bilinear: 4 (P-1)/P X    (all-reduce of Y and dX)
    talking heads:     4 (P-1)/P (X + A_h)   (+ L forward, dW backward)
    project logits: 4 (P-1)/P X + 2 (P-1)/P A_h; project weights the same
      with A_hv = b n m h_v (U = W P_w is all-reduced).
    grouped talking heads (groups:model): 4 (P-1)/P X, as multi-head.
  Dynamic terms add no collective here (R is split like J or U).
  """
  return prices.heads_parallel_elements(att, d_model, n, m, batch,
                                        model_axis)


def model_ring_elements(model, batch, model_axis):
  """Activation elements sent per device on the model axis for one step:
  attention (above), feed-forward (d_ff split: all-reduce of its output and
  of dX) and the vocabulary-split embedding and softmax (all-reduce of the
  embedded inputs forward, of dX of the logits backward)."""
  p = model_axis
  if p == 1:
    return 0
  f = (p - 1) / p
  d = model.d_model
  total = 0
  for _, n, layers in _stacks(model):
    rows = batch * n
    layer = 4 * f * rows * d
    for placement, m in layers:
      layer += attention_ring_elements(getattr(model, placement), d, n, m,
                                       batch, p)
    total += layer * model.num_layers + 2 * f * rows * d
  total += 2 * f * batch * _positions(model) * d
  return total


def _split(op, model_axis, replicated):
  if model_axis == 1 or replicated:
    return op
  return op._replace(flops=op.flops / model_axis, bytes=op.bytes / model_axis)


# ---------------------------------------------------------------------------
# Prediction.

def _check_efficiency(eff):
  for name, value in zip(Efficiency._fields, eff):
    if not isinstance(value, (int, float)) or not 0 < value <= 1:
      raise ValueError("--%s_efficiency (Efficiency.%s) must be in (0, 1], "
                       "got %r" % (name, name, value))


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


def _implementation(impl):
  if isinstance(impl, Implementation):
    return impl
  if impl not in IMPLEMENTATIONS:
    raise ValueError("--implementation %r is unknown; choose one of: %s"
                     % (impl, ", ".join(IMPLEMENTATIONS)))
  return IMPLEMENTATIONS[impl]


def _check_mesh(model, mesh, mesh_shape):
  """Batch divisible by the batch axis; split dims by the model axis."""
  if model.batch % mesh["batch"]:
    raise ValueError("batch %d is not divisible by the mesh's batch axis "
                     "(%d); choose a --mesh_shape whose batch size divides "
                     "it" % (model.batch, mesh["batch"]))
  p = mesh["model"]
  split = [("d_ff", model.d_ff), ("vocab", model.vocab)]
  for placement in PLACEMENTS:
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
    att = getattr(model, op.part) if op.part in PLACEMENTS else None
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
    hardware: a name from hardware_names() (or a Hardware).
    mesh_shape: "batch:B,model:P": B data-parallel groups (each gets
      batch / B examples, gradients all-reduced over B) of P devices that
      split heads, d_ff and the vocabulary (heads-parallel layout).
    impl: a key of IMPLEMENTATIONS (or an Implementation).
    efficiency: an Efficiency (None: the hardware's own).

  Returns:
    dict: step_s = compute_s + memory_s + network_s, where compute_s sums
    the ops bound by FLOPs and memory_s those bound by bytes; flops, bytes
    and ring_bytes per device; params; parts = {part: seconds}.
    E.g. predict(paper_model(12, 64), "tpu_v3", "batch:32")["step_s"] is
    0.096 (s).

  Raises:
    ValueError: naming the bad argument (before anything is computed).
  """
  hw = get_hardware(hardware)
  if not isinstance(model, Model):
    raise ValueError("model must be a Model (make_model / paper_model / "
                     "model_from_gin), got %r" % (model,))
  impl = _implementation(impl)
  efficiency = efficiency or hw.efficiency
  _check_efficiency(efficiency)
  mesh = parse_mesh(mesh_shape)
  _check_mesh(model, mesh, mesh_shape)
  batch, p = model.batch // mesh["batch"], mesh["model"]
  params = parameter_count(model)
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


# ---------------------------------------------------------------------------
# Reading a model from gin files (text only: no TensorFlow, gin's global
# configuration untouched).

# utils.run.model_type -> Model kind; a delimited_lm (a decoder-only model
# fine-tuned text-to-text) is an lm over "<inputs> EOS <targets> EOS".
_MODEL_TYPES = {"bitransformer": "bitransformer", "lm": "lm",
                "delimited_lm": "lm", "aligned": "encoder"}
_PLACEMENT_MACROS = ("enc_self_attention", "dec_self_attention",
                     "encdec_attention")


def _placement_variant(ref, where):
  name = ref.name.split(".")[-1] if isinstance(ref, gin_reader.Reference) \
      else None
  for variant in spec_lib.VARIANTS:
    if name in spec_lib.layer_class_names(variant):
      return variant
  raise ValueError("%s = %r is not an mtf_th attention class (one of %s)"
                   % (where, ref, ", ".join(
                       "mtf_th." + v.layer for v in spec_lib.VARIANT_TABLE)))


# optimizer classes (utils.run.optimizer) -> OPTIMIZER_PASSES key
_OPTIMIZER_CLASSES = {"AdafactorOptimizer": "adafactor",
                      "BertAdamOptimizer": "adam", "LambOptimizer": "lamb"}


def _optimizer(ref, where):
  if ref is None:
    return "adafactor"  # mtf_th.gin's
  name = ref.name.split(".")[-1] if isinstance(ref, gin_reader.Reference) \
      else None
  if name not in _OPTIMIZER_CLASSES:
    raise ValueError("%s: utils.run.optimizer = %r is not modelled; perf "
                     "knows %s" % (where, ref, ", ".join(_OPTIMIZER_CLASSES)))
  return _OPTIMIZER_CLASSES[name]


def model_from_gin(gin_files, gin_params=(), vocab=PAPER_T5["vocab"],
                   gin_dir=None):
  """The Model that `mtf_th train` would build from these gin files.

  Reads the macros num_layers, d_model, d_ff, batch_size, inputs_length,
  targets_length, heads_k, heads, heads_v, d_k, d_v, dynamic,
  relative_attention_type and the placement macros (enc_self_attention,
  dec_self_attention, encdec_attention), and the binding
  utils.run.model_type.  The vocabulary comes from the task, not from gin:
  `vocab` (default T5's 32128).

  Raises:
    ValueError: a missing file or macro, naming it.
  """
  from mtf_talking_heads.core import gin_paths  # pylint: disable=g-import-not-at-top
  gin_dir = gin_dir or gin_paths.gin_dir()
  config = gin_reader.GinConfig(gin_files, gin_params, gin_dir)
  return model_from_config(config, ", ".join(gin_files) or "the gin files",
                           vocab)


def model_from_config(config, where, vocab=PAPER_T5["vocab"]):
  """model_from_gin's Model from a gin_text.GinConfig (or an object that
  answers its binding, get, require and `in`); `where` names it in errors."""

  def get(name):
    return config.require(name, where)

  model_type = config.binding("utils.run.model_type", "bitransformer")
  if model_type not in _MODEL_TYPES:
    raise ValueError("%s: utils.run.model_type = %r is not one of %s"
                     % (where, model_type, ", ".join(_MODEL_TYPES)))
  kind = _MODEL_TYPES[model_type]
  dims = dict(heads=get("heads"), d_k=get("d_k"), d_v=get("d_v"),
              heads_k=get("heads_k"), heads_v=get("heads_v"),
              dynamic=tuple(get("dynamic") or ()))
  placements = {}
  for macro in _PLACEMENT_MACROS:
    if macro not in config:
      continue
    variant = _placement_variant(get(macro), macro)
    kw = dict(dims)
    v = spec_lib.VARIANT[variant]
    if not v.project_logits:  # tied to heads
      kw.update(heads_k=None)
    if not v.project_weights:
      kw.update(heads_v=None)
    if variant != spec_lib.DYNAMIC:
      kw.update(dynamic=())
    if variant == spec_lib.GROUPED:
      kw.update(groups=get("groups"))
    try:
      placements[macro.split("_attention")[0]] = make_attention(variant, **kw)
    except ValueError as e:
      raise ValueError("%s: %s: %s" % (where, macro, e)) from None
  needed = KIND_PLACEMENTS[kind]
  lengths = [get(name) if name in config or uses else 1 for name, uses in (
      ("inputs_length", kind != "lm"), ("targets_length", kind != "encoder"))]
  if model_type == "delimited_lm":  # one sequence: inputs, then targets
    lengths[1] += get("inputs_length")
  return make_model(
      kind, get("num_layers"), get("d_model"), get("d_ff"), vocab,
      get("batch_size"), lengths[0], lengths[1],
      relative_bias=get("relative_attention_type") is not None,
      optimizer=_optimizer(config.binding("utils.run.optimizer"), where),
      shared_layers=config.binding(
          "transformer.make_layer_stack.block_scope") is False,
      **{k: v for k, v in placements.items() if k in needed})


def model_dim_names(model):
  """The dim names a layout may split in `model`: spec.MODEL_DIMS, the
  split strategies' core_shard and each placement's attention dims."""
  names = set(spec_lib.MODEL_DIMS) | {spec_lib.CORE_SHARD}
  for placement in PLACEMENTS:
    att = getattr(model, placement)
    if att is not None:
      names.update(att.dim_sizes())
  return sorted(names)


def check_gin_layout(gin_files, gin_params, model, gin_dir=None):
  """The `layout` macro of the gin files, if any, names the axes batch or
  model and dims of `model` (spec.check_layout_names).

  perf prices the heads-parallel layout on --mesh_shape's batch and model
  axes whatever the files lay out; a misspelt rule is refused, not ignored.
  """
  from mtf_talking_heads.core import gin_paths  # pylint: disable=g-import-not-at-top
  config = gin_reader.GinConfig(gin_files, gin_params,
                                gin_dir or gin_paths.gin_dir())
  layout = config.get("layout")
  if isinstance(layout, str):
    spec_lib.check_layout_names(
        spec_lib.parse_layout(layout), spec_lib.STANDARD_MESH_AXES,
        model_dim_names(model), what="layout %r:" % layout)


def row_label(gin_files, gin_params=(), gin_dir=None):
  """The experiment's row_label macro ("" if the files define none)."""
  from mtf_talking_heads.core import gin_paths  # pylint: disable=g-import-not-at-top
  return gin_reader.GinConfig(gin_files, gin_params,
                              gin_dir or gin_paths.gin_dir()).get(
                                  "row_label", "")


def experiment_rows(table, vocab=PAPER_T5["vocab"], gin_dir=None):
  """[(row name, row_label, Model)] of gin/experiments/<table>/*.gin.

  Raises:
    ValueError: an unknown table, naming --paper_table and the valid ones.
  """
  from mtf_talking_heads.core import gin_paths  # pylint: disable=g-import-not-at-top
  gin_dir = gin_dir or gin_paths.gin_dir()
  root = os.path.join(gin_dir, "experiments")
  names = sorted(d for d in os.listdir(root)
                 if os.path.isdir(os.path.join(root, d)))
  if table not in names:
    raise ValueError("--paper_table %r is unknown; choose one of: %s"
                     % (table, ", ".join(names)))
  rows = []
  for filename in sorted(os.listdir(os.path.join(root, table))):
    if not filename.endswith(".gin"):
      continue
    rel = "experiments/%s/%s" % (table, filename)
    rows.append((filename[:-4], row_label([rel], gin_dir=gin_dir),
                 model_from_gin([rel], vocab=vocab, gin_dir=gin_dir)))
  return rows


# ---------------------------------------------------------------------------
# The paper's step times: the "step time (s)" column of its T5 tables
# (section 7.1 Tables 1-4, Appendix A.1), by experiment file of
# gin/experiments/<table>/.  None: the paper prints no time (Raffel et al.).

PAPER_STEP_TIMES = collections.OrderedDict([
    ("t5_heads", ("Table 1 (tab:t5)", collections.OrderedDict([
        ("01_multi_head_6_128", 0.14), ("02_multi_head_12_64", 0.15),
        ("03_multi_head_24_32", 0.17), ("04_multi_head_48_16", 0.21),
        ("05_talking_heads_6_128", 0.16), ("06_talking_heads_12_64", 0.18),
        ("07_talking_heads_24_32", 0.22), ("08_talking_heads_48_16", 0.32),
        ("09_multi_head_24_64", 0.22), ("10_general_bilinear_12", 0.47),
        ("11_raffel2019", None)]))),
    ("t5_heads_dims", ("Table 2 (tab:t5_2)", collections.OrderedDict([
        ("01_talking_heads_6_128", 0.16),
        ("02_talking_heads_6_24_6_128_128", 0.18),
        ("03_talking_heads_24_6_24_32_32", 0.20),
        ("04_talking_heads_6_24_24_128_32", 0.20),
        ("05_talking_heads_24_24_6_32_128", 0.21),
        ("06_talking_heads_24_32", 0.22)]))),
    ("t5_logits_weights", ("Table 3 (tab:t5_3)", collections.OrderedDict([
        ("01_multi_head_24_32", 0.17), ("02_project_logits_24", 0.23),
        ("03_project_weights_24", 0.23), ("04_talking_heads_24_32", 0.22)]))),
    ("t5_enc_dec", ("Table 4 (tab:t5_4)", collections.OrderedDict([
        ("01_multi_head_24_32", 0.17), ("02_th_enc_self", 0.21),
        ("03_th_dec_self", 0.17), ("04_th_encdec", 0.18),
        ("05_talking_heads_24_32", 0.22)]))),
    ("dp", ("Appendix A.1 (tab:dp)", collections.OrderedDict([
        ("01_multi_head_12_64", 0.15), ("02_talking_heads_12_64", 0.18),
        ("03_dp_all_12", 0.36), ("04_multi_head_24_32", 0.17),
        ("05_talking_heads_24_32", 0.22), ("06_dp_all_24", 0.53)]))),
    ("dp_individual", ("Appendix A.1 (tab:dp_individual)",
                       collections.OrderedDict([
                           ("01_talking_heads_12_64", 0.18),
                           ("02_dp_x2l_12", 0.19), ("03_dp_x2w_12", 0.19),
                           ("04_dp_m2l_12", 0.24), ("05_dp_m2w_12", 0.25),
                           ("06_dp_all_12", 0.36)]))),
    ("dp_enc_only", ("Appendix A.1 (tab:dp_enc_only)",
                     collections.OrderedDict([
                         ("01_multi_head_24_32", 0.17),
                         ("02_th_enc_self", 0.21),
                         ("03_dp_enc_self", 0.42)]))),
])
# The reference row of every comparison: Table 1's 12-head multi-head row.
PAPER_REFERENCE = ("t5_heads", "02_multi_head_12_64")

# What the comparison assumes of the paper's runs (docs/costs.md): a TPU v3
# slice of 32 TensorCores (v3-32), data parallel as mtf's defaults.gin
# (model_parallelism = 1): 4 of the 128 sequences per core; mtf 0.1.x layers.
PAPER_HARDWARE = "tpu_v3"
PAPER_MESH = "batch:32"
PAPER_IMPLEMENTATION = "mtf"


def compare_paper(table, hardware=PAPER_HARDWARE, mesh_shape=PAPER_MESH,
                  impl=PAPER_IMPLEMENTATION, efficiency=None):
  """Predicted vs printed step times of one paper table.

  Both as ratios to the reference row (PAPER_REFERENCE: Table 1's 12-head
  multi-head row, 0.15 s), since the paper does not name its slice.

  Returns:
    [dict(row, label, paper_s, paper_ratio, predicted_s, predicted_ratio,
    error)], error = predicted_ratio / paper_ratio - 1 (None where the paper
    prints no time).
  Raises:
    ValueError: a table without printed step times, naming the valid ones.
  """
  if table not in PAPER_STEP_TIMES:
    raise ValueError("--paper_table %r has no step times in the paper; "
                     "--compare_paper works with: %s"
                     % (table, ", ".join(PAPER_STEP_TIMES)))
  ref_table, ref_row = PAPER_REFERENCE
  ref_model = dict((name, model) for name, _, model in
                   experiment_rows(ref_table))[ref_row]
  ref_s = predict(ref_model, hardware, mesh_shape, impl, efficiency)["step_s"]
  ref_paper = PAPER_STEP_TIMES[ref_table][1][ref_row]
  out = []
  for name, label, model in experiment_rows(table):
    result = predict(model, hardware, mesh_shape, impl, efficiency)
    paper_s = PAPER_STEP_TIMES[table][1].get(name)
    row = dict(row=name, label=label, paper_s=paper_s,
               paper_ratio=None if paper_s is None else paper_s / ref_paper,
               predicted_s=result["step_s"],
               predicted_ratio=result["step_s"] / ref_s, error=None,
               result=result)
    if paper_s is not None:
      row["error"] = row["predicted_ratio"] / row["paper_ratio"] - 1
    out.append(row)
  return out
