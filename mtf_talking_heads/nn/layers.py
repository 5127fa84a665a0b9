"""Attention layers for mesh_tensorflow.transformer, one gin class per variant.

All classes are registered under the gin module ``mtf_th``.  Self-attention
classes are ``<Variant>Attention``, attention over the encoder output is
``<Variant>EncoderAttention`` (mtf 0.1.21 already registers the short names
TalkingHeadsSelfAttention / ...EncDecAttention, and its defaults.gin binds
them unqualified, so ours must differ), e.g.::

  encoder/transformer.make_layer_stack.layers = [
      @mtf_th.TalkingHeadsAttention, @transformer_layers.DenseReluDense]
  decoder/transformer.make_layer_stack.layers = [
      @mtf_th.MultiHeadAttention, @mtf_th.TalkingHeadsEncoderAttention,
      @transformer_layers.DenseReluDense]
  mtf_th.TalkingHeadsAttention.heads_k = 24   # or ("heads_k", 24)

Which projections a layer has is decided by its heads dims (see
attention.py): P_l iff heads_k and heads differ, P_w iff heads and heads_v
differ.  The variant classes only choose default dim names, so the heads
dims can be renamed (for layouts) without changing the algorithm.

GroupedTalkingHeadsAttention (groups=g) mixes heads only within g groups
(attention.py: every tensor with heads also carries a `groups` dim).

Example (TalkingHeadsAttention, heads_k = heads = heads_v = 24, d_k = d_v =
32, d_model = 768) creates variables
  p_q, p_k: [d_model, heads_k, d_k]   p_v: [d_model, heads_v, d_v]
  p_o: [heads_v, d_v, d_model]        p_l: [heads_k, heads]   p_w: [heads, heads_v]
and for each dynamic term, e.g. "x2l": p_xl: [d_model, heads_k, heads].

Incremental decoding caches K, V and, for the memory-dependent dynamic terms
m2l/m2w, the per-key projections R_Ml[m, h_k, h] and R_Mw[m, h, h_v]
(mesh-tensorflow 0.1.21 recomputes those from the current position only,
which is wrong).
"""
import math

import gin
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer_layers
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import strategies

_WEIGHT_TERMS = {"x2l": "p_xl", "m2l": "p_ml", "x2w": "p_xw", "m2w": "p_mw"}
_RELATIVE_TYPES = (None, "bias", "bias_shared")


