"""Predicted memory per device of one training step, by what the step keeps.

Pure Python (no TensorFlow), like costs.py and step_time.py; it reads the
model description of model.py (Model, Attention) and hardware.py's
Implementation:

  peak = weights + gradients + optimizer slots          (float32 state)
       + activations kept for the backward pass         (every layer)
       + the largest temporaries of the backward pass   (one at a time)

* Weights: parameters per device; a tensor with a heads, d_ff or vocab dim
  is split over the `model` axis (the layouts of gin/layouts and
  step_time.py's heads-parallel layout), norms and relative-position biases
  are whole.  Gradients: a weight is updated as soon as its gradient is
  ready (the update ops of mtf's optimizers depend on that gradient only),
  so at the peak, the start of the backward pass, the gradient of the
  largest weight (the shared embedding and softmax, whose gradient the
  backward pass makes first) and its update's temporary are live
  (GRADIENT_COPIES = 2), as the allocator's records on CPU show; not all
  gradients at once.
* Optimizer slots (OPTIMIZER_SLOTS): Adafactor keeps, for a weight whose two
  largest dims are >= 128 (mtf's min_dim_size_to_factor), a row and a
  column vector (shape without the largest dim + shape without the second
  one), else one slot of the weight's size; Adam (BERT) and LAMB (ALBERT)
  keep two slots (m, v) of every weight's size.
* Activations kept for the backward pass, per layer of each stack, in
  activation bytes (hardware.Implementation.activation_bytes) except the
  n x m x heads tensors (core_bytes); X = b n d_model:
    - every sublayer (RMS norm, layer, residual add): 2 X kept by the norm's
      gradient and X for the sublayer's output;
    - attention: Q, K, V, O and the n x m x heads tensors its gradients
      read (CORE_TENSORS): multi-head keeps W (softmax's gradient and dV
      read it); talking heads J (for dP_l), W and U (dP_w, dV); logits
      projection J and W; weights projection W and U.  L is not kept (the
      softmax gradient reads its output).  Dynamic projections add their R
      tensors; general bilinear keeps X.P, W and W.M; dropout adds a mask;
    - feed-forward: the hidden layer before and after the ReLU (2 b n d_ff);
    - per stack: the embedded inputs and their scaled copy (2 X) and the
      final norm (2 X); the logits, b n vocab, once.
* Temporaries: the backward pass starts from the logits' gradient (two
  more b n vocab tensors: the log-sum-exp and its gradient), then walks the
  layers down, each holding the gradients of its n x m x heads tensors
  (two of its largest one at a time) on top of what is still kept; with
  the core recomputed (strategies.RecomputeCore), also the core tensors of
  the one layer being recomputed (what it would keep, and L).
* The fused core (kernel="fused": nn/core_kernel.py's C++ op, where it
  applies: fuses()) keeps no n x m x heads tensor of its own: per layer
  its gradient reads Q, K, V (kept as above), the per-(query, head)
  log-sum-exp of its softmax (b n h) and the terms of the bias it was
  given (fused_bias: the causal mask, n m, once per layer; with packed
  batches masks per example, b n m; T5's relative position bias, h n m, or
  b n m h when packed); its backward pass recomputes J, L, W, U block by
  block, so its temporaries are its gradient op's outputs and accumulators
  (FUSED_GRAD_COPIES Q-sized tensors), a trainable bias term's gradient
  and, when a device has fewer (example, group) pairs than the op has
  threads, a partial dK and dV per extra chunk (fused_grad_chunks); the
  blocks are not counted.
* The layout: on a mesh `batch:B,model:P` each device holds batch / B
  examples; the model axis splits what the layout puts on it (`layout`,
  split_roles; by default step_time.py's: heads_k and heads_v, d_ff,
  vocab).  Heads-parallel talking heads keeps W whole on every device.  The
  split strategies of nn/strategies (strategy_table's memory_core) cut every
  n x m x heads tensor P ways (and
  the query splits keep K and V gathered whole);
  `recompute` keeps no n x m x heads tensor (the core is recomputed in the
  backward pass, one layer at a time).

docs/costs.md ("Memory model") gives the measured check: every prediction
within 20% of TensorFlow's allocator peak on CPU (benchmarks/memory.py,
the median of 3 processes), of a training step (predict) and of an
eval's forward pass (predict_forward, --forward).

Example (the measured 2-layer talking-heads LM of tests/estimate/test_memory.py,
float32 on one CPU):

  >>> att = model_lib.make_attention("talking_heads", 4, 16, heads_k=4,
  ...                                heads_v=4)
  >>> model = model_lib.make_model("lm", 2, 32, 64, 128, 8, 32, 32,
  ...                              dec_self=att, relative_bias=False)
  >>> r = predict(model, "batch:1", "mtf_th_float32")
  >>> r["core"]  # 2 layers x (J, W, U) x 8 x 32 x 32 x 4 x 4 bytes
  786432.0
"""
import collections
import math
import os

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import strategy_table

