"""The attention layers against the paper's pseudocode (tests/_reference.py).

Three groups, each case named after what it proves:

1. Paper identities in NumPy float64 (concise == step by step, talking
   heads with identity projections == multi-head, the "Inefficient" GBMA
   forms == the efficient ones, dynamic projections == per-query P_l/P_w,
   causal mask == attending to the prefix).
2. Every mtf layer variant inside a Unitransformer equals the float64
   reference on the X it actually received, with its own variables read back
   from the graph: once as a decoder (causal mask) and once bidirectional
   with packed/padded sequences (segment mask); relative position bias too.
3. The same identities in mtf: two layers run on the same X with weights
   mapped from one to the other (`Twins`).

All mtf graphs are built once per module (two Unitransformers).
"""
from mtf_talking_heads.core import compat  # noqa: F401  (before mesh_tensorflow)
import mesh_tensorflow as mtf  # pylint: disable=g-bad-import-order
import numpy as np
import pytest

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
import _equiv_util as eu
import _strategy_util as su
import _reference as ref

TOL = 1e-5  # float32 graph vs float64 reference, relative to max |Y|
D_MODEL, LENGTH, BATCH, VOCAB = 8, 6, 2, 32
TH_DIMS = dict(heads_k=3, heads=4, heads_v=5, d_k=6, d_v=7)


# ------------------------------------------------------------ 1. NumPy
def _rand(rng, *shape):
  return rng.randn(*shape)


@pytest.fixture(scope="module")
def np_case():
  """Random cross-attention operands: n != m, d_X != d_M != d_Y."""
  rng = np.random.RandomState(0)
  b, n, m, d_x, d_m, d_y = 2, 5, 6, 7, 6, 5
  h_k, h, h_v, d_k, d_v = 3, 4, 5, 6, 7
  s = 0.5
  return dict(
      X=_rand(rng, b, n, d_x), M=_rand(rng, b, m, d_m),
      P_q=s * _rand(rng, d_x, d_k, h_k), P_k=s * _rand(rng, d_m, d_k, h_k),
      P_v=s * _rand(rng, d_m, d_v, h_v), P_o=s * _rand(rng, d_y, d_v, h_v),
      P_l=_rand(rng, h_k, h), P_w=_rand(rng, h, h_v),
      P_Xl=s * _rand(rng, d_x, h_k, h), P_Ml=s * _rand(rng, d_m, h_k, h),
      P_Xw=s * _rand(rng, d_x, h, h_v), P_Mw=s * _rand(rng, d_m, h, h_v),
      # multi-head weights (one heads dim, h = 4)
      Q_q=s * _rand(rng, d_x, d_k, h), Q_k=s * _rand(rng, d_m, d_k, h),
      Q_v=s * _rand(rng, d_m, d_v, h), Q_o=s * _rand(rng, d_y, d_v, h),
      bias=_rand(rng, b, n, m, h))


def _th(c, **over):
  kw = {k: c[k] for k in ("P_q", "P_k", "P_v", "P_o", "P_l", "P_w")}
  kw.update(over)
  return kw


def _mh(c):
  return dict(P_q=c["Q_q"], P_k=c["Q_k"], P_v=c["Q_v"], P_o=c["Q_o"])