class AttentionLayer(transformer_layers.SelfAttention):
  """Talking-heads self-attention; every variant is a choice of heads dims.

  Subclasses mtf's SelfAttention only to reuse its masks and T5 relative
  position bias (compute_bias, memory_length, min/max_relative_position).
  """

  grouped = False  # True: the classes that take groups

  def __init__(self,  # pylint: disable=super-init-not-called
               heads_k=("heads_k", 12),
               heads=("heads", 12),
               heads_v=("heads_v", 12),
               d_k=64,
               d_v=64,
               dynamic=(),
               dynamic_init_scale=0.1,
               dropout_rate=0.0,
               relative_attention_type=None,
               relative_attention_num_buckets=32,
               strategy=None,
               groups=None):
    """Creates the layer (variables are created in call()).

    Args:
      heads_k: (name, size) or int: heads of queries and keys (h_k).
      heads: (name, size) or int: heads of logits and weights (h).
      heads_v: (name, size) or int: heads of values (h_v).
      d_k: int or (name, size): query/key channels per head.
      d_v: int or (name, size): value channels per head.
      dynamic: subset of ("x2l", "m2l", "x2w", "m2w"): dynamic projections.
      dynamic_init_scale: the paper's 0.1 in std 0.1/sqrt(d_model * h).
      dropout_rate: dropout on the attention weights U (training only).
      relative_attention_type: None, "bias" or "bias_shared" (T5 bucketed
        relative position bias, added to L on the softmax heads).
      relative_attention_num_buckets: an integer.
      strategy: a sharding strategy (see nn/strategies); None:
        strategies.Auto(), the cheapest that applies to the model's mesh,
        layout, batch and lengths (heads-parallel on one device, or without
        core_shard in the layout).
      groups: None, or int / (name, size): grouped talking heads with g
        groups (heads_k, heads, heads_v are then the totals, each a
        multiple of g; see GroupedTalkingHeadsAttention).
    Raises:
      ValueError: naming the parameter, for any inconsistent setting.
    """
    if groups is not None and not self.grouped:
      raise ValueError(
          "groups: %s does not group its heads; use "
          "mtf_th.GroupedTalkingHeadsAttention / ...EncoderAttention "
          "(gin/attention/grouped_talking_heads.gin) or drop groups"
          % type(self).__name__)
    self.dims = attention.make_dims(heads_k, heads, heads_v, d_k, d_v, groups)
    self.dynamic = attention.check_dynamic(dynamic, self.dims)
    if relative_attention_type not in _RELATIVE_TYPES:
      raise ValueError(
          "relative_attention_type must be one of %s, got %r"
          % (_RELATIVE_TYPES, relative_attention_type))
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError("dropout_rate must be in [0, 1), got %r" % dropout_rate)
    self.dynamic_init_scale = dynamic_init_scale
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.strategy = strategy or strategies.Auto()
    # attributes mtf's SelfAttention.compute_bias reads
    self.hyperprompt_length_encoder = None
    self.hyperprompt_length_decoder = None

  # ---------------------------------------------------------------- weights
  def weight_shapes(self, d_model):
    """{variable name: list of Dimensions} this layer creates for d_model."""
    dims = self.dims
    g = dims.group_dims  # [groups] (grouped talking heads) or []
    shapes = {
        "p_q": [d_model] + g + [dims.heads_k, dims.d_k],
        "p_k": [d_model] + g + [dims.heads_k, dims.d_k],
        "p_v": [d_model] + g + [dims.heads_v, dims.d_v],
        "p_o": g + [dims.heads_v, dims.d_v, d_model],
    }
    if dims.project_logits:
      shapes["p_l"] = g + [dims.heads_k, dims.heads]
    if dims.project_weights:
      shapes["p_w"] = g + [dims.heads, dims.heads_v]
    for term in self.dynamic:
      pair = ([dims.heads_k, dims.heads] if term.endswith("l")
              else [dims.heads, dims.heads_v])
      shapes[_WEIGHT_TERMS[term]] = [d_model] + g + pair
    return shapes

  def activation_heads(self):
    """Heads dims of the n x m attention activations (J, L/W, U), after
    `groups` when grouped."""
    return self.dims.group_dims + [self.dims.heads_k, self.dims.heads,
                                   self.dims.heads_v]

  def bias_heads(self):
    """The dims a per-head bias on L has: [heads], or [groups, heads]."""
    return self.dims.group_dims + [self.dims.heads]

  def _initializer(self, name, d_model):
    dims = self.dims
    scaling = mtf.layers.VarianceScalingInitializer
    if name == "p_q":  # folds the 1/sqrt(d_k) logit scaling into P_q
      return scaling(1.0 / dims.d_k.size)([d_model], [dims.heads_k, dims.d_k])
    if name in ("p_k", "p_v"):
      return scaling()([d_model], [])
    if name == "p_o":  # Y sums over groups, heads_v and d_v
      return scaling()(dims.group_dims + [dims.heads_v, dims.d_v], [])
    if name == "p_l":
      return scaling()([dims.heads_k], [])
    if name == "p_w":
      return scaling()([dims.heads], [])
    # dynamic: normal, std 0.1 / sqrt(d * h_k) (logits) or / sqrt(d * h) (weights)
    fan = d_model.size * (dims.heads_k.size if name.endswith("l")
                          else dims.heads.size)
    return tf.random_normal_initializer(
        stddev=self.dynamic_init_scale / math.sqrt(fan))

  def make_weights(self, context):
    """Creates (or reuses) this layer's variables; returns {name: tensor}."""
    d_model = context.model.model_dim
    weights = {}
    for name, shape in self.weight_shapes(d_model).items():
      weights[name] = mtf.get_variable(
          context.mesh, name,
          mtf.Shape(context.model.ensemble_dims + shape),
          initializer=self._initializer(name, d_model),
          dtype=context.variable_dtype)
    return weights

  # ---------------------------------------------------------------- pieces
  def _dynamic(self, weights, a, kind, source, d_model):
    """R tensors for dynamic terms of `kind` ("l"/"w") from `source` ("x"/"m")."""
    term = source + "2" + kind
    if term not in self.dynamic:
      return None
    return attention.compute_r(a, weights[_WEIGHT_TERMS[term]], d_model)

  def _dropout_fn(self, context):
    if not context.train or not self.dropout_rate:
      return None
    return lambda u: attention.dropout_weights(
        u, context.train, self.dropout_rate, [context.length_dim])

  def _frame(self, context, x, memory=None):
    """The strategy's Frame for this call (see strategies.Frame)."""
    return self.strategy.frame(strategies.AttentionCall(
        type(self).__name__, self.dims, self.dynamic, context, x, memory))

  def attend(self, frame, context, x, weights, q, k, v, r_m, memory_length,
             bias):
    """Dynamic X terms, the core (J..O, frame.core), then Y.

    Args:
      frame: the strategy's strategies.Frame; x, weights, q, k, v, r_m are
        in it (its dims, and e.g. a cut batch).
      context: the mtf transformer Context.
      x: X[..., n, d_model] (for the dynamic R_X terms).
      weights: {name: weight} (this layer's, as the frame gathered them).
      q, k, v: Q[..., n, h_k, d_k], K[..., m, h_k, d_k], V[..., m, h_v, d_v].
      r_m: {"l"/"w": R_Ml / R_Mw} of the memory-dependent dynamic terms.
      memory_length: the memory-length Dimension (m).
      bias: added to L, or None (in the layer's layout).
    Returns:
      Y[..., n, d_model] in the layer's layout (frame.from_core).
    """
    d_model = context.model.model_dim
    bias = frame.to_core(bias)
    r_x = {kind: self._dynamic(weights, x, kind, "x", d_model)
           for kind in ("l", "w")}
    dynamic_l = [r for r in (r_x["l"], r_m.get("l")) if r is not None]
    dynamic_w = [r for r in (r_x["w"], r_m.get("w")) if r is not None]
    o = frame.core(
        context=context, dims=frame.dims, q=q, k=k, v=v,
        memory_length=memory_length, p_l=weights.get("p_l"),
        p_w=weights.get("p_w"), dynamic_l=dynamic_l, dynamic_w=dynamic_w,
        bias=bias, dropout_fn=self._dropout_fn(context))
    return frame.from_core(attention.compute_y(o, weights["p_o"], frame.dims))

  def memory_terms(self, context, m, weights):
    """K, V and the memory-dependent R_Ml, R_Mw: everything cached per key."""
    d_model = context.model.model_dim
    k = attention.compute_k(m, weights["p_k"], d_model)
    v = attention.compute_v(m, weights["p_v"], d_model)
    r_m = {kind: self._dynamic(weights, m, kind, "m", d_model)
           for kind in ("l", "w")}
    return k, v, {kind: r for kind, r in r_m.items() if r is not None}

  # ---------------------------------------------------------------- call
  def call(self, context, x, losses=None):
    """Self-attention (train/eval, "first_part" and "incremental" modes).

    The strategy places the computation (self._frame: where Q, K, V and Y
    live, and the core); this layer computes it.  In "incremental" mode K,
    V (and R_M) are the caches with this position written; in "first_part"
    and "incremental" the new caches are recorded.

    Args:
      context: the mtf transformer Context.
      x: X[batch..., length, d_model] (incremental: no length).
    Returns:
      Y, shaped like x.
    """
    frame = self._frame(context, x)
    weights = frame.gather_weights(self.make_weights(context))
    memory_length = self.memory_length(context)
    x_core = frame.to_core(x)
    q = attention.compute_q(x_core, weights["p_q"], context.model.model_dim)
    if context.mode == "incremental":
      m = x_core
    else:
      m = mtf.replace_dimensions(x_core, context.length_dim, memory_length)
    k, v, r_m = self.memory_terms(context, m, weights)
    kinds = sorted(r_m)
    if context.mode == "incremental":
      old = context.get_states(2 + len(kinds))
      new = [k, v] + [r_m[kind] for kind in kinds]
      k, v, *rs = [_write_position(o, n, context.position, memory_length)
                   for o, n in zip(old, new)]
      r_m = dict(zip(kinds, rs))
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      memory_position = self.rename_length_to_memory_length(
          context.position, context)
    if context.mode in ("incremental", "first_part"):
      context.record_new_states([k, v] + [r_m[kind] for kind in kinds])
    bias = self.compute_bias(context, memory_position, x, self.bias_heads(),
                             q)
    return self.attend(frame, context, x_core, weights, q, k, v, r_m,
                       memory_length, bias)


