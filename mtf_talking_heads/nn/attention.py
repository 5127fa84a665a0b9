"""The paper's attention algorithms, one mtf op per line of its pseudocode.

Every function here takes mtf tensors and weights explicitly and creates no
variables, so it can be checked line by line against the paper (section 3,
4, 6 and appendix A) and against a NumPy transcription.  Tensors are named
after the paper: Q, K, V, J, L, W, U, O, Y; the weights P_q, P_k, P_v, P_o,
P_l, P_w and the dynamic-projection generators P_Xl, P_Ml, P_Xw, P_Mw.

Heads dimensions are plain ``mtf.Dimension``s whose *names* decide both the
algorithm and the layout:

  * P_l exists iff ``heads_k`` and ``heads`` are different dims;
  * P_w exists iff ``heads`` and ``heads_v`` are different dims.

So multi-head attention is ``heads_k = heads = heads_v = ("heads", h)``,
logits-only is ``heads_v = heads``, weights-only is ``heads_k = heads`` and
talking heads has three distinct names.  A gin layout rule such as
``heads:model`` shards whichever tensors carry that name.

Example (talking heads, h_k = h = h_v = 24, d_k = d_v = 32, d_model = 768):

  X: [batch, length, d_model]            M: [batch, memory_length, d_model]
  Q: [batch, length, heads_k, d_k]       K: [batch, memory_length, heads_k, d_k]
  V: [batch, memory_length, heads_v, d_v]
  J: [batch, length, memory_length, heads_k]
  L, W: [batch, length, memory_length, heads]
  U: [batch, length, memory_length, heads_v]
  O: [batch, length, heads_v, d_v]       Y: [batch, length, d_model]

Grouped talking heads (``dims.groups`` set, g groups): every heads dim is
the *per-group* size and every tensor with heads also carries ``groups``,
which the einsums carry like batch; only Y = einsum(O, P_o) reduces it too.
So P_l[groups, h_k, h] and P_w[groups, h, h_v] mix heads only within a
group: block-diagonal P_l[g h_k, g h] and P_w[g h, g h_v].  Example (h_k = h
= h_v = 24 in 8 groups of 3):

  Q: [batch, length, groups=8, heads_k=3, d_k]
  J: [batch, length, memory_length, groups, heads_k]
  P_l: [groups, heads_k, heads]           P_w: [groups, heads, heads_v]
  P_o: [groups, heads_v, d_v, d_model]    Y: [batch, length, d_model]

Logits, softmax and the talking-heads projections run in float32 whatever the
activation dtype (bfloat16 logits near 1e4 would otherwise lose all
precision; float64 activations stay float64); O and Y return to the
activation dtype.
"""
import collections

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import spec

DYNAMIC_TERMS = spec.DYNAMIC_TERMS


class AttentionDims(collections.namedtuple(
    "AttentionDims", ["heads_k", "heads", "heads_v", "d_k", "d_v", "groups"],
    defaults=(None,))):
  """The named dimensions of talking-heads attention.

  heads_k, heads, heads_v, d_k, d_v are the paper's h_k, h, h_v, d_k, d_v;
  groups is None (ungrouped) or the groups dim of grouped talking heads, in
  which case the three heads dims are per-group sizes.

  Example:
    AttentionDims(heads_k=Dimension("heads_k", 24), heads=Dimension("heads", 24),
                  heads_v=Dimension("heads_v", 24), d_k=Dimension("d_k", 32),
                  d_v=Dimension("d_v", 32))
    grouped, 8 groups of 3: heads_k=Dimension("heads_k", 3), ...,
      groups=Dimension("groups", 8)
  """

  @property
  def project_logits(self):
    return self.heads_k != self.heads

  @property
  def project_weights(self):
    return self.heads != self.heads_v

  @property
  def group_dims(self):
    """[groups] for grouped attention, else []: put before the heads dims."""
    return [self.groups] if self.groups is not None else []

  def renamed(self, mapping):
    """A copy with each dim whose name is a key of `mapping` renamed."""
    return AttentionDims(*[
        None if d is None else
        mtf.Dimension(mapping.get(d.name, d.name), d.size) for d in self])


def _to_dim(value, default_name, param):
  """An int, (name, size) pair or Dimension -> a Dimension of positive size."""
  return mtf.Dimension(*spec.dim_pair(value, default_name, param))


