"""Folded dynamic projections: the code runs the n x m einsums costs.py counts.

attention.fold_dynamic adds the static P_l (P_w) to the first dynamic R
(R_Xl if present, else R_Ml) so that L = einsum(J, P_l + R_Xl) +
einsum(J, R_Ml), as mesh_tensorflow's TalkingHeadsSelfAttention does.  Here,
for every subset of dynamic terms, on a one-device mesh:
  * both cores (attention.attention_core, kernels.ordered_core) build
    exactly as many einsums over n x m x heads tensors as
    costs.attention_terms(fold_dynamic="code") lists, and
  * their O equals the unfolded NumPy pseudocode (one einsum per term).
The layer-level equalities (tests/_reference.py, mtf's own layer, sharded ==
unsharded) live in test_reference.py, test_mtf_equivalence.py,
test_strategies.py and test_sharded.py.
"""
import itertools

from mtf_talking_heads.core import compat  # noqa: F401  (before mesh_tensorflow)
import mesh_tensorflow as mtf  # pylint: disable=g-bad-import-order
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.estimate import costs
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import kernels

B, N, M, HK, H, HV, DK, DV = 2, 3, 4, 2, 3, 4, 5, 6
SUBSETS = [s for r in range(1, 5)
           for s in itertools.combinations(attention.DYNAMIC_TERMS, r)]
CORES = {"attention_core": attention.attention_core,
         "ordered_core": kernels.ordered_core}


def _softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _numpy_core(v, dynamic):
  """O[b, n, h_v, d_v] of appendix A's pseudocode, one einsum per term."""
  l = np.einsum("bnmk,kh->bnmh", v["j"], v["p_l"])
  if "x2l" in dynamic:
    l += np.einsum("bnmk,bnkh->bnmh", v["j"], v["r_xl"])
  if "m2l" in dynamic:
    l += np.einsum("bnmk,bmkh->bnmh", v["j"], v["r_ml"])
  w = _softmax(l, axis=2)
  u = np.einsum("bnmh,hv->bnmv", w, v["p_w"])
  if "x2w" in dynamic:
    u += np.einsum("bnmh,bnhv->bnmv", w, v["r_xw"])
  if "m2w" in dynamic:
    u += np.einsum("bnmh,bmhv->bnmv", w, v["r_mw"])
  return np.einsum("bnmv,bmve->bnve", u, v["v"])