def _write_position(old, new, position, memory_length):
  """Cache update: `old` with `new` written at `position` along memory_length."""
  one_hot = mtf.one_hot(position, memory_length, dtype=old.dtype)
  if new.dtype != old.dtype:
    new = mtf.cast(new, old.dtype)
  return old * (1.0 - one_hot) + new * one_hot


class EncDecAttentionLayer(AttentionLayer):
  """Attention over the encoder output (the memory M)."""

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def call(self, context, x, losses=None):
    """Enc-dec attention; K, V, R_Ml, R_Mw are constant while decoding.

    As AttentionLayer.call, with M the encoder output (the strategy's
    frame places it too).
    """
    m = context.encoder_output
    frame = self._frame(context, x, m)
    weights = frame.gather_weights(self.make_weights(context))
    x_core = frame.to_core(x)
    q = attention.compute_q(x_core, weights["p_q"], context.model.model_dim)
    if context.mode == "incremental":
      k, v, r_m, memory_length = context.get_constant_state()
    else:
      k, v, r_m = self.memory_terms(context, frame.to_core(m), weights)
      memory_length, = [d for d in m.shape.dims if d.name == "memory_length"]
      if context.mode == "first_part":
        context.record_constant_state((k, v, r_m, memory_length))
    bias = transformer_layers.enc_dec_attention_bias(
        self, context, self.bias_heads())
    return self.attend(frame, context, x_core, weights, q, k, v, r_m,
                       memory_length, bias)