GiB = 2 ** 30
# Adafactor factors a weight whose two largest dims are at least this big
# (mesh_tensorflow.optimize.AdafactorOptimizer's min_dim_size_to_factor).
MIN_DIM_SIZE_TO_FACTOR = 128
# Slots per weight element of the optimizers that do not factor.
OPTIMIZER_SLOTS = {"adafactor": None, "adam": 2, "lamb": 2}
RELATIVE_BUCKETS = 32  # T5's relative_attention_num_buckets
# Gradients live at the peak, in copies of the largest weight (module doc).
GRADIENT_COPIES = 2
MASTER_BYTES = 4  # float32 weights, gradients, slots (gin/mtf_th.gin)

# The n x m x heads tensors each variant keeps for its backward pass, by the
# heads dim they carry ("heads_k", "heads", "heads_v"): J if it has P_l, W,
# U if it has P_w (general bilinear: W, plus X.P and W.M).
CORE_TENSORS = {
    v.name: ("heads_k",) * v.project_logits + ("heads",) +
            ("heads_v",) * v.project_weights
    for v in spec_lib.VARIANT_TABLE if v.name != spec_lib.DYNAMIC}
# What a strategy does to the core (nn/strategies) is its strategy_table
# memory_core: "heads" keeps the heads layout (the variants that mix heads
# keep `heads` whole), "split" cuts every core tensor P ways; the core's
# gradients then read the re-laid Q, K, V (the heads-split ones are freed:
# the projections' gradients read X) and Y's gradient the heads-split O, so
# as many Q, K, V, O elements are kept as heads-parallel keeps, except that
# "gather" (the query splits) keeps K and V whole; "layer" splits the whole
# layer over the batch (batch_split_gathered).
ROLES = ("heads_k", "heads", "heads_v")
# The attention core's kernel (mtf_th.core_kernel.kind, nn/core_kernel.py):
# "einsum" keeps CORE_TENSORS, "fused" its softmax statistics and bias.
KERNELS = ("einsum", "fused")
# What the fused core's ops hold, in copies of its largest input of Q, K, V
# (TensorFlow's allocator): the gradient dQ, dK, dV and two accumulators;
FUSED_GRAD_COPIES = 5
FUSED_FORWARD_COPIES = 1  # the forward O, or its K^T
# Elements of one [queries, heads, m] buffer the gradient op's blocks aim at
# (fused_core.cc's kGradBlockElements; tests/estimate/test_memory.py reads
# the source to keep the two equal).
FUSED_GRAD_BLOCK_ELEMENTS = 16 * 24 * 512


