"""The attention kernels of the strategies' cores: fast, exact forms of the pseudocode.

attention.py writes the paper's J, L, W, U, O one op per line; the sharding
strategies (nn/strategies) run the same algorithm with ordered_core, whose
n x m x heads tensors are heads-major ([batch, heads, n, m]), whose heads
projections are batched matmuls with P-first gradients (project_heads) and
whose softmax is one fused op (softmax_last).  Nothing here knows about
meshes or layouts: a kernel takes mtf tensors and returns mtf tensors equal
to attention.attention_core's (tests/strategies/test_kernel_ranks.py,
tests/nn/test_gradients.py, tests/strategies/test_sharded.py).

Example (talking heads, h_k = h = h_v = 4, n = m = 8):
  o = ordered_core(q, k, v, memory_length, dims, p_l=p_l, p_w=p_w)
  # q: [batch, length, heads_k, d_k] ... o: [batch, length, heads_v, d_v]
"""
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import core_kernel


_float32 = attention._float32  # pylint: disable=protected-access  (bf16 widened, float64 kept)


def project_heads(p, x, reduced, new):
  """einsum(P[reduced, new], X[..., reduced, ...]) -> [..., new, ...], fast.

  The talking-heads projections (L = J P_l, U = W P_w) have a contraction of
  only h_k (or h) over an n x m x heads tensor, so on CPU their cost is
  memory traffic, and any transpose of the big operand doubles it.  Here the
  output keeps X's dim order with `reduced` replaced by `new`, P is
  broadcast over X's leading dims (a few KB) so that they are batch dims of
  one batched matmul, and the gradients are written P-first
  (dX = einsum(P, dY), dP = einsum(X, dY)): mtf's default gradient puts dY
  first, for which tf.einsum transposes dX of n x m x heads elements.

  Args:
    p: P[..., reduced, new] (P_l[h_k, h] or P_w[h, h_v], maybe with shard
      dims that X also has).
    x: X[lead..., reduced, rest...].
    reduced: the dim summed over.
    new: the dim P adds.
  Returns:
    [lead..., new, rest...]
  """
  dims = x.shape.dims
  lead = dims[:dims.index(reduced)]
  p = mtf.broadcast(p, lead + [d for d in p.shape.dims if d not in lead])
  output_shape = mtf.Shape(lead + [new] + dims[len(lead) + 1:])

  def fn(p, x):
    return mtf.einsum([p, x], output_shape=output_shape)

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
              output_grads):
    del all_inputs, forward_operations, outputs
    p, x = explicit_inputs
    dy = output_grads[0]
    return [mtf.einsum([x, dy], output_shape=p.shape),
            mtf.einsum([p, dy], output_shape=x.shape)]

  return mtf.custom_gradient(fn, grad_fn, [p, x])


def on_rows(fn):
  """fn applied to its inputs viewed as rows [-1, innermost dim], reshaped back.

  TF's CPU kernels are not all rank-free: with oneDNN (TF 2.15's default on
  recent Intel CPUs, or TF_ENABLE_ONEDNN_OPTS=1) Softmax accepts at most 5
  dims ("Input dims must be <= 5 and >=1"), and a split core's n x m x heads
  slices have 6 (batch, core_shard, batch_per_shard, heads, n, m).  A row
  view of a contiguous tensor is free, and a row-wise fn gives the same
  numbers.

  Args:
    fn: a function of tf tensors of one shape [..., m] that works row by
      row over the innermost dim and returns a tensor of that shape.
  Returns:
    A function of the same tensors that hands fn 2-D [-1, m] views.
  """
  def rows_fn(*xs):
    shape = xs[0].shape.as_list()  # mtf slices have static shapes
    rows = [tf.reshape(x, [-1, shape[-1]]) for x in xs]
    return tf.reshape(fn(*rows), shape)
  return rows_fn


def _softmax_grad(w, dy):
  """dL = W (dW - sum_m dW W) for rows W = softmax(L), dW = dy."""
  return w * (dy - tf.reduce_sum(dy * w, -1, keepdims=True))