def _pair(value, default_name):
  """An int size becomes (default_name, size); pairs and Dimensions pass.

  Validated here because the variants pass `heads` on as heads_k / heads_v,
  and an error must name the parameter the caller set (`default_name`).
  """
  return spec_lib.dim_pair(value, default_name, default_name)


def _multi_head_kwargs(heads, kwargs):
  for name in ("heads_k", "heads_v"):
    if name in kwargs:
      raise ValueError(
          "%s is not a parameter of multi-head attention (its query, softmax "
          "and value heads are one dim); set `heads` instead, or use "
          "TalkingHeadsAttention for independent heads dims" % name)
  if kwargs.get("dynamic"):
    raise ValueError("dynamic projections need talking-heads projections; "
                     "use DynamicProjectionsAttention")
  heads = _pair(heads, "heads")
  return dict(kwargs, heads_k=heads, heads=heads, heads_v=heads)


def _project_logits_kwargs(layer, heads_k, heads, kwargs):
  """The layer's arguments when only P_l exists: heads_v is `heads`."""
  if "heads_v" in kwargs:
    raise ValueError("heads_v is `heads` in %s (no weights projection); set "
                     "`heads` instead" % type(layer).__name__)
  heads = _pair(heads, "heads")
  return dict(kwargs, heads_k=heads_k, heads=heads, heads_v=heads)


