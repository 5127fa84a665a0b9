"""NumPy float64 transcription of the paper's pseudocode (the tests' oracle).

One line per pseudocode line of Shazeer et al. 2020, "Talking-Heads
Attention": sections 3 (DotProductAttention, MultiHeadAttention[Concise]),
4 (TalkingHeadsAttention[Concise]), 6 (GeneralBilinearMultiheadAttention,
MultiHeadAttentionInefficient, TalkingHeadsAttentionInefficient) and
appendix A (TalkingHeadsAttentionWithDynamicProjections).  Weights use the
paper's index order, e.g. P_q[d_X, d_k, h] and P_o[d_Y, d_v, h]; every
function computes in float64 whatever it is given.

Additions to the paper, all optional:
  * leading batch dims ("...") on X and M;
  * `bias`: an additive term on the logits L, broadcastable to L's shape
    ([..., n, m] for dot-product attention, [..., n, m, h] otherwise), for
    causal masks, padding masks and relative position biases (see
    `causal_bias`, `segment_bias`, `relative_position_bias`).

Example:
  X = rng.randn(2, 5, 8)                              # X[b, n, d_X]
  Y = talking_heads_attention(X, X, P_q, P_k, P_v, P_o, P_l, P_w,
                              bias=causal_bias(5, 5)[..., None])
  # Y[b, n, d_Y]
"""
import math

import numpy as np

# mtf's visibility_mask_to_attention_bias uses -1e9 for hidden positions.
MASKED = -1e9


def _f64(*arrays):
  return [None if a is None else np.asarray(a, np.float64) for a in arrays]


def softmax(L, axis):
  """softmax(L, reduced_dim=axis), max-subtracted so -1e9 masks give 0."""
  L = np.asarray(L, np.float64)
  E = np.exp(L - L.max(axis=axis, keepdims=True))
  return E / E.sum(axis=axis, keepdims=True)


def _add_bias(L, bias):
  return L if bias is None else L + np.asarray(bias, np.float64)


def _identity_if_none(P, size):
  return np.eye(size) if P is None else P


def dot_product_attention(X, M, bias=None):
  """DotProductAttention (section 3.1).

  Args:
    X: X[..., n, d]
    M: M[..., m, d]
    bias: optional, broadcastable to L[..., n, m].
  Returns:
    Y[..., n, d]
  """
  X, M = _f64(X, M)
  L = _add_bias(np.einsum("...nd,...md->...nm", X, M), bias)  # logits
  W = softmax(L, axis=-1)                                      # weights
  Y = np.einsum("...nm,...md->...nd", W, M)
  return Y


def multi_head_attention(X, M, P_q, P_k, P_v, P_o, bias=None):
  """MultiHeadAttention (section 3.3), step by step.

  Args:
    X: X[..., n, d_X]
    M: M[..., m, d_M]
    P_q: P_q[d_X, d_k, h]
    P_k: P_k[d_M, d_k, h]
    P_v: P_v[d_M, d_v, h]
    P_o: P_o[d_Y, d_v, h]
    bias: optional, broadcastable to L[..., n, m, h].
  Returns:
    Y[..., n, d_Y]
  """
  X, M, P_q, P_k, P_v, P_o = _f64(X, M, P_q, P_k, P_v, P_o)
  Q = np.einsum("...nx,xkh->...nkh", X, P_q)               # queries
  K = np.einsum("...my,ykh->...mkh", M, P_k)               # keys
  V = np.einsum("...my,yvh->...mvh", M, P_v)               # values
  L = _add_bias(np.einsum("...nkh,...mkh->...nmh", Q, K), bias)  # logits
  W = softmax(L, axis=-2)                                  # weights
  O = np.einsum("...nmh,...mvh->...nvh", W, V)
  Y = np.einsum("...nvh,zvh->...nz", O, P_o)               # output
  return Y


def multi_head_attention_concise(X, M, P_q, P_k, P_v, P_o, bias=None):
  """MultiHeadAttentionConcise (section 3.3): two multi-way einsums."""
  X, M, P_q, P_k, P_v, P_o = _f64(X, M, P_q, P_k, P_v, P_o)
  L = _add_bias(np.einsum("...nx,...my,xkh,ykh->...nmh", X, M, P_q, P_k,
                          optimize=True), bias)
  W = softmax(L, axis=-2)
  Y = np.einsum("...nmh,...my,yvh,zvh->...nz", W, M, P_v, P_o, optimize=True)
  return Y