def _np_identities():
  """(id, function(case) -> (actual, expected))."""

  def mha_concise(c):
    return (ref.multi_head_attention_concise(c["X"], c["M"], **_mh(c),
                                             bias=c["bias"]),
            ref.multi_head_attention(c["X"], c["M"], **_mh(c),
                                     bias=c["bias"]))

  def th_concise(c):
    return (ref.talking_heads_attention_concise(c["X"], c["M"], **_th(c),
                                                bias=c["bias"]),
            ref.talking_heads_attention(c["X"], c["M"], **_th(c),
                                        bias=c["bias"]))

  def th_identity_is_mha(c):
    h = c["Q_q"].shape[-1]
    return (ref.talking_heads_attention(c["X"], c["M"], **_mh(c),
                                        P_l=np.eye(h), P_w=np.eye(h),
                                        bias=c["bias"]),
            ref.multi_head_attention(c["X"], c["M"], **_mh(c),
                                     bias=c["bias"]))

  def th_without_projections_is_mha(c):
    return (ref.talking_heads_attention(c["X"], c["M"], **_mh(c)),
            ref.multi_head_attention(c["X"], c["M"], **_mh(c)))

  def mha_inefficient(c):
    return (ref.multi_head_attention_inefficient(c["X"], c["M"], **_mh(c),
                                                 bias=c["bias"]),
            ref.multi_head_attention(c["X"], c["M"], **_mh(c),
                                     bias=c["bias"]))

  def th_inefficient(c):
    return (ref.talking_heads_attention_inefficient(c["X"], c["M"], **_th(c),
                                                    bias=c["bias"]),
            ref.talking_heads_attention(c["X"], c["M"], **_th(c),
                                        bias=c["bias"]))

  def logits_only_is_identity_p_w(c):
    h = c["P_l"].shape[1]
    kw = _th(c, P_v=c["Q_v"], P_o=c["Q_o"])
    del kw["P_w"]
    return (ref.talking_heads_attention(c["X"], c["M"], **kw),
            ref.talking_heads_attention(c["X"], c["M"], **kw, P_w=np.eye(h)))

  def weights_only_is_identity_p_l(c):
    h = c["P_w"].shape[0]
    kw = _th(c, P_q=c["Q_q"], P_k=c["Q_k"])
    del kw["P_l"]
    return (ref.talking_heads_attention(c["X"], c["M"], **kw),
            ref.talking_heads_attention(c["X"], c["M"], **kw, P_l=np.eye(h)))

  def dynamic_without_terms_is_th(c):
    return (ref.talking_heads_with_dynamic_projections(
        c["X"], c["M"], **_th(c), bias=c["bias"]),
            ref.talking_heads_attention(c["X"], c["M"], **_th(c),
                                        bias=c["bias"]))

  def dynamic_x_terms_are_per_query_projections(c):
    # x2l/x2w: query n uses P_l + R_Xl[n] and P_w + R_Xw[n]
    dyn = ref.talking_heads_with_dynamic_projections(
        c["X"], c["M"], **_th(c), P_Xl=c["P_Xl"], P_Xw=c["P_Xw"],
        bias=c["bias"])
    rows = np.zeros_like(dyn)
    for b in range(c["X"].shape[0]):
      for n in range(c["X"].shape[1]):
        x = c["X"][b, n]
        rows[b, n] = ref.talking_heads_attention(
            x[None], c["M"][b], **_th(
                c, P_l=c["P_l"] + np.einsum("x,xih->ih", x, c["P_Xl"]),
                P_w=c["P_w"] + np.einsum("x,xhj->hj", x, c["P_Xw"])),
            bias=c["bias"][b, n][None])[0]
    return dyn, rows

  def dynamic_m_terms_are_per_key_projections(c):
    # m2l/m2w with a single memory position: P_l + R_Ml[0], P_w + R_Mw[0]
    m = c["M"][:, :1]
    dyn = ref.talking_heads_with_dynamic_projections(
        c["X"], m, **_th(c), P_Ml=c["P_Ml"], P_Mw=c["P_Mw"])
    out = np.stack([ref.talking_heads_attention(
        c["X"][b], m[b], **_th(
            c, P_l=c["P_l"] + np.einsum("y,yih->ih", m[b, 0], c["P_Ml"]),
            P_w=c["P_w"] + np.einsum("y,yhj->hj", m[b, 0], c["P_Mw"])))
                    for b in range(m.shape[0])])
    return dyn, out

  def single_head_identity_mha_is_dot_product(c):
    x, m = c["X"][..., :6], c["M"]
    eye = np.eye(6)[:, :, None]
    return (ref.multi_head_attention(x, m, eye, eye, eye, eye),
            ref.dot_product_attention(x, m))

  def causal_mask_is_attending_to_prefix(c):
    x = c["M"][:, :5]  # self-attention: d_X = d_M
    kw = _th(c, P_q=c["P_k"][:, ::-1])
    masked = ref.talking_heads_attention(
        x, x, **kw, bias=ref.causal_bias(5, 5)[..., None])
    prefix = np.stack([ref.talking_heads_attention(
        x[:, n:n + 1], x[:, :n + 1], **kw)[:, 0] for n in range(5)], 1)
    return masked, prefix

  return [(f.__name__, f) for f in (
      mha_concise, th_concise, th_identity_is_mha,
      th_without_projections_is_mha, mha_inefficient, th_inefficient,
      logits_only_is_identity_p_w, weights_only_is_identity_p_l,
      dynamic_without_terms_is_th, dynamic_x_terms_are_per_query_projections,
      dynamic_m_terms_are_per_key_projections,
      single_head_identity_mha_is_dot_product,
      causal_mask_is_attending_to_prefix)]