def _project_weights_kwargs(layer, heads, heads_v, kwargs):
  """The layer's arguments when only P_w exists: heads_k is `heads`."""
  if "heads_k" in kwargs:
    raise ValueError("heads_k is `heads` in %s (no logits projection); set "
                     "`heads` instead" % type(layer).__name__)
  heads = _pair(heads, "heads")
  return dict(kwargs, heads_k=heads, heads=heads, heads_v=heads_v)


@gin.configurable(module="mtf_th")
class MultiHeadAttention(AttentionLayer):
  """Multi-head attention: heads_k = heads = heads_v (one dim, "heads")."""

  def __init__(self, heads=("heads", 12), **kwargs):
    super().__init__(**_multi_head_kwargs(heads, kwargs))


@gin.configurable(module="mtf_th")
class TalkingHeadsAttention(AttentionLayer):
  """Talking-heads attention (paper section 4) with independent h_k, h, h_v."""


def _grouped_kwargs(groups, kwargs):
  """The layer's arguments for grouped talking heads: groups required."""
  if groups is None:  # make_dims checks the value
    raise ValueError(
        "groups must be a positive integer (the number of head groups g; "
        "heads_k, heads, heads_v are the totals, each a multiple of g), got "
        "%r; use TalkingHeadsAttention for ungrouped talking heads" % (groups,))
  return dict(kwargs, groups=groups)


@gin.configurable(module="mtf_th")
class GroupedTalkingHeadsAttention(AttentionLayer):
  """Talking heads that mix heads only within each of g groups.

  heads_k, heads, heads_v are the total heads (as for TalkingHeadsAttention);
  each must be a multiple of `groups`.  P_l and P_w are block-diagonal: one
  [h_k/g, h/g] (and [h/g, h_v/g]) block per group, so P_l has h_k h / g
  parameters and L = J P_l costs n m h_k h / g multiplies (docs/costs.md).
  With the groups dim on the model axis (layout groups:model) J, L, W, U
  stay on their device: the layer communicates what multi-head attention
  does (docs/sharding.md); groups=1 is talking heads, per-group heads of 1
  with P_l = P_w = 1 is multi-head attention with g heads.

  Example (heads_k = heads = heads_v = 24, groups = 8, d_k = d_v = 32,
  d_model = 768) creates variables
    p_q, p_k: [d_model, groups=8, heads_k=3, d_k]   p_v: [d_model, groups, heads_v=3, d_v]
    p_o: [groups, heads_v, d_v, d_model]
    p_l: [groups, heads_k, heads]   p_w: [groups, heads, heads_v]
  and J, L, W, U: [batch, length, memory_length, groups, 3 heads].
  """

  grouped = True

  def __init__(self, groups=None, **kwargs):
    super().__init__(**_grouped_kwargs(groups, kwargs))


@gin.configurable(module="mtf_th")
class ProjectLogitsAttention(AttentionLayer):
  """Logits projection only: P_l[h_k, h], weights used as is (h_v = h)."""

  def __init__(self, heads_k=("heads_k", 12), heads=("heads", 12), **kwargs):
    super().__init__(**_project_logits_kwargs(self, heads_k, heads, kwargs))


@gin.configurable(module="mtf_th")
class ProjectWeightsAttention(AttentionLayer):
  """Weights projection only: P_w[h, h_v], logits used as is (h_k = h)."""

  def __init__(self, heads=("heads", 12), heads_v=("heads_v", 12), **kwargs):
    super().__init__(**_project_weights_kwargs(self, heads, heads_v, kwargs))


@gin.configurable(module="mtf_th")
class DynamicProjectionsAttention(AttentionLayer):
  """Talking heads with dynamic projections (appendix A), all four by default.

  The dynamic terms are folded as mesh_tensorflow folds them
  (attention.fold_dynamic): L = einsum(J, P_l + R_Xl) + einsum(J, R_Ml) and
  U = einsum(W, P_w + R_Xw) + einsum(W, R_Mw); with one term per projection
  that is one n x m einsum each, the paper's count (docs/costs.md).

  Example (heads_k = heads = heads_v = 12, d_model = 768, all four terms):
    p_xl, p_ml: [d_model, heads_k, heads]   p_xw, p_mw: [d_model, heads, heads_v]
    P_l + R_Xl: [batch, length, heads_k, heads]
    R_Ml: [batch, memory_length, heads_k, heads]
  """

  def __init__(self, dynamic=attention.DYNAMIC_TERMS, **kwargs):
    super().__init__(dynamic=dynamic, **kwargs)