def talking_heads_attention(X, M, P_q, P_k, P_v, P_o, P_l=None, P_w=None,
                            bias=None):
  """TalkingHeadsAttention (section 4), step by step.

  P_l=None is the logits-only-absent case (L = J, needs h_k == h);
  P_w=None is the weights-only-absent case (U = W, needs h == h_v).

  Args:
    X: X[..., n, d_X]
    M: M[..., m, d_M]
    P_q: P_q[d_X, d_k, h_k]
    P_k: P_k[d_M, d_k, h_k]
    P_v: P_v[d_M, d_v, h_v]
    P_o: P_o[d_Y, d_v, h_v]
    P_l: P_l[h_k, h] or None.
    P_w: P_w[h, h_v] or None.
    bias: optional, broadcastable to L[..., n, m, h].
  Returns:
    Y[..., n, d_Y]
  """
  X, M, P_q, P_k, P_v, P_o, P_l, P_w = _f64(X, M, P_q, P_k, P_v, P_o, P_l,
                                            P_w)
  Q = np.einsum("...nx,xki->...nki", X, P_q)           # queries
  K = np.einsum("...my,yki->...mki", M, P_k)           # keys
  V = np.einsum("...my,yvj->...mvj", M, P_v)           # values
  J = np.einsum("...nki,...mki->...nmi", Q, K)         # dot prod.
  L = J if P_l is None else np.einsum("...nmi,ih->...nmh", J, P_l)  # T-h proj.
  L = _add_bias(L, bias)
  W = softmax(L, axis=-2)                              # attention weights
  U = W if P_w is None else np.einsum("...nmh,hj->...nmj", W, P_w)  # T-h proj.
  O = np.einsum("...nmj,...mvj->...nvj", U, V)
  Y = np.einsum("...nvj,zvj->...nz", O, P_o)
  return Y


def talking_heads_attention_concise(X, M, P_q, P_k, P_v, P_o, P_l=None,
                                    P_w=None, bias=None):
  """TalkingHeadsAttentionConcise (section 4); a missing P_l/P_w is I."""
  X, M, P_q, P_k, P_v, P_o, P_l, P_w = _f64(X, M, P_q, P_k, P_v, P_o, P_l,
                                            P_w)
  P_l = _identity_if_none(P_l, P_q.shape[-1])
  P_w = _identity_if_none(P_w, P_v.shape[-1])
  L = _add_bias(np.einsum("...nx,...my,xki,yki,ih->...nmh", X, M, P_q, P_k,
                          P_l, optimize=True), bias)
  W = softmax(L, axis=-2)
  Y = np.einsum("...nmh,...my,yvj,zvj,hj->...nz", W, M, P_v, P_o, P_w,
                optimize=True)
  return Y


def talking_heads_with_dynamic_projections(
    X, M, P_q, P_k, P_v, P_o, P_l=None, P_w=None, P_Xl=None, P_Ml=None,
    P_Xw=None, P_Mw=None, bias=None):
  """TalkingHeadsAttentionWithDynamicProjections (appendix A).

  Each of the four dynamic terms is optional (None = absent).  The paper's
  R_Ml is indexed by the memory position m and P_Mw reads M (its "[n" and
  "d_X" there are typos).  A dynamic logits term needs P_l, a dynamic
  weights term needs P_w.

  Args:
    X, M, P_q, P_k, P_v, P_o, P_l, P_w: as in talking_heads_attention.
    P_Xl: P_Xl[d_X, h_k, h] or None.
    P_Ml: P_Ml[d_M, h_k, h] or None.
    P_Xw: P_Xw[d_X, h, h_v] or None.
    P_Mw: P_Mw[d_M, h, h_v] or None.
    bias: optional, broadcastable to L[..., n, m, h].
  Returns:
    Y[..., n, d_Y]
  Raises:
    ValueError: if a dynamic term lacks its static projection.
  """
  if P_l is None and (P_Xl is not None or P_Ml is not None):
    raise ValueError("dynamic logits projections need P_l")
  if P_w is None and (P_Xw is not None or P_Mw is not None):
    raise ValueError("dynamic weights projections need P_w")
  (X, M, P_q, P_k, P_v, P_o, P_l, P_w, P_Xl, P_Ml, P_Xw,
   P_Mw) = _f64(X, M, P_q, P_k, P_v, P_o, P_l, P_w, P_Xl, P_Ml, P_Xw, P_Mw)
  Q = np.einsum("...nx,xki->...nki", X, P_q)           # queries
  K = np.einsum("...my,yki->...mki", M, P_k)           # keys
  V = np.einsum("...my,yvj->...mvj", M, P_v)           # values
  J = np.einsum("...nki,...mki->...nmi", Q, K)         # dot prod.
  R_Xl = None if P_Xl is None else np.einsum("...nx,xih->...nih", X, P_Xl)
  R_Ml = None if P_Ml is None else np.einsum("...my,yih->...mih", M, P_Ml)
  L = J if P_l is None else (
      np.einsum("...nmi,ih->...nmh", J, P_l) +                  # static
      (0 if R_Xl is None else np.einsum("...nmi,...nih->...nmh", J, R_Xl)) +
      (0 if R_Ml is None else np.einsum("...nmi,...mih->...nmh", J, R_Ml)))
  L = _add_bias(L, bias)
  W = softmax(L, axis=-2)                              # attention weights
  R_Xw = None if P_Xw is None else np.einsum("...nx,xhj->...nhj", X, P_Xw)
  R_Mw = None if P_Mw is None else np.einsum("...my,yhj->...mhj", M, P_Mw)
  U = W if P_w is None else (
      np.einsum("...nmh,hj->...nmj", W, P_w) +                  # static
      (0 if R_Xw is None else np.einsum("...nmh,...nhj->...nmj", W, R_Xw)) +
      (0 if R_Mw is None else np.einsum("...nmh,...mhj->...nmj", W, R_Mw)))
  O = np.einsum("...nmj,...mvj->...nvj", U, V)
  Y = np.einsum("...nvj,zvj->...nz", O, P_o)
  return Y


