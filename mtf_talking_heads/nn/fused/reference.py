"""The fused core's interface, written in plain TF ops (its definition).

Layouts (G = groups, 1 when ungrouped; heads dims are per group):
  q: [B, G, Hk, N, Dk]     k: [B, G, Hk, M, Dk]     v: [B, G, Hv, M, Dv]
  p_l: [G, Hk, H] or None (then H = Hk)
  p_w: [G, H, Hv] or None (then Hv = H)
  bias: [Bb, Hb, N, M] or None, Bb in {1, B}, Hb in {1, G * H} (heads
    group-major: index g * H + h), added to L before the softmax.
  returns O: [B, G, Hv, N, Dv]

The paper's section 4, heads-major:
  J[b,g,hk,n,m] = sum_dk Q[b,g,hk,n,dk] K[b,g,hk,m,dk]
  L[b,g,h,n,m]  = sum_hk J[b,g,hk,n,m] P_l[g,hk,h] + bias
  W             = softmax over m of L
  U[b,g,hv,n,m] = sum_h W[b,g,h,n,m] P_w[g,h,hv]
  O[b,g,hv,n,dv]= sum_m U[b,g,hv,n,m] V[b,g,hv,m,dv]

Example (talking heads, B=2, G=1, h_k = h = h_v = 4, n = m = 8, d = 16):
  o = core(q, k, v, p_l, p_w, bias)   # o: [2, 1, 4, 8, 16]
"""
import tensorflow.compat.v1 as tf


def core(q, k, v, p_l=None, p_w=None, bias=None):
  """O from Q, K, V, P_l, P_w and an additive bias (shapes: module doc)."""
  j = tf.einsum("bgind,bgimd->bginm", q, k)                         # J
  l = j if p_l is None else tf.einsum("bgknm,gkh->bghnm", j, p_l)   # L
  if bias is not None:
    batch, groups, heads = (tf.shape(l)[0], tf.shape(l)[1],
                            tf.shape(l)[2])
    bias_heads = tf.shape(bias)[1]
    # [Bb, Hb, N, M] -> [Bb, G, H, N, M] (or [Bb, 1, 1, N, M]).
    shaped = tf.reshape(bias, tf.stack([
        tf.shape(bias)[0],
        tf.where(tf.equal(bias_heads, 1), 1, groups),
        tf.where(tf.equal(bias_heads, 1), 1, heads),
        tf.shape(bias)[2], tf.shape(bias)[3]]))
    del batch
    l += shaped
  w = tf.nn.softmax(l, axis=-1)                                     # W
  u = w if p_w is None else tf.einsum("bghnm,ghv->bgvnm", w, p_w)   # U
  return tf.einsum("bgvnm,bgvmd->bgvnd", u, v)                      # O