@gin.configurable(module="mtf_th")
class MultiHeadEncoderAttention(EncDecAttentionLayer):
  """Multi-head attention over the encoder output."""

  def __init__(self, heads=("heads", 12), **kwargs):
    super().__init__(**_multi_head_kwargs(heads, kwargs))


@gin.configurable(module="mtf_th")
class TalkingHeadsEncoderAttention(EncDecAttentionLayer):
  """Talking-heads attention over the encoder output."""


@gin.configurable(module="mtf_th")
class GroupedTalkingHeadsEncoderAttention(EncDecAttentionLayer):
  """Grouped talking-heads attention over the encoder output."""

  grouped = True

  def __init__(self, groups=None, **kwargs):
    super().__init__(**_grouped_kwargs(groups, kwargs))


@gin.configurable(module="mtf_th")
class ProjectLogitsEncoderAttention(EncDecAttentionLayer):
  """Logits-projection-only attention over the encoder output."""

  def __init__(self, heads_k=("heads_k", 12), heads=("heads", 12), **kwargs):
    super().__init__(**_project_logits_kwargs(self, heads_k, heads, kwargs))


@gin.configurable(module="mtf_th")
class ProjectWeightsEncoderAttention(EncDecAttentionLayer):
  """Weights-projection-only attention over the encoder output."""

  def __init__(self, heads=("heads", 12), heads_v=("heads_v", 12), **kwargs):
    super().__init__(**_project_weights_kwargs(self, heads, heads_v, kwargs))


@gin.configurable(module="mtf_th")
class DynamicProjectionsEncoderAttention(EncDecAttentionLayer):
  """Dynamic-projection talking heads over the encoder output."""

  def __init__(self, dynamic=attention.DYNAMIC_TERMS, **kwargs):
    super().__init__(dynamic=dynamic, **kwargs)


@gin.configurable(module="mtf_th")
class GeneralBilinearAttention(transformer_layers.SelfAttention):
  """General bilinear multihead attention (paper section 6).

  Variables: p: [d_model, heads, d_model_m] (the paper's P[d_X, d_M, h]) and
  q: [d_model_m, heads, d_model] (Q[d_M, d_Y, h]).  Costs h*(2nd^2 + 2nmd)
  multiplies: "may have no practical use", but it is the paper's reference.
  Incremental decoding caches M itself.
  """

  def __init__(self,  # pylint: disable=super-init-not-called
               heads=("heads", 12),
               dropout_rate=0.0,
               relative_attention_type=None,
               relative_attention_num_buckets=32):
    self.heads = mtf.Dimension(*_pair(heads, "heads"))
    if relative_attention_type not in _RELATIVE_TYPES:
      raise ValueError("relative_attention_type must be one of %s, got %r"
                       % (_RELATIVE_TYPES, relative_attention_type))
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError("dropout_rate must be in [0, 1), got %r" % dropout_rate)
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.hyperprompt_length_encoder = None
    self.hyperprompt_length_decoder = None

  @staticmethod
  def d_m(d_model):
    return mtf.Dimension(d_model.name + "_m", d_model.size)

  def weight_shapes(self, d_model):
    d_m = self.d_m(d_model)
    return {"p": [d_model, self.heads, d_m], "q": [d_m, self.heads, d_model]}

  def activation_heads(self):
    return [self.heads]

  def make_weights(self, context):
    d_model = context.model.model_dim
    d_m = self.d_m(d_model)
    init = mtf.layers.VarianceScalingInitializer
    inits = {"p": init(1.0 / d_model.size)([d_model], []),  # folds 1/sqrt(d)
             "q": init()([self.heads, d_m], [])}
    return {name: mtf.get_variable(
        context.mesh, name, mtf.Shape(context.model.ensemble_dims + shape),
        initializer=inits[name], dtype=context.variable_dtype)
            for name, shape in self.weight_shapes(d_model).items()}

  def _attend(self, context, x, m, weights, memory_length, bias):
    d_model = context.model.model_dim
    d_m = self.d_m(d_model)
    m = mtf.rename_dimension(m, d_model.name, d_m.name)
    dropout_fn = None
    if context.train and self.dropout_rate:
      dropout_fn = lambda w: attention.dropout_weights(  # pylint: disable=g-long-lambda
          w, context.train, self.dropout_rate, [context.length_dim])
    return attention.general_bilinear_attention(
        x, m, weights["p"], weights["q"], self.heads, d_model, d_m,
        memory_length, bias, dropout_fn)

  def call(self, context, x, losses=None):
    weights = self.make_weights(context)
    memory_length = self.memory_length(context)
    if context.mode == "incremental":
      old_m, = context.get_states(1)
      m = _write_position(old_m, x, context.position, memory_length)
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      m = mtf.replace_dimensions(x, context.length_dim, memory_length)
      memory_position = self.rename_length_to_memory_length(
          context.position, context)
    if context.mode in ("incremental", "first_part"):
      context.record_new_states([m])
    bias = self.compute_bias(context, memory_position, x, [self.heads], None)
    return self._attend(context, x, m, weights, memory_length, bias)