@pytest.mark.parametrize("identity", [f for _, f in _np_identities()],
                         ids=[i for i, _ in _np_identities()])
def test_paper_identity_numpy(np_case, identity):
  actual, expected = identity(np_case)
  assert np.max(np.abs(expected)) > 1e-3  # not a vacuous 0 == 0
  np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-12)


def test_reference_dynamic_term_needs_static_projection(np_case):
  c = np_case
  kw = _th(c)
  del kw["P_l"]
  with pytest.raises(ValueError, match="P_l"):
    ref.talking_heads_with_dynamic_projections(c["X"], c["M"], **kw,
                                               P_Xl=c["P_Xl"])


def test_reference_softmax_masks_and_sums_to_one():
  w = ref.softmax(np.array([[3.0, ref.MASKED, -2.0], [1e4, -1e4, 0.0]]), -1)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-15)
  assert w[0, 1] == 0.0 and w[1, 0] == 1.0


def test_reference_relative_buckets_match_t5_examples():
  # bidirectional, 32 buckets: 0..7 exact, then log buckets, >= 128 saturate
  rel = np.array([0, 1, 7, 8, 127, 128, 1000, -1, -7, -8, -1000])
  got = ref.relative_position_bucket(rel, bidirectional=True, num_buckets=32)
  # memory after query (rel > 0) lands in the upper half (offset 16)
  np.testing.assert_array_equal(got, [0, 17, 23, 24, 31, 31, 31, 1, 7, 8,
                                      15])
  causal = ref.relative_position_bucket(rel, bidirectional=False,
                                        num_buckets=32)
  np.testing.assert_array_equal(causal[:7], 0)  # future positions: bucket 0
  np.testing.assert_array_equal(causal[7:], [1, 7, 8, 31])


# ------------------------------------------------------------ 2. layers
def _dyn(*terms):
  return lambda: layers.DynamicProjectionsAttention(
      dynamic=terms, dynamic_init_scale=1.0, **TH_DIMS)


# (id, layer factory, reference function)
VARIANTS = [
    ("multi_head_h4_dk3_dv5",
     lambda: layers.MultiHeadAttention(heads=4, d_k=3, d_v=5),
     ref.multi_head_attention),
    ("talking_heads_hk3_h4_hv5_dk6_dv7",
     lambda: layers.TalkingHeadsAttention(**TH_DIMS),
     ref.talking_heads_attention),
    ("logits_projection_only_hk3_h4",
     lambda: layers.ProjectLogitsAttention(heads_k=3, heads=4, d_k=6, d_v=7),
     ref.talking_heads_attention),
    ("weights_projection_only_h4_hv5",
     lambda: layers.ProjectWeightsAttention(heads=4, heads_v=5, d_k=6, d_v=7),
     ref.talking_heads_attention),
    ("general_bilinear_h3",
     lambda: layers.GeneralBilinearAttention(heads=3),
     ref.general_bilinear_multihead_attention),
    ("dynamic_x2l_only", _dyn("x2l"),
     ref.talking_heads_with_dynamic_projections),
    ("dynamic_m2l_only", _dyn("m2l"),
     ref.talking_heads_with_dynamic_projections),
    ("dynamic_x2w_only", _dyn("x2w"),
     ref.talking_heads_with_dynamic_projections),
    ("dynamic_m2w_only", _dyn("m2w"),
     ref.talking_heads_with_dynamic_projections),
    ("dynamic_all_four", _dyn("x2l", "m2l", "x2w", "m2w"),
     ref.talking_heads_with_dynamic_projections),
    ("talking_heads_relative_bias",
     lambda: layers.TalkingHeadsAttention(
         relative_attention_type="bias", relative_attention_num_buckets=8,
         **TH_DIMS),
     ref.talking_heads_attention),
    ("multi_head_relative_bias",
     lambda: layers.MultiHeadAttention(
         heads=4, d_k=3, d_v=5, relative_attention_type="bias",
         relative_attention_num_buckets=8),
     ref.multi_head_attention),
]
VARIANT_IDS = [v[0] for v in VARIANTS]

# packed batch: row 0 holds two sequences and one pad, row 1 one sequence
# and two pads (id 0 = padding, which mtf lets attend only to padding)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])