def cpu_threads():
  """A TensorFlow CPU op's default threads: the CPUs this process may use."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def fused_grad_chunks(threads, pairs, n, m, heads):
  """Chunks of query blocks the fused gradient op cuts each (example, group)
  pair into (fused_core.cc): each past the first holds a partial dK, dV.

  Args:
    threads: the op's worker threads (TensorFlow's intra-op pool).
    pairs: examples times groups (multi-head: every head a group); groups
      alone when a trainable bias is shared by the examples (T5, unpacked).
    n, m: query and memory lengths; heads: the largest of h_k, h, h_v of a
      group (1 for multi-head).

  Returns:
    min(blocks, ceil(threads / pairs)), at least 1: e.g. 8 threads, talking
    heads (one group of 24 heads), n = m = 512, 32 blocks of 16 queries:
    8 chunks for one example, 1 for 8 examples.
  """
  queries = FUSED_GRAD_BLOCK_ELEMENTS // max(1, heads * m)
  queries = max(8, min(64, min(queries, n // 8) // 8 * 8))
  queries = max(1, min(queries, n))
  blocks = -(-n // queries) if n else 0
  return max(1, min(blocks, -(-threads // max(1, pairs))))


def split_roles(att, layout=None):
  """The heads roles (of ROLES) the `model` axis splits.

  Args:
    att: a model.Attention.
    layout: layout rules ("batch:batch,heads:model,..." or a list of
      (dim, axis) pairs); None: step_time.py's heads-parallel layout
      (heads_k and heads_v split: every role for the variants that do not
      mix heads).
  Returns:
    a frozenset of role names.
  """
  if layout is None:
    if att.mixes_heads:
      return frozenset(("heads_k", "heads_v"))
    return frozenset(ROLES)
  on_model = {d for d, a in spec_lib.parse_layout(layout) if a == "model"}
  return frozenset(r for r, n in zip(ROLES, _dim_names(att)) if n in on_model)


def _dim_names(att):
  """The mtf dim name of each of ROLES in the layers (prices.named_dims:
  a heads dim tied to h is named "heads"); grouped layers are laid out by
  their "groups" dim, which every heads role carries."""
  if att.groups:
    return ("groups",) * len(ROLES)
  dims = prices.named_dims(att)
  return (dims.heads_k.name, dims.heads.name, dims.heads_v.name)
def _split_index(name, dims, roles, grouped):
  """The index of the dim of weight `name` the model axis splits, or None.

  dims: the weight's dim names (costs.attention_terms' "param_dims").
  """
  if grouped and roles:
    return 0 if name in ("P_l", "P_w") else len(dims) - 1
  for index, dim in enumerate(dims):
    if dim in roles:
      return index
  return None


def _terms(att, d_model, length=1):
  return costs.attention_terms(att.variant, att.heads_k, att.heads,
                               att.heads_v, att.d_k, att.d_v, d_model, length,
                               dynamic=att.dynamic, groups=att.groups)


def weight_shapes(model, layout=None):
  """[(name, shape, split dim index or None)] of every learned tensor.

  Attention tensors as costs.attention_terms names them (one entry per
  layer of each stack, or one per stack when the layers share weights);
  grouped talking heads' P_l, P_w are split on their groups dim (index 0).
  layout: as split_roles.
  """
  d = model.d_model
  out = [("embedding", (model.vocab, d), 0)]
  copies = 1 if model.shared_layers else model.num_layers
  for stack, _, placements in model_lib.stacks(model):
    layer = []
    for placement, _ in placements:
      att = getattr(model, placement)
      roles = split_roles(att, layout)
      terms = _terms(att, d)
      for name, shape in terms["params"].items():
        split = _split_index(name, terms["param_dims"][name], roles,
                             bool(att.groups))
        layer.append(("%s/%s/%s" % (stack, placement, name), shape, split))
      layer.append(("%s/%s/norm" % (stack, placement), (d,), None))
    layer += [("%s/ffn/wi" % stack, (d, model.d_ff), 1),
              ("%s/ffn/wo" % stack, (model.d_ff, d), 0),
              ("%s/ffn/norm" % stack, (d,), None)]
    out += layer * copies
    out.append(("%s/final_norm" % stack, (d,), None))
    if model.relative_bias:
      heads = getattr(model, placements[0][0]).heads
      out.append(("%s/relative_bias" % stack, (RELATIVE_BUCKETS, heads),
                  None))
  return out


def _slot_shapes(shape, optimizer):
  """[(shape, index of the split dim kept or None)] of one weight's slots,
  relative to the weight's own dims (index into `shape`)."""
  if optimizer != "adafactor":
    return [(shape, tuple(range(len(shape))))] * OPTIMIZER_SLOTS[optimizer]
  order = sorted(range(len(shape)), key=lambda i: -shape[i])
  if len(shape) < 2 or shape[order[1]] < MIN_DIM_SIZE_TO_FACTOR:
    return [(shape, tuple(range(len(shape))))]
  keep_r = tuple(i for i in range(len(shape)) if i != order[0])
  keep_c = tuple(i for i in range(len(shape)) if i != order[1])
  return [(tuple(shape[i] for i in keep_r), keep_r),
          (tuple(shape[i] for i in keep_c), keep_c)]