@gin.configurable(module="mtf_th")
class GeneralBilinearEncoderAttention(GeneralBilinearAttention):
  """General bilinear attention over the encoder output."""

  def call(self, context, x, losses=None):
    weights = self.make_weights(context)
    if context.mode == "incremental":
      m, memory_length = context.get_constant_state()
    else:
      m = context.encoder_output
      memory_length, = [d for d in m.shape.dims if d.name == "memory_length"]
      if context.mode == "first_part":
        context.record_constant_state((m, memory_length))
    bias = transformer_layers.enc_dec_attention_bias(
        self, context, [self.heads])
    return self._attend(context, x, m, weights, memory_length, bias)


# spec.VARIANT_TABLE's variants -> (self-attention, encoder-attention) class.
VARIANTS = {name: tuple(globals()[c] for c in spec_lib.layer_class_names(name))
            for name in spec_lib.VARIANTS}


def make_attention(variant, enc_dec=False, **kwargs):
  """The layer class for `variant` (a key of VARIANTS), built with kwargs."""
  if variant not in VARIANTS:
    raise ValueError("variant: unknown %r; choose from %s"
                     % (variant, ", ".join(VARIANTS)))
  return VARIANTS[variant][1 if enc_dec else 0](**kwargs)


def layer_for_spec(spec, enc_dec=False, **kwargs):
  """The gin class of spec.variant with the spec's dims (plus kwargs).

  Args:
    spec: a spec.AttentionSpec (heads sizes are totals, as the classes take).
    enc_dec: the encoder-attention class instead of self-attention.
    **kwargs: other arguments of the class, e.g. strategy.
  Example:
    layer_for_spec(spec.make_spec("project_logits", 8, 4, 4, heads_k=16))
    == ProjectLogitsAttention(heads_k=16, heads=8, d_k=4, d_v=4)
  """
  v = spec_lib.VARIANT[spec.variant]
  dims = dict(heads=spec.heads)
  if v.project_logits:
    dims["heads_k"] = spec.heads_k
  if v.project_weights:
    dims["heads_v"] = spec.heads_v
  if spec.variant != spec_lib.BILINEAR:
    dims.update(d_k=spec.d_k, d_v=spec.d_v)
  if spec.variant == spec_lib.GROUPED:
    dims["groups"] = spec.groups
  if v.project_logits or v.project_weights:
    dims["dynamic"] = spec.dynamic
  dims.update(kwargs)
  return make_attention(spec.variant, enc_dec, **dims)