def general_bilinear_multihead_attention(X, M, P, Q, bias=None):
  """GeneralBilinearMultiheadAttention (section 6).

  Args:
    X: X[..., n, d_X]
    M: M[..., m, d_M]
    P: P[d_X, d_M, h]
    Q: Q[d_M, d_Y, h]
    bias: optional, broadcastable to L[..., n, m, h].
  Returns:
    Y[..., n, d_Y]
  """
  X, M, P, Q = _f64(X, M, P, Q)
  L = _add_bias(np.einsum("...nx,...my,xyh->...nmh", X, M, P, optimize=True),
                bias)
  W = softmax(L, axis=-2)
  Y = np.einsum("...nmh,...my,yzh->...nz", W, M, Q, optimize=True)
  return Y


def multi_head_attention_inefficient(X, M, P_q, P_k, P_v, P_o, bias=None):
  """MultiHeadAttentionInefficient (section 6): GBMA with P = P_q P_k."""
  P_q, P_k, P_v, P_o = _f64(P_q, P_k, P_v, P_o)
  P = np.einsum("xkh,ykh->xyh", P_q, P_k)
  Q = np.einsum("yvh,zvh->yzh", P_v, P_o)
  return general_bilinear_multihead_attention(X, M, P, Q, bias)


def talking_heads_attention_inefficient(X, M, P_q, P_k, P_v, P_o, P_l, P_w,
                                        bias=None):
  """TalkingHeadsAttentionInefficient (section 6): GBMA with 3 factors."""
  P_q, P_k, P_v, P_o, P_l, P_w = _f64(P_q, P_k, P_v, P_o, P_l, P_w)
  P = np.einsum("xki,yki,ih->xyh", P_q, P_k, P_l, optimize=True)
  Q = np.einsum("yvj,zvj,hj->yzh", P_v, P_o, P_w, optimize=True)
  return general_bilinear_multihead_attention(X, M, P, Q, bias)


# ------------------------------------------------------------------ biases
def causal_bias(n, m):
  """bias[n, m]: 0 where memory position <= query position, else -1e9."""
  return np.where(np.arange(m)[None, :] <= np.arange(n)[:, None], 0.0, MASKED)


def segment_bias(query_segments, memory_segments):
  """bias[..., n, m]: 0 where the segment ids agree, else -1e9.

  This is mtf's padding/packing mask: id 0 is padding, which then attends
  only to padding.

  Args:
    query_segments: int array [..., n].
    memory_segments: int array [..., m].
  Returns:
    float64 array [..., n, m]
  """
  same = (np.asarray(query_segments)[..., :, None]
          == np.asarray(memory_segments)[..., None, :])
  return np.where(same, 0.0, MASKED)


def relative_position_bucket(relative_position, bidirectional=True,
                             num_buckets=32, max_distance=128):
  """T5's bucketing of memory_position - query_position (int array)."""
  n = -np.asarray(relative_position, np.int64)
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int64) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide="ignore"):
    large = max_exact + (
        np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  return ret + np.where(is_small, n, large)


def relative_position_bias(values, n, m, bidirectional, max_distance=128):
  """bias[n, m, h] = values[h, bucket(m_position - n_position)].

  Args:
    values: the relative_attention_bias variable [h, num_buckets].
    n: query length.
    m: memory length.
    bidirectional: False for a causal (fully autoregressive) model.
    max_distance: as in T5.
  Returns:
    float64 array [n, m, h]
  """
  values = np.asarray(values, np.float64)
  relative = np.arange(m)[None, :] - np.arange(n)[:, None]
  buckets = relative_position_bucket(relative, bidirectional,
                                     values.shape[-1], max_distance)
  return np.moveaxis(values[:, buckets], 0, -1)