def softmax_last(logits, memory_length):
  """W = softmax(L) over memory_length, L's innermost dim, as one TF op.

  attention.compute_w (like mtf.softmax) is five mtf ops (max, subtract,
  exp, sum, divide), each a pass over the n x m x heads tensor, and as many
  again in the backward pass; tf.nn.softmax makes two, and the gradient
  dL = W (dW - sum_m dW W) one slicewise op.  memory_length may not be
  split across devices.  Both run on 2-D [-1, memory_length] views of the
  slices (on_rows), so no kernel sees more than the 5 dims oneDNN's Softmax
  accepts, whatever the strategy adds.
  """
  if logits.shape.dims[-1] != memory_length:
    raise ValueError("softmax_last needs memory_length innermost, got %s"
                     % logits.shape)
  splittable = logits.shape.dims[:-1]

  def grad_fn(op, dy):
    w = op.outputs[0]
    return [mtf.slicewise(
        on_rows(_softmax_grad), [w, dy], output_shape=w.shape,
        output_dtype=w.dtype, splittable_dims=splittable, grad_function=0,
        name="softmax_grad")]

  return mtf.slicewise(on_rows(tf.nn.softmax), [logits],
                       output_shape=logits.shape, output_dtype=logits.dtype,
                       splittable_dims=splittable, grad_function=grad_fn,
                       name="softmax")


def _mix_heads(x, p, reduced, new, dynamic):
  """L from J (P_l, R_Xl, R_Ml) or U from W (P_w, R_Xw, R_Mw), heads-major.

  Args:
    x: J or W, [lead..., reduced, rest...].
    p: P_l or P_w, [reduced, new]; None: x itself (no projection).
    reduced: heads_k (J) or heads (W).
    new: heads (L) or heads_v (U).
    dynamic: the dynamic R tensors of this projection (with `reduced` and
      `new`), X-dependent first, folded by attention.fold_dynamic: the first
      is added to p before project_heads, the rest each as einsum(x, R).
  Returns:
    [lead..., new, rest...], or x when p is None.
  Raises:
    ValueError: if `dynamic` is given without p (it would be dropped).
  """
  folded = attention.fold_dynamic(p, dynamic, reduced)
  if not folded:
    return x
  y = project_heads(folded[0], x, reduced, new)
  for r in folded[1:]:
    y += mtf.einsum([x, r], output_shape=y.shape)
  return y


def ordered_core(q, k, v, memory_length, dims, p_l=None, p_w=None,
                 dynamic_l=(), dynamic_w=(), bias=None, dropout_fn=None,
                 fused_softmax=True, layout=None):
  """attention.attention_core with its n x m x heads tensors heads-major.

  The same J, L, W, U, O (section 4 of the paper, appendix A for the dynamic
  terms), each one line, but J is built as [lead..., h_k, n..., m] (lead:
  the batch-like dims Q and K share, n...: the query dims), so that
  J = Q K^T, O = U V and the projections (project_heads) are batched
  matmuls whose big operands tf.einsum never transposes, and the softmax
  reduces the innermost dim.  The paper's layout ([batch, n, m, heads], as
  attention.attention_core builds it) makes tf.einsum transpose J, dJ, dL,
  dW and dU (whole n x m x heads tensors) every step; docs/sharding.md has
  the measured step times (benchmarks/sharding.py).

  Args:
    q, k, v, memory_length, dims, p_l, p_w, dynamic_l, dynamic_w, bias,
    dropout_fn: as attention.attention_core.
    fused_softmax: W by softmax_last (tf.nn.softmax on 2-D row views; needs
      memory_length unsplit), else by attention.compute_w (exp(L - max L) /
      sum in mtf ops, which a split memory_length can reduce across).
    layout: the MeshLayout the core's tensors are laid out by (None:
      unsplit), for core_kernel's choice.
  Returns:
    O[lead..., h_v, n..., d_v]

  The whole core is one fused op per slice instead (core_kernel.FusedCore:
  no n x m x heads tensor is kept) where mtf_th.core_kernel.kind allows and
  the call fits it (core_kernel.fused_or_none).
  """
  o = core_kernel.fused_or_none(q, k, v, memory_length, dims, p_l, p_w,
                                dynamic_l, dynamic_w, bias, dropout_fn,
                                layout)
  if o is not None:
    return o
  q, k = _float32(q), _float32(k)
  skip = (dims.heads_k, dims.d_k, memory_length)
  lead = [d for d in q.shape.dims if d in k.shape.dims and d not in skip]
  lead += [d for d in k.shape.dims if d not in q.shape.dims and d not in skip]
  query = [d for d in q.shape.dims if d not in k.shape.dims and d not in skip]
  j = mtf.einsum([q, k], output_shape=lead + [dims.heads_k] + query +
                 [memory_length])                                    # J
  l = _mix_heads(j, p_l, dims.heads_k, dims.heads, dynamic_l)        # L
  if bias is not None:
    l += _float32(bias)
  if fused_softmax:
    w = softmax_last(l, memory_length)                               # W
  else:
    w = attention.compute_w(l, memory_length)
  u = _mix_heads(w, p_w, dims.heads, dims.heads_v, dynamic_w)        # U
  if dropout_fn is not None:
    u = dropout_fn(u)
  return attention.compute_o(u, v, memory_length)                    # O