def state_elements(model, model_axis=1, layout=None):
  """(weights, optimizer slots, largest weight) elements per device on a
  model axis of P."""
  weights = slots = largest = 0.0
  for _, shape, split in weight_shapes(model, layout):
    index = None if split is None else split % len(shape)
    size = math.prod(shape)
    size = size / model_axis if index is not None else size
    weights += size
    largest = max(largest, size)
    for slot_shape, kept in _slot_shapes(shape, model.optimizer):
      n = math.prod(slot_shape)
      slots += n / model_axis if index in kept else n
  return weights, slots, largest


def _sizes(att):
  return {"heads_k": att.heads_k, "heads": att.heads, "heads_v": att.heads_v}


def _share(role, roles, p, core):
  """The fraction of a tensor with heads role `role` one device holds."""
  return 1.0 / p if core != "heads" or role in roles else 1.0


def _core_elements(att, b, n, m, p, core, roles):
  """n x m x heads elements one attention layer keeps, per device."""
  sizes = _sizes(att)
  return sum(b * n * m * sizes[r] * _share(r, roles, p, core)
             for r in CORE_TENSORS[att.variant])


def fuses(att, p, core, roles, impl, dropout=False):
  """Whether the fused core runs this layer (nn/core_kernel.py's rules as
  the model states them): not general bilinear, no dynamic projections,
  no attention dropout, float32 activations, and a heads-parallel core
  whose projections mix heads keeps them whole on the model axis."""
  if att.variant == spec_lib.BILINEAR or att.dynamic or dropout:
    return False
  if impl.activation_bytes != 4:  # bfloat16 activations
    return False
  return not (core == "heads" and p > 1 and att.mixes_heads and roles)


def fused_bias(att, placement, b, n, m, p, core, relative_bias,
               packed=False):
  """Elements of the bias terms one fused core keeps for its gradient.

  FusedCore keeps the terms mtf adds into the bias (core_kernel.bias_terms),
  not their sum.  Unpacked (one sequence per row, the harness's), a
  decoder's self-attention has the causal mask [n, m] and T5's relative
  position bias is [h, n, m] (self-attention), once per layer.  Packed
  (mtf_th train's: positions and segments per example) every mask is
  [b, n, m] (causal and segment masks in decoder self-attention, the
  segment mask elsewhere) and the relative bias [b, n, m, h]: its bucket
  depends on each example's positions.  Split cores cut what has the split
  dim (the query splits: every term; the batch splits: packed terms).

  Args:
    att: a model.Attention; placement: "enc_self", "dec_self" or "encdec".
    b, n, m, p: examples per device, lengths, the model axis.
    core: the strategy's memory_core.
    relative_bias: the model's self-attention adds T5's relative bias.
    packed: the batch is packed.
  """
  relative = relative_bias and placement != "encdec"
  if packed:
    masks = 2 if placement == "dec_self" else 1
    elements = b * n * m * (masks + (att.heads if relative else 0))
  else:
    elements = n * m * ((placement == "dec_self") +
                        (att.heads if relative else 0))
  if core == "gather" or (core in ("split", "layer") and packed):
    elements /= p  # the query (or batch) split cuts it
  return elements


def _fused_temporaries(att, b, n, m, p, core, roles, bias_grad, threads,
                       shared_bias):
  """Elements the fused core's gradient op holds at once, per device: dQ,
  dK, dV and two key-sized accumulators (FUSED_GRAD_COPIES of the largest
  of Q, K, V, as the allocator's records show), a partial dK and dV per
  chunk past the first (fused_grad_chunks; at most: a query split's n/p is
  not), and a trainable bias's gradient (bias_grad; shared_bias: one)."""
  q, k, v, _ = _qkvo(att, b, n, m, p, core, roles)
  if att.project_logits or att.project_weights:  # a split core: b / p each
    groups = (att.groups or 1) / (p if core in ("split", "layer") else 1)
    heads = max(_sizes(att).values())
  else:  # multi-head: every head a group of its own
    groups, heads = att.heads * _share("heads", roles, p, core), 1
  pairs = groups * (1 if bias_grad and shared_bias else b)
  chunks = fused_grad_chunks(threads, pairs, n, m, heads)
  return FUSED_GRAD_COPIES * max(q, k, v) + (chunks - 1) * (k + v) \
      + bias_grad


