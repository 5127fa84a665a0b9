"""Dynamic terms without their projection are an error, not dropped.

attention.compute_l adds einsum(J, R_l) to einsum(J, P_l) and compute_u adds
einsum(W, R_w) to einsum(W, P_w) (paper appendix A).  Without P_l (heads_k
and heads the same dim) or P_w (heads and heads_v the same dim) there is
nothing to add them to; before, the R tensors were silently ignored.  The
fast path of the default strategy (kernels.ordered_core) refuses the same
inputs.  With the projection present the dynamic terms are added: checked
against NumPy on a one-device mesh.
"""
from mtf_talking_heads.core import compat  # noqa: F401  (before mesh_tensorflow)
import mesh_tensorflow as mtf  # pylint: disable=g-bad-import-order
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import kernels

B, N, M, H, HV, D = 2, 3, 4, 3, 2, 5  # batch, n, m, heads (= heads_k), heads_v, d
# An R tensor needs two different heads dims; where the layer has only one,
# a misused R has this second one.
OTHER_HEADS = mtf.Dimension("other_heads", H)


def _dims():
  return attention.make_dims(("heads", H), ("heads", H), ("heads_v", HV),
                             D, D)


class _Graph(object):
  """A tiny mtf graph: named dims and NumPy arrays imported as mtf tensors."""

  def __init__(self):
    self.tf_graph = tf.Graph()
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "mesh")
    self.dims = _dims()
    self.batch = mtf.Dimension("batch", B)
    self.length = mtf.Dimension("length", N)
    self.memory_length = mtf.Dimension("memory_length", M)
    self.rng = np.random.RandomState(0)

  def tensor(self, dims):
    """(mtf tensor, its NumPy value) of random float32 with these dims."""
    value = self.rng.randn(*[d.size for d in dims]).astype(np.float32)
    with self.tf_graph.as_default():
      t = mtf.import_tf_tensor(self.mesh, tf.constant(value), mtf.Shape(dims))
    return t, value

  def run(self, tensor):
    with self.tf_graph.as_default():
      lowering = mtf.Lowering(self.graph, {
          self.mesh: harness.mesh_impl("model:1", "")})
      out = lowering.export_to_tf_tensor(tensor)
      with tf.Session() as sess:
        return sess.run(out)


@pytest.fixture()
def g():
  return _Graph()


def test_compute_l_refuses_dynamic_terms_without_p_l(g):
  dims = g.dims
  j, _ = g.tensor([g.batch, g.length, g.memory_length, dims.heads_k])
  r, _ = g.tensor([g.batch, g.length, OTHER_HEADS, dims.heads])
  with pytest.raises(ValueError) as e:
    attention.compute_l(j, None, dims, dynamic_l=[r])
  message = str(e.value)
  assert "dynamic_l" in message and "no P_l / P_w" in message
  assert "'heads'" in message and "drop the dynamic terms" in message
  assert attention.compute_l(j, None, dims) is j  # no dynamic terms: L = J


def test_compute_u_refuses_dynamic_terms_without_p_w(g):
  dims = g.dims.renamed({"heads_v": "heads"})  # heads == heads_v: no P_w
  w, _ = g.tensor([g.batch, g.length, g.memory_length, dims.heads])
  r, _ = g.tensor([g.batch, g.length, dims.heads, OTHER_HEADS])
  with pytest.raises(ValueError) as e:
    attention.compute_u(w, None, dims, dynamic_w=[r])
  message = str(e.value)
  assert "dynamic_w" in message and "no P_l / P_w" in message
  assert "'heads'" in message and "drop the dynamic terms" in message
  assert attention.compute_u(w, None, dims) is w  # no dynamic terms: U = W


def test_ordered_core_refuses_dynamic_terms_without_projection(g):
  dims = g.dims
  q, _ = g.tensor([g.batch, g.length, dims.heads_k, dims.d_k])
  k, _ = g.tensor([g.batch, g.memory_length, dims.heads_k, dims.d_k])
  v, _ = g.tensor([g.batch, g.memory_length, dims.heads_v, dims.d_v])
  r, _ = g.tensor([g.batch, g.length, OTHER_HEADS, dims.heads])
  with pytest.raises(ValueError) as e:
    kernels.ordered_core(q, k, v, g.memory_length, dims, p_l=None,
                          dynamic_l=[r])
  assert "no P_l / P_w" in str(e.value) and "'heads'" in str(e.value)


def test_dynamic_terms_are_added_with_their_projections(g):
  """L = J P_l + J R_Xl and U = W P_w + W R_Mw, against NumPy."""
  dims = attention.make_dims(("heads_k", 2), ("heads", H), ("heads_v", HV),
                             D, D)
  j, j_np = g.tensor([g.batch, g.length, g.memory_length, dims.heads_k])
  p_l, p_l_np = g.tensor([dims.heads_k, dims.heads])
  r_l, r_l_np = g.tensor([g.batch, g.length, dims.heads_k, dims.heads])
  w, w_np = g.tensor([g.batch, g.length, g.memory_length, dims.heads])
  p_w, p_w_np = g.tensor([dims.heads, dims.heads_v])
  r_w, r_w_np = g.tensor([g.batch, g.memory_length, dims.heads, dims.heads_v])
  l = attention.compute_l(j, p_l, dims, dynamic_l=[r_l])
  u = attention.compute_u(w, p_w, dims, dynamic_w=[r_w])
  l_np = (np.einsum("bnmk,kh->bnmh", j_np, p_l_np) +
          np.einsum("bnmk,bnkh->bnmh", j_np, r_l_np))
  u_np = (np.einsum("bnmh,hv->bnmv", w_np, p_w_np) +
          np.einsum("bnmh,bmhv->bnmv", w_np, r_w_np))
  np.testing.assert_allclose(g.run(l), l_np, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(g.run(u), u_np, rtol=1e-5, atol=1e-5)