def _per_group(dims, groups):
  """dims (total heads) with each heads dim divided into `groups` groups.

  Raises:
    ValueError: naming `groups` and the heads dim it does not divide.
  """
  sizes = {}
  for param in ("heads_k", "heads", "heads_v"):
    dim = getattr(dims, param)
    if dim.size % groups.size:
      raise ValueError(
          "groups=%d does not divide %s=%d: each of heads_k, heads, heads_v "
          "must be a multiple of groups (they are the total heads, split "
          "into groups of %s / groups); choose groups among the common "
          "divisors, or change %s"
          % (groups.size, param, dim.size, param, param))
    sizes[param] = mtf.Dimension(dim.name, dim.size // groups.size)
  return dims._replace(groups=groups, **sizes)


def make_dims(heads_k, heads, heads_v, d_k, d_v, groups=None):
  """Builds and validates AttentionDims from ints, pairs or Dimensions.

  Args:
    heads_k: (name, size) pair or mtf.Dimension: heads of queries and keys.
    heads: (name, size) pair or mtf.Dimension: heads of logits and weights.
    heads_v: (name, size) pair or mtf.Dimension: heads of the values.
    d_k: int or (name, size) pair or mtf.Dimension: query/key channels.
    d_v: int or (name, size) pair or mtf.Dimension: value channels.
    groups: None (ungrouped), or int / (name, size) / Dimension: the number
      of groups g of grouped talking heads.  The heads sizes above are then
      the totals; the dims returned are per group (size / g), e.g.
      make_dims(24, 24, 24, 32, 32, groups=8).heads == Dimension("heads", 3).
  Returns:
    an AttentionDims
  Raises:
    ValueError: naming the parameter, if a size is not positive, two of
      the dims share a name but not a size, or groups does not divide a
      heads size.
  """
  dims = AttentionDims(
      _to_dim(heads_k, "heads_k", "heads_k"), _to_dim(heads, "heads", "heads"),
      _to_dim(heads_v, "heads_v", "heads_v"), _to_dim(d_k, "d_k", "d_k"),
      _to_dim(d_v, "d_v", "d_v"))
  if groups is not None:
    dims = _per_group(dims, _to_dim(groups, "groups", "groups"))
  by_name = {}
  for param, dim in zip(AttentionDims._fields, dims):
    if dim is None:
      continue
    other = by_name.setdefault(dim.name, (param, dim))
    if other[1].size != dim.size:
      raise ValueError(
          "%s and %s are both named %r but have sizes %d and %d: a dim name "
          "means one size. Give them the same size, or different names (a "
          "different name adds a talking-heads projection between them)."
          % (other[0], param, dim.name, other[1].size, dim.size))
  heads_names = (dims.heads_k.name, dims.heads.name, dims.heads_v.name)
  if dims.d_k.name in heads_names:
    raise ValueError("d_k may not share a name with a heads dim (%r)"
                     % dims.d_k.name)
  if dims.d_v.name in heads_names:
    raise ValueError("d_v may not share a name with a heads dim (%r)"
                     % dims.d_v.name)
  if dims.groups is not None and dims.groups.name in (
      heads_names + (dims.d_k.name, dims.d_v.name)):
    raise ValueError("groups may not share a name with a heads dim, d_k or "
                     "d_v (%r); name it e.g. 'groups'" % dims.groups.name)
  return dims


def check_dynamic(dynamic, dims):
  """Validates the dynamic-projection terms (appendix A) for these dims."""
  dynamic = tuple(dynamic or ())
  for term in dynamic:
    if term not in DYNAMIC_TERMS:
      raise ValueError("dynamic: unknown term %r; choose from %s"
                       % (term, ", ".join(DYNAMIC_TERMS)))
    if term.endswith("l") and not dims.project_logits:
      raise ValueError(
          "dynamic term %r adds to the logits projection P_l, which this "
          "layer lacks (heads_k and heads are the same dim %r): give them "
          "different names or drop %r" % (term, dims.heads.name, term))
    if term.endswith("w") and not dims.project_weights:
      raise ValueError(
          "dynamic term %r adds to the weights projection P_w, which this "
          "layer lacks (heads and heads_v are the same dim %r): give them "
          "different names or drop %r" % (term, dims.heads.name, term))
  if len(set(dynamic)) != len(dynamic):
    raise ValueError("dynamic: repeated term in %r" % (dynamic,))
  return dynamic


def _float32(x):
  """x in at least float32: bfloat16 is widened, float64 is kept."""
  return x if x.dtype in (tf.float32, tf.float64) else mtf.cast(x, tf.float32)


def compute_q(x, p_q, d_x):
  """Q[n, d_k, h_k] = einsum(X[n, d_X], P_q[d_X, d_k, h_k])."""
  return mtf.einsum([x, p_q], reduced_dims=[d_x])


def compute_k(m, p_k, d_m):
  """K[m, d_k, h_k] = einsum(M[m, d_M], P_k[d_M, d_k, h_k])."""
  return mtf.einsum([m, p_k], reduced_dims=[d_m])


def compute_v(m, p_v, d_m):
  """V[m, d_v, h_v] = einsum(M[m, d_M], P_v[d_M, d_v, h_v])."""
  return mtf.einsum([m, p_v], reduced_dims=[d_m])


def compute_j(q, k, dims):
  """J[n, m, h_k] = einsum(Q[n, d_k, h_k], K[m, d_k, h_k]), in float32."""
  return mtf.einsum([_float32(q), _float32(k)], reduced_dims=[dims.d_k])


def compute_r(a, p_dynamic, d_a):
  """R_Xl[n, h_k, h] = einsum(X[n, d_X], P_Xl[d_X, h_k, h]) (and R_Ml, R_Xw, R_Mw)."""
  return _float32(mtf.einsum([a, p_dynamic], reduced_dims=[d_a]))


def fold_dynamic(p, dynamic, reduced=None):
  """The projections to einsum J (or W) with: P + R_0, then the other R's.

  Appendix A writes L = einsum(J, P_l) + einsum(J, R_Xl) + einsum(J, R_Ml),
  one n x m x h_k x h einsum per term.  An R that has no memory-length dim
  (R_Xl[n, h_k, h]) can be added to P_l before the einsum at the cost of
  n x h_k x h additions, so L = einsum(J, P_l + R_Xl) costs what the static
  projection alone does -- the count of the paper's dynamic tables.  This
  folds the static projection into the first R, as mesh_tensorflow's
  TalkingHeadsSelfAttention.talking_heads does; callers list the X-dependent
  R first, so R_Xl (R_Xw) is folded when present, else R_Ml (R_Mw).  A
  memory-dependent R after it stays its own einsum: folding it too would
  build an [n, m, h_k, h] projection (n x m x h_k x h numbers, h_k x h
  times J's size) for no fewer multiplies.

  Example:
    p: P_l[heads_k=12, heads=12]; dynamic: [R_Xl[batch, length, heads_k,
    heads], R_Ml[batch, memory_length, heads_k, heads]] ->
    [P_l + R_Xl: [batch, length, heads_k, heads], R_Ml]

  Args:
    p: P_l[h_k, h] or P_w[h, h_v]; None: no projection (the two heads dims
      are one dim), so the result is empty.
    dynamic: the R tensors that add to p (float32), X-dependent first.
    reduced: the heads dim p reduces (heads_k or heads), for the error.
  Returns:
    a list of float32 tensors, 1 + max(0, len(dynamic) - 1) long ([] when
    p is None).
  Raises:
    ValueError: dynamic terms without p (they would be dropped).
  """
  if p is None:
    if dynamic:
      raise ValueError(
          "%d dynamic R tensor(s) (dynamic_l / dynamic_w) but no P_l / P_w "
          "to add them to: the heads dims on either side are the same dim "
          "%r; name them differently (heads_k, heads, heads_v) or drop the "
          "dynamic terms" % (len(dynamic), getattr(reduced, "name", reduced)))
    return []
  p = _float32(p)
  if not dynamic:
    return [p]
  return [p + dynamic[0]] + list(dynamic[1:])


def compute_l(j, p_l, dims, dynamic_l=(), bias=None):
  """L[n, m, h] = einsum(J, P_l + R_Xl) + einsum(J, R_Ml) (appendix A, folded).

  The dynamic terms are folded as fold_dynamic says: one einsum of J per
  projection fold_dynamic returns.  Without P_l (heads_k == heads) L is J.

  Args:
    j: J[..., n, m, h_k] float32.
    p_l: P_l[h_k, h] or None.
    dims: AttentionDims.
    dynamic_l: R_Xl[n, h_k, h] / R_Ml[m, h_k, h] tensors (float32).
    bias: optional additive bias on L (masks, relative positions); any shape
      broadcastable to L's, carrying `heads` if per-head.
  Returns:
    L[..., n, m, h] float32
  Raises:
    ValueError: if dynamic_l is given without p_l (the dynamic terms add to
      P_l, so without it they would be dropped).
  """
  l = _project(j, p_l, dynamic_l, dims.heads_k)
  if bias is not None:
    l += _float32(bias)
  return l


def _project(x, p, dynamic, reduced):
  """einsum(x, P + R_0) + einsum(x, R_1) ...; x itself without P.

  Shared by compute_l (x = J, reduced heads_k) and compute_u (W, heads).
  """
  y = x
  for i, q in enumerate(fold_dynamic(p, dynamic, reduced)):
    term = mtf.einsum([x, q], reduced_dims=[reduced])
    y = term if i == 0 else y + term
  return y


def compute_w(l, memory_length):
  """W[n, m, h] = softmax(L[n, m, h], reduced_dim=m), in float32.

  Computed as exp(L - max L) / sum, not as mtf.softmax's exp(L - logsumexp L):
  with |L| near 1e4 the latter keeps only ~1e-3 relative precision in float32
  (the spacing of floats near 1e4), the former ~1e-7.
  """
  shifted = l - mtf.stop_gradient(mtf.reduce_max(l, reduced_dim=memory_length))
  e = mtf.exp(shifted)
  return e / mtf.reduce_sum(e, reduced_dim=memory_length)


def compute_u(w, p_w, dims, dynamic_w=()):
  """U[n, m, h_v] = einsum(W, P_w + R_Xw) + einsum(W, R_Mw) (folded as in L).

  Without P_w (heads == heads_v) U is W.

  Args:
    w: W[..., n, m, h] float32.
    p_w: P_w[h, h_v] or None.
    dims: AttentionDims.
    dynamic_w: R_Xw[n, h, h_v] / R_Mw[m, h, h_v] tensors (float32).
  Returns:
    U[..., n, m, h_v] float32
  Raises:
    ValueError: if dynamic_w is given without p_w (the dynamic terms add to
      P_w, so without it they would be dropped).
  """
  return _project(w, p_w, dynamic_w, dims.heads)


def compute_o(u, v, memory_length):
  """O[n, d_v, h_v] = einsum(U[n, m, h_v], V[m, d_v, h_v]), in V's dtype."""
  if u.dtype != v.dtype:
    u = mtf.cast(u, v.dtype)
  return mtf.einsum([u, v], reduced_dims=[memory_length])


def compute_y(o, p_o, dims):
  """Y[n, d_Y] = einsum(O[n, d_v, h_v], P_o[d_Y, d_v, h_v]).

  Grouped: Y[n, d_Y] = einsum(O[n, g, d_v, h_v], P_o[d_Y, g, d_v, h_v]), the
  one einsum that reduces `groups`.
  """
  return mtf.einsum([o, p_o],
                    reduced_dims=dims.group_dims + [dims.heads_v, dims.d_v])


def dropout_weights(u, train, rate, broadcast_dims=()):
  """Dropout on the attention weights U (broadcast over `broadcast_dims`)."""
  if not train or not rate:
    return u
  return mtf.dropout(u, train, rate=rate,
                     noise_shape=u.shape - list(broadcast_dims))


def attention_core(q, k, v, memory_length, dims, p_l=None, p_w=None,
                   dynamic_l=(), dynamic_w=(), bias=None, dropout_fn=None):
  """J, L, W, U, O of TalkingHeadsAttention[WithDynamicProjections].

  This is the part whose tensors have both length dims (n x m x heads);
  sharding strategies rename dims of its inputs and of O around it.

  Args:
    q: Q[..., n, h_k, d_k]
    k: K[..., m, h_k, d_k]
    v: V[..., m, h_v, d_v]
    memory_length: the m dimension.
    dims: AttentionDims (heads names as seen by q, k, v).
    p_l: P_l[h_k, h] or None.
    p_w: P_w[h, h_v] or None.
    dynamic_l: R_Xl / R_Ml tensors.
    dynamic_w: R_Xw / R_Mw tensors.
    bias: optional additive bias on L.
    dropout_fn: optional function applied to U before O.
  Returns:
    O[..., n, h_v, d_v]
  """
  j = compute_j(q, k, dims)
  l = compute_l(j, p_l, dims, dynamic_l, bias)
  w = compute_w(l, memory_length)
  u = compute_u(w, p_w, dims, dynamic_w)
  if dropout_fn is not None:
    u = dropout_fn(u)
  return compute_o(u, v, memory_length)


def talking_heads_attention(x, m, weights, dims, d_x, memory_length,
                            bias=None):
  """TalkingHeadsAttention(WithDynamicProjections) of the paper, end to end.

  Args:
    x: X[..., n, d_X]
    m: M[..., m, d_M] (d_M has the same name as d_X when X and M share a width;
      m's length dim must be `memory_length`)
    weights: dict with "p_q", "p_k", "p_v", "p_o" and optionally "p_l",
      "p_w", "p_xl", "p_ml", "p_xw", "p_mw".
    dims: AttentionDims.
    d_x: the d_X (= d_M = d_Y) dimension.
    memory_length: the m dimension.
    bias: optional additive bias on L.
  Returns:
    Y[..., n, d_Y]
  """
  q = compute_q(x, weights["p_q"], d_x)
  k = compute_k(m, weights["p_k"], d_x)
  v = compute_v(m, weights["p_v"], d_x)
  dynamic_l = [compute_r(a, weights[name], d_x)
               for a, name in ((x, "p_xl"), (m, "p_ml")) if name in weights]
  dynamic_w = [compute_r(a, weights[name], d_x)
               for a, name in ((x, "p_xw"), (m, "p_mw")) if name in weights]
  o = attention_core(q, k, v, memory_length, dims, weights.get("p_l"),
                     weights.get("p_w"), dynamic_l, dynamic_w, bias)
  return compute_y(o, weights["p_o"], dims)


def general_bilinear_logits(x, m, p, d_x, d_m):
  """L[n, m, h] = einsum(X[n, d_X], M[m, d_M], P[d_X, d_M, h]), in float32.

  Computed as (X P) M: n*d_X*d_M*h + n*m*d_M*h multiplies.

  Args:
    x: X[..., n, d_X]
    m: M[..., m, d_M] with d_M named differently from d_X.
    p: P[d_X, d_M, h]
    d_x: the d_X dimension.
    d_m: the d_M dimension.
  Returns:
    L[..., n, m, h]
  """
  xp = mtf.einsum([x, p], reduced_dims=[d_x])
  return mtf.einsum([_float32(xp), _float32(m)], reduced_dims=[d_m])


def general_bilinear_output(w, m, q, heads, memory_length, d_m):
  """Y[n, d_Y] = einsum(W[n, m, h], M[m, d_M], Q[d_M, d_Y, h]).

  Computed as (W M) Q: n*m*d_M*h + n*d_M*d_Y*h multiplies.
  """
  if w.dtype != m.dtype:
    w = mtf.cast(w, m.dtype)
  wm = mtf.einsum([w, m], reduced_dims=[memory_length])
  return mtf.einsum([wm, q], reduced_dims=[d_m, heads])


def general_bilinear_attention(x, m, p, q, heads, d_x, d_m, memory_length,
                               bias=None, dropout_fn=None):
  """GeneralBilinearMultiheadAttention of the paper (section 6).

  Args:
    x: X[..., n, d_X]
    m: M[..., m, d_M] (d_M named differently from d_X)
    p: P[d_X, d_M, h]
    q: Q[d_M, d_Y, h]
    heads: the h dimension.
    d_x: the d_X dimension (also d_Y).
    d_m: the d_M dimension.
    memory_length: the m dimension.
    bias: optional additive bias on L.
    dropout_fn: optional function applied to W.
  Returns:
    Y[..., n, d_Y]
  """
  l = general_bilinear_logits(x, m, p, d_x, d_m)
  if bias is not None:
    l += _float32(bias)
  w = compute_w(l, memory_length)
  if dropout_fn is not None:
    w = dropout_fn(w)
  return general_bilinear_output(w, m, q, heads, memory_length, d_m)