def _fused_elements(att, b, n, p, core, roles):
  """The fused core's log-sum-exp [b, h, n], per device."""
  return b * n * att.heads * _share("heads", roles, p, core)


def attention_kept(att, d_model, n, m, b, p, impl, strategy="heads_parallel",
                   recompute=False, dropout=False, roles=None, bias=None):
  """(activation bytes, core bytes) one attention layer keeps, per device.

  Args:
    att: a model.Attention.
    d_model, n, m: model size, query and memory lengths.
    b: examples on the device's data-parallel group.
    p: the model axis.
    impl: a hardware.Implementation.
    strategy: a strategy_table name.
    recompute: True: the core is recomputed in the backward pass (no
      n x m x heads tensor kept).
    dropout: dropout on the attention weights (a mask is kept).
    roles: split_roles(att, layout) (None: step_time.py's layout).
    bias: None: the einsum core; else the fused core runs the layer, which
      keeps this many bias elements (fused_bias) and its statistics.
  Returns:
    (bytes of the sublayer's X-sized, Q, K, V, O, R tensors; bytes of its
    n x m x heads tensors, or of the fused core's statistics and bias).
  """
  core = strategy_table.ROWS[strategy].memory_core
  roles = split_roles(att) if roles is None else roles
  e, ec = impl.activation_bytes, impl.core_bytes
  x = b * n * d_model
  kept = 3.0 * x  # norm (2 X) + output
  if att.variant == spec_lib.BILINEAR:
    share = _share("heads", roles, p, core)
    kept += 2.0 * b * n * d_model * att.heads * share  # X.P and W.M
    a = 0.0 if recompute else _core_elements(att, b, n, m, p, core, roles)
    return kept * e, a * ec
  q, k, v, o = _qkvo(att, b, n, m, p, core, roles)
  kept += q + k + v + o + _dynamic_elements(att, b, n, m, p, roles)
  if bias is not None:
    return kept * e, (_fused_elements(att, b, n, p, core, roles) + bias) * ec
  a = 0.0 if recompute else _core_elements(att, b, n, m, p, core, roles)
  if dropout and not recompute:
    a += b * n * m * att.heads_v * _share("heads_v", roles, p, core)
  return kept * e, a * ec


def _qkvo(att, b, n, m, p, core, roles):
  """Elements of Q, K, V and O of one attention layer, per device (the
  query splits' K and V gathered whole)."""
  qk, qv = _share("heads_k", roles, p, "heads"), _share("heads_v", roles, p,
                                                         "heads")
  q = b * n * att.heads_k * att.d_k * qk
  k = b * m * att.heads_k * att.d_k * qk
  v = b * m * att.heads_v * att.d_v * qv
  o = b * n * att.heads_v * att.d_v * qv
  if core == "gather":  # K and V gathered whole for the core's gradients
    k, v = b * m * att.heads_k * att.d_k, b * m * att.heads_v * att.d_v
  return q, k, v, o


def _dynamic_elements(att, b, n, m, p, roles):
  """Elements of the dynamic projections' R tensors, per device."""
  out = 0.0
  for term in att.dynamic:  # R[rows, heads_in, heads_out], split like J / U
    rows = n if term[0] == "x" else m
    pair = (att.heads_k * att.heads if term[-1] == "l"
            else att.heads * att.heads_v)
    role = "heads_k" if term[-1] == "l" else "heads_v"
    out += b * rows * pair / (att.groups or 1) * _share(role, roles, p,
                                                        "heads")
  return out


def _largest_core(att, b, n, m, p, core, roles):
  """The largest n x m x heads tensor of one layer, elements per device."""
  sizes = _sizes(att)
  return b * n * m * max(sizes[r] * _share(r, roles, p, core) for r in ROLES)