class _Core(object):
  """One core on random inputs with `dynamic` terms, in a fresh graph."""

  def __init__(self, core, dynamic):
    self.tf_graph = tf.Graph()
    graph = mtf.Graph()
    self.mesh = mtf.Mesh(graph, "mesh")
    self.rng = np.random.RandomState(len(dynamic))
    self.dims = attention.make_dims(("heads_k", HK), ("heads", H),
                                    ("heads_v", HV), DK, DV)
    d = self.dims
    b, n, m = (mtf.Dimension("batch", B), mtf.Dimension("length", N),
               mtf.Dimension("memory_length", M))
    self.n, self.m = n, m
    self.values = {}
    with self.tf_graph.as_default():
      q = self._tensor("q", [b, n, d.heads_k, d.d_k])
      k = self._tensor("k", [b, m, d.heads_k, d.d_k])
      v = self._tensor("v", [b, m, d.heads_v, d.d_v])
      p_l = self._tensor("p_l", [d.heads_k, d.heads])
      p_w = self._tensor("p_w", [d.heads, d.heads_v])
      shapes = {"x2l": [b, n, d.heads_k, d.heads],
                "m2l": [b, m, d.heads_k, d.heads],
                "x2w": [b, n, d.heads, d.heads_v],
                "m2w": [b, m, d.heads, d.heads_v]}
      r = {t: self._tensor("r_" + t[0] + t[2], shapes[t]) for t in dynamic}
      self.values["j"] = np.einsum("bnkd,bmkd->bnmk", self.values["q"],
                                   self.values["k"])
      self.graph = graph
      self.o = core(q, k, v, m, d, p_l, p_w,
                    [r[t] for t in ("x2l", "m2l") if t in r],
                    [r[t] for t in ("x2w", "m2w") if t in r])

  def _tensor(self, name, dims):
    value = self.rng.randn(*[x.size for x in dims]).astype(np.float32)
    self.values[name] = value
    return mtf.import_tf_tensor(self.mesh, tf.constant(value), mtf.Shape(dims))

  def n_by_m_einsums(self):
    """Contractions from and to n x m x heads tensors (J.P, J.R, W.P, W.R)."""
    count = 0
    for op in self.graph.operations:
      if not isinstance(op, mtf.EinsumOperation):
        continue
      big = [t for t in op.inputs
             if self.n in t.shape.dims and self.m in t.shape.dims]
      out = op.outputs[0].shape.dims
      reduced = [x for t in op.inputs for x in t.shape.dims if x not in out]
      # (mtf also lowers broadcast multiplies such as softmax's divide to
      # einsums; those reduce nothing)
      if big and self.n in out and self.m in out and reduced:
        count += 1
    return count

  def run(self):
    with self.tf_graph.as_default():
      lowering = mtf.Lowering(self.graph, {
          self.mesh: harness.mesh_impl("model:1", "")})
      out = lowering.export_to_tf_tensor(self.o)
      with tf.Session() as sess:
        value = sess.run(out)
    order = ["batch", "length", "heads_v", "d_v"]
    names = [d.name for d in self.o.shape.dims]
    return value.transpose([names.index(name) for name in order])


def _costs_einsums(dynamic):
  terms = costs.attention_terms("talking_heads", HK, H, HV, DK, DV, 7, 9,
                                dynamic=dynamic)
  return sum(1 for name in terms["multiplies"]
             if name in ("L", "U", "L_Xl", "L_Ml", "U_Xw", "U_Mw"))


@pytest.mark.parametrize("core_name", sorted(CORES))
@pytest.mark.parametrize("dynamic", SUBSETS, ids="+".join)
def test_core_runs_the_einsums_costs_counts(core_name, dynamic):
  core = _Core(CORES[core_name], dynamic)
  expected = _costs_einsums(dynamic)
  # one per projection, plus R_Ml (R_Mw) when its X term is there too
  assert expected == 2 + ("x2l" in dynamic and "m2l" in dynamic) + (
      "x2w" in dynamic and "m2w" in dynamic)
  assert core.n_by_m_einsums() == expected


@pytest.mark.parametrize("core_name", sorted(CORES))
@pytest.mark.parametrize("dynamic", [("x2l", "m2l", "x2w", "m2w"), ("m2l",),
                                     ("x2w",), ("x2l", "m2w")], ids="+".join)
def test_folded_core_equals_unfolded_numpy(core_name, dynamic):
  core = _Core(CORES[core_name], dynamic)
  got = core.run()                                  # [b, n, h_v, d_v]
  want = _numpy_core(core.values, dynamic)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_fold_dynamic_lists_p_plus_first_r_then_the_rest():
  core = _Core(CORES["attention_core"], ())
  with core.tf_graph.as_default():
    p = core._tensor("p", [core.dims.heads_k, core.dims.heads])  # pylint: disable=protected-access
    assert attention.fold_dynamic(p, [])[0].shape == p.shape
    r1 = core._tensor("r1", [core.n, core.dims.heads_k, core.dims.heads])  # pylint: disable=protected-access
    r2 = core._tensor("r2", [core.m, core.dims.heads_k, core.dims.heads])  # pylint: disable=protected-access
    folded = attention.fold_dynamic(p, [r1, r2])
  assert len(folded) == 2 and folded[1] is r2
  assert folded[0].shape.dims == [core.n, core.dims.heads_k, core.dims.heads]