class ConciseAttention(layers.AttentionLayer):
  """The paper's *Concise* forms as two multi-way mtf einsums (train mode).

  L = einsum(X, M, P_q, P_k[, P_l]); W = softmax(L); Y = einsum(W, M, P_v,
  P_o[, P_w]).  Same variables (names, shapes) as AttentionLayer.
  """

  def call(self, context, x, losses=None):
    w = self.make_weights(context)
    d = context.model.model_dim
    d_m = mtf.Dimension(d.name + "_m", d.size)
    memory_length = self.memory_length(context)
    m = mtf.rename_dimension(
        mtf.replace_dimensions(x, context.length_dim, memory_length),
        d.name, d_m.name)
    p_k = mtf.rename_dimension(w["p_k"], d.name, d_m.name)
    p_v = mtf.rename_dimension(w["p_v"], d.name, d_m.name)
    l_shape = mtf.Shape(context.batch_dims + [context.length_dim,
                                              memory_length, self.dims.heads])
    l = mtf.einsum([x, m, w["p_q"], p_k] + [w[k] for k in ("p_l",) if k in w],
                   output_shape=l_shape)
    l += self.compute_bias(
        context, self.rename_length_to_memory_length(context.position,
                                                     context),
        x, [self.dims.heads], None)
    weights = mtf.softmax(l, memory_length)
    return mtf.einsum(
        [weights, m, p_v, w["p_o"]] + [w[k] for k in ("p_w",) if k in w],
        output_shape=x.shape)


def _paper_gbma_from(paper):
  """Our GBMA variables p, q for the paper's factored P and Q."""
  return {"p": paper["P"].transpose(0, 2, 1),
          "q": paper["Q"].transpose(0, 2, 1)}


def _twins():
  """[(id, layer a, layer b, a's variables -> b's variables)]."""
  def copy(va):
    return dict(va)

  def th_identity(va):
    h = va["p_q"].shape[1]
    return dict(va, p_l=np.eye(h), p_w=np.eye(h))

  def inefficient(layer_a):
    def f(va):
      w = eu.paper_weights(layer_a, va)
      if "P_l" in w:
        paper = {"P": np.einsum("xki,yki,ih->xyh", w["P_q"], w["P_k"],
                                w["P_l"]),
                 "Q": np.einsum("yvj,zvj,hj->yzh", w["P_v"], w["P_o"],
                                w["P_w"])}
      else:
        paper = {"P": np.einsum("xkh,ykh->xyh", w["P_q"], w["P_k"]),
                 "Q": np.einsum("yvh,zvh->yzh", w["P_v"], w["P_o"])}
      return _paper_gbma_from(paper)
    return f

  mha = layers.MultiHeadAttention(heads=4, d_k=3, d_v=5)
  th = layers.TalkingHeadsAttention(**TH_DIMS)
  return [
      ("th_with_identity_projections_equals_multi_head", mha,
       layers.TalkingHeadsAttention(heads_k=4, heads=4, heads_v=4, d_k=3,
                                    d_v=5), th_identity),
      ("multi_head_inefficient_gbma_equals_multi_head", mha,
       layers.GeneralBilinearAttention(heads=4), inefficient(mha)),
      ("talking_heads_inefficient_gbma_equals_talking_heads", th,
       layers.GeneralBilinearAttention(heads=4), inefficient(th)),
      ("multi_head_concise_equals_step_by_step",
       layers.MultiHeadAttention(heads=4, d_k=3, d_v=5),
       ConciseAttention(heads_k=("heads", 4), heads=("heads", 4),
                        heads_v=("heads", 4), d_k=3, d_v=5), copy),
      ("talking_heads_concise_equals_step_by_step",
       layers.TalkingHeadsAttention(**TH_DIMS), ConciseAttention(**TH_DIMS),
       copy),
  ]


@pytest.fixture(scope="module")
def causal_run():
  """A decoder (causal) Unitransformer: every variant, then the twins."""
  probes = [eu.Probe(make(), "v%02d" % i)
            for i, (_, make, _) in enumerate(VARIANTS)]
  twins_spec = _twins()
  twins = [eu.Twins(a, b, "t%02d" % i)
           for i, (_, a, b, _) in enumerate(twins_spec)]
  h = harness.Harness(probes + twins, d_model=D_MODEL, vocab=VOCAB,
                      batch=BATCH, length=LENGTH, autoregressive=True,
                      seed=11, config=su.session_config())
  values = h.variable_values()
  assign = {}
  for t, (_, _, _, mapping) in zip(twins, twins_spec):
    va = eu.layer_values(values, t.scope("a"))
    names_b = eu.full_names(values, t.scope("b"))
    for short, value in mapping(va).items():
      assign[names_b[short]] = value
  h.assign(assign)
  tensors = {}
  for i, p in enumerate(probes):
    tensors["x%d" % i], tensors["y%d" % i] = p.x, p.y
  for i, t in enumerate(twins):
    tensors["tx%d" % i], tensors["ta%d" % i], tensors["tb%d" % i] = (
        t.x, t.y_a, t.y_b)
  out = eu.run(h, eu.export(h, tensors))
  yield dict(h=h, probes=probes, twins=twins, out=out,
             values=h.variable_values())
  h.close()