def predict(model, mesh_shape="batch:1", impl="mtf_th", strategy=None,
            recompute=False, dropout=False, layout=None, kernel="einsum",
            packed=False, threads=None):
  """Predicted bytes per device of one training step.

  Args:
    model: a model.Model.
    mesh_shape: "batch:B,model:P" (model.parse_mesh).
    impl: a key of hardware.IMPLEMENTATIONS or an Implementation (activation
      and core bytes).
    strategy: a strategy_table name for every attention layer (None:
      heads_parallel); general bilinear always runs heads-parallel.
    recompute: recompute the attention core in the backward pass.
    dropout: attention-weights dropout on (dropout_rate > 0).
    layout: the layout rules the model runs with (which heads dims the
      `model` axis splits, see split_roles); None: step_time.py's.
    kernel: "einsum", or "fused": the fused core where it applies (fuses();
      recompute then changes nothing for those layers: RecomputeCore runs
      the fused core as it is).
    packed: the batches are packed (mtf_th train's): the fused core keeps
      a mask per example (fused_bias).
    threads: the fused gradient op's worker threads (None: cpu_threads(),
      TensorFlow's default intra-op pool); fewer (example, group) pairs per
      device than threads add partial dK, dV (fused_grad_chunks).

  Returns:
    dict of bytes per device: weights, gradients, optimizer, activations
    (kept, core tensors excluded), core (the n x m x heads tensors kept,
    or the fused core's statistics and bias), temporaries, total; and
    parts {name: bytes} for the table.

  Raises:
    ValueError: naming the bad argument.
  """
  impl, strategy, b, p = _per_device(model, mesh_shape, impl, strategy)
  if kernel not in KERNELS:
    raise ValueError("kernel %r has no memory model; choose one of: %s"
                     % (kernel, ", ".join(KERNELS)))
  threads = cpu_threads() if threads is None else threads
  e = impl.activation_bytes
  weights, slots, largest_weight = state_elements(model, p, layout)
  kept = core = 0.0
  largest = recomputed = fused_tmp = 0.0
  for _, n, placements in model_lib.stacks(model):
    x = b * n * model.d_model
    layer_kept = layer_core = 0.0
    for placement, m in placements:
      att = getattr(model, placement)
      s = _layer_strategy(att, strategy)
      roles = split_roles(att, layout)
      tensors = strategy_table.ROWS[s].memory_core
      bias = None
      if kernel == "fused" and fuses(att, p, tensors, roles, impl, dropout):
        bias = fused_bias(att, placement, b, n, m, p, tensors,
                          model.relative_bias, packed)
      k_bytes, c_bytes = attention_kept(
          att, model.d_model, n, m, b, p, impl, s,
          recompute and bias is None, dropout, roles, bias)
      layer_kept += k_bytes
      layer_core += c_bytes
      if bias is None:
        one = _largest_core(att, b, n, m, p, tensors, roles)
        largest = max(largest, one * impl.core_bytes)
      else:
        fused_tmp = max(fused_tmp, _fused_temporaries(
            att, b, n, m, p, tensors, roles, bias if model.relative_bias
            and placement != "encdec" else 0, threads, not packed) * e)
      if recompute and bias is None:  # the recomputed core: J, W, U, L
        recomputed = max(recomputed, attention_kept(
            att, model.d_model, n, m, b, p, impl, s, False, dropout,
            roles)[1] + one * impl.core_bytes)
    layer_kept += (3 * x + 2 * b * n * model.d_ff / p) * e  # FFN sublayer
    kept += layer_kept * model.num_layers + 4 * x * e  # + embed, final norm
    core += layer_core * model.num_layers
  logits = b * model_lib.loss_positions(model) * model.vocab / p * e
  kept += logits
  # one layer's core recomputed at a time, on top of its gradients
  temporaries = max(2 * logits, 2 * largest + recomputed, fused_tmp)
  state = MASTER_BYTES
  out = collections.OrderedDict([
      ("weights", weights * state),
      ("gradients", GRADIENT_COPIES * largest_weight * state),
      ("optimizer", slots * state), ("activations", kept), ("core", core),
      ("temporaries", temporaries)])
  out["total"] = sum(out.values())
  out.update(mesh_shape=mesh_shape, strategy=strategy, recompute=recompute,
             implementation=impl.name, kernel=kernel)
  return out