@pytest.fixture(scope="module")
def padded_run():
  """A bidirectional Unitransformer over a packed batch with padding."""
  probes = [eu.Probe(make(), "v%02d" % i, sequence_id=SEGMENTS)
            for i, (_, make, _) in enumerate(VARIANTS)]
  h = harness.Harness(probes, d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                      length=LENGTH, autoregressive=False, seed=12,
                      config=su.session_config())
  tensors = {}
  for i, p in enumerate(probes):
    tensors["x%d" % i], tensors["y%d" % i] = p.x, p.y
  out = eu.run(h, eu.export(h, tensors))
  yield dict(h=h, probes=probes, out=out, values=h.variable_values())
  h.close()


def _expected(run, i, reference, mask_bias, static_only=False):
  """The reference Y of variant i on the X it saw (static_only: no P_X*/P_M*)."""
  probe = run["probes"][i]
  v = eu.layer_values(run["values"], probe.scope)
  x = run["out"]["x%d" % i]
  bias = mask_bias
  if getattr(probe.inner, "relative_attention_type", None):
    bias = bias + ref.relative_position_bias(
        v["relative_attention_bias"], LENGTH, LENGTH,
        bidirectional=not probe.fully_autoregressive)
  weights = eu.paper_weights(probe.inner, v)
  if static_only:
    weights = {k: w for k, w in weights.items() if k[:3] not in ("P_X", "P_M")}
  return reference(x, x, **weights, bias=bias)


@pytest.mark.parametrize("i", [i for i, v in enumerate(VARIANTS)
                               if v[0].startswith("dynamic")],
                         ids=[v[0] for v in VARIANTS
                              if v[0].startswith("dynamic")])
def test_dynamic_terms_are_not_negligible(causal_run, i):
  """Dropping the dynamic terms changes Y by far more than TOL."""
  _, _, reference = VARIANTS[i]
  mask = ref.causal_bias(LENGTH, LENGTH)[..., None]
  assert eu.max_rel_err(
      _expected(causal_run, i, reference, mask, static_only=True),
      _expected(causal_run, i, reference, mask)) > 100 * TOL


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=VARIANT_IDS)
def test_decoder_layer_equals_reference_with_causal_mask(causal_run, i):
  _, _, reference = VARIANTS[i]
  assert causal_run["probes"][i].fully_autoregressive
  expected = _expected(causal_run, i, reference,
                       ref.causal_bias(LENGTH, LENGTH)[..., None])
  actual = causal_run["out"]["y%d" % i]
  assert eu.max_rel_err(actual, expected) < TOL
  # the mask matters: without it the reference is far off
  unmasked = _expected(causal_run, i, reference, 0.0)
  assert eu.max_rel_err(actual, unmasked) > 1e-2


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=VARIANT_IDS)
def test_bidirectional_layer_equals_reference_with_padding_mask(padded_run,
                                                                i):
  _, _, reference = VARIANTS[i]
  assert not padded_run["probes"][i].fully_autoregressive
  mask = ref.segment_bias(SEGMENTS, SEGMENTS)[..., None]
  expected = _expected(padded_run, i, reference, mask)
  actual = padded_run["out"]["y%d" % i]
  assert eu.max_rel_err(actual, expected) < TOL
  unmasked = _expected(padded_run, i, reference, 0.0)
  assert eu.max_rel_err(actual, unmasked) > 1e-2


@pytest.mark.parametrize("i", range(len(_twins())),
                         ids=[t[0] for t in _twins()])
def test_paper_identity_in_mtf(causal_run, i):
  out = causal_run["out"]
  y_a, y_b = out["ta%d" % i], out["tb%d" % i]
  assert np.max(np.abs(y_a)) > 1e-2
  assert eu.max_rel_err(y_b, y_a) < TOL