def forward_attention(att, d_model, n, m, b, p, strategy="heads_parallel",
                      roles=None, bias=None):
  """Elements one attention layer holds at its forward peak, per device.

  Nothing is kept for a backward pass, so at the core's peak the layer
  holds its input X (the residual), Q, K, V (in the strategy's layout), the
  dynamic R tensors, and two of its largest n x m x heads tensors (a
  projection's or the softmax's input and output), three with dynamic
  projections (a dynamic term's own n x m x heads product, added to J or
  W); general bilinear X.P in place of Q, K, V.  The split strategies
  re-lay Q, K and V for the core, so the heads-split copy of the largest
  (batch splits) or of K and V (query splits, which gather them) is live
  beside it.

  Args:
    att, d_model, n, m, b, p: as attention_kept.
    strategy: a strategy_table name.
    roles: split_roles(att, layout) (None: step_time.py's layout).
    bias: None: the einsum core; else the fused core runs the layer and
      its bias (fused_bias) is live instead of the n x m x heads tensors.
  Returns:
    elements (multiply by the activation bytes).
  """
  core = strategy_table.ROWS[strategy].memory_core
  roles = split_roles(att) if roles is None else roles
  x = b * n * d_model
  core_live = ((3 if att.dynamic else 2) *
               _largest_core(att, b, n, m, p, core, roles))
  if bias is not None:
    core_live = bias + _fused_elements(att, b, n, p, core, roles) + \
        FUSED_FORWARD_COPIES * max(_qkvo(att, b, n, m, p, core, roles)[:3])
  if att.variant == spec_lib.BILINEAR:
    return (x + b * n * d_model * att.heads * _share("heads", roles, p, core)
            + core_live)
  q, k, v, _ = _qkvo(att, b, n, m, p, core, roles)
  relaid = 0.0
  if core in ("split", "layer"):
    relaid = max(q, k, v)
  elif core == "gather":  # the heads-split K and V, gathered whole
    relaid = sum(_qkvo(att, b, n, m, p, "heads", roles)[1:3])
  return (x + q + k + v + relaid + _dynamic_elements(att, b, n, m, p, roles)
          + core_live)


def decode_caches(att, m, b, p, roles=None):
  """Elements of one attention layer's decoding state, per device: K and V
  of its m memory positions and the memory-dependent R tensors (what the
  layer records in "first_part" and keeps while decoding)."""
  roles = split_roles(att) if roles is None else roles
  if att.variant == spec_lib.BILINEAR:
    return 0.0
  _, k, v, _ = _qkvo(att, b, 1, m, p, "heads", roles)
  return k + v + _dynamic_elements(att, b, 0, m, p, roles)  # R_M: m rows


def _per_device(model, mesh_shape, impl, strategy):
  """(Implementation, strategy, examples per device b, model axis p), the
  arguments predict and predict_forward share, checked."""
  if not isinstance(model, model_lib.Model):
    raise ValueError("model must be a model.Model, got %r" % (model,))
  impl = hardware_lib.implementation(impl)
  strategy = strategy or "heads_parallel"
  if strategy not in strategy_table.ROWS:
    raise ValueError("strategy %r has no memory model; choose one of: %s"
                     % (strategy, ", ".join(strategy_table.NAMES)))
  mesh = model_lib.parse_mesh(mesh_shape)
  if model.batch % mesh["batch"]:
    raise ValueError("batch %d is not divisible by the mesh's batch axis "
                     "(%d); choose a --mesh_shape whose batch size divides "
                     "it" % (model.batch, mesh["batch"]))
  return impl, strategy, model.batch // mesh["batch"], mesh["model"]


def _layer_strategy(att, strategy):
  """General bilinear always runs heads-parallel."""
  return strategy if att.variant != spec_lib.BILINEAR else "heads_parallel"


def predict_forward(model, mesh_shape="batch:1", impl="mtf_th", layout=None,
                    strategy=None, decode=False, kernel="einsum",
                    packed=False):
  """Predicted bytes per device of one forward pass (eval, decode).

  No gradients, optimizer slots or activations kept for a backward pass:

    peak = weights + the outputs of earlier stacks (the encoder's, which
           the decoder's encdec attention reads) + the largest of: an
           attention layer at its core (forward_attention), a feed-forward
           layer (X, and the hidden layer before and after the ReLU, or
           the norm's output and the hidden layer before it) and the last
           stack's output with the logits and their log-softmax.

  decode=True adds every decoder layer's decoding state (decode_caches:
  each attention layer's K and V over its memory), which mtf's
  sample_autoregressive records in its full-length first pass and keeps
  while it decodes.  Checked against TensorFlow's allocator on CPU for
  eval (benchmarks/memory.py --forward); decoding is not measured.

  Example (the 2-layer LM of the module docstring, float32): X, Q, K, V
  (8 x 32 x (32 + 3 x 4 x 16) floats) and two 8 x 32 x 32 x 4 tensors are
  491520 bytes, more than the logits (X + 2 x 8 x 32 x 128 floats) and the
  feed-forward layer:

  >>> att = model_lib.make_attention("talking_heads", 4, 16, heads_k=4,
  ...                                heads_v=4)
  >>> model = model_lib.make_model("lm", 2, 32, 64, 128, 8, 32, 32,
  ...                              dec_self=att, relative_bias=False)
  >>> predict_forward(model, "batch:1", "mtf_th_float32")["activations"]
  491520.0

  Args:
    model, mesh_shape, impl, layout, strategy, kernel, packed: as
      predict().
    decode: count the decoding state too.
  Returns:
    dict of bytes per device: weights, activations, total.
  Raises:
    ValueError: naming the bad argument.
  """
  impl, strategy, b, p = _per_device(model, mesh_shape, impl, strategy)
  e = impl.activation_bytes
  earlier = peak = 0.0
  for stack, n, placements in model_lib.stacks(model):
    x = b * n * model.d_model
    h = b * n * model.d_ff / p
    layer = x + h + max(x, h)
    state = 0.0
    for placement, m in placements:
      att = getattr(model, placement)
      roles = split_roles(att, layout)
      s = _layer_strategy(att, strategy)
      tensors = strategy_table.ROWS[s].memory_core
      bias = None
      if kernel == "fused" and fuses(att, p, tensors, roles, impl):
        bias = fused_bias(att, placement, b, n, m, p, tensors,
                          model.relative_bias, packed)
      layer = max(layer, forward_attention(
          att, model.d_model, n, m, b, p, s, roles, bias))
      if decode and stack == "decoder":
        state += model.num_layers * decode_caches(att, m, b, p, roles)
    peak = max(peak, earlier + (state + layer) * e)
    earlier += (x + state) * e
  logits = b * model_lib.loss_positions(model) * model.vocab / p
  peak = max(peak, earlier + 2 * logits * e)
  weights = state_elements(model, p, layout)[0] * MASTER_BYTES
  return collections.OrderedDict([("weights", weights),
                                  ("activations", peak),
                                  ("total", weights + peak)])


# Memory per device (an mtf device, as hardware.Hardware counts them), bytes:
DEVICE_MEMORY = {
    # 16 GiB HBM per chip, two TensorCores (Jouppi et al. 2020, Table 3)
    "tpu_v2": 8 * GiB,
    # 32 GiB HBM2 per chip, two TensorCores (cloud.google.com/tpu/docs/v3)
    "tpu_v3": 16 * GiB,
    # 32 GiB HBM2 per chip, one megacore device (cloud.google.com/tpu/docs/v4)
    "tpu_v4": 32 * GiB,
    # 16 GiB HBM2 per chip, one TensorCore (cloud.google.com/tpu/docs/v5e)
    "tpu_v5e": 16 * GiB,
}


def device_memory(hardware, devices=1):
  """Bytes of memory of one device of `hardware` (a hardware.py name).

  "cpu": this host's physical memory shared by `devices` logical devices.
  """
  if hardware == "cpu":
    import os  # pylint: disable=g-import-not-at-top
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / devices
  # a bad name fails naming the valid ones
  hardware_lib.get_hardware(hardware)
  return DEVICE_MEMORY[hardware]
