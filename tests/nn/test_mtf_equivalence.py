"""Our layers == mesh-tensorflow 0.1.21's own attention layers.

mtf 0.1.21 ships `SelfAttention` (multi-head, q/k/v/o stored with the heads
and channel dims combined), `TalkingHeadsSelfAttention` (key/softmax/value
heads dims, optional dynamic projections) and `GeneralBilinearSelfAttention`:
an implementation independent of ours.  For each pair we build one tiny
Unitransformer with mtf's layer and one with ours, copy every variable from
mtf's model into ours (mapping names, reshaping combined dims, transposing),
and require the same loss, logits, attention sub-layer output and the
gradient of every variable (mapped the same way).  float32 throughout (mtf
runs its softmax in bfloat16 under bfloat16 activations, ours in float32, so
they are only comparable in float32), teacher-forced ("train") mode, where
mtf's memory-dependent dynamic projections are right.
"""
import collections

from mtf_talking_heads.core import compat  # noqa: F401  (before mesh_tensorflow)
from mesh_tensorflow.transformer import transformer_layers as tl  # pylint: disable=g-bad-import-order
import numpy as np
import pytest

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
import _equiv_util as eu
import _strategy_util as su

D_MODEL, LENGTH, BATCH, VOCAB = 8, 6, 2, 32
OUT_TOL = 1e-5   # loss, logits, attention output (relative to max |.|)
GRAD_TOL = 1e-5  # each variable's gradient (relative to its max |.|)

Pair = collections.namedtuple(
    "Pair", ["mtf_layers", "our_layers", "mapping", "autoregressive"])


def _reshape_to(shape):
  return lambda a: a.reshape(shape)


def _identity(a):
  return a


def _multi_head_map(mtf_layer, our_shapes):
  """mtf SelfAttention (combine_dims=True): q [d_model, heads*d_kv] etc."""
  del mtf_layer
  mapping = {ours: (theirs, _reshape_to(our_shapes[ours]))
             for ours, theirs in (("p_q", "q"), ("p_k", "k"), ("p_v", "v"),
                                  ("p_o", "o"))}
  if "relative_attention_bias" in our_shapes:
    mapping["relative_attention_bias"] = ("relative_attention_bias",
                                          _identity)
  return mapping


def _talking_heads_map(mtf_layer, our_shapes):
  """mtf TalkingHeadsSelfAttention: q/kernel ... y/kernel, logits/kernel.

  Its dynamic projections are `<logits|weights>/<...>_dynamic_<i>/kernel`,
  numbered over the enabled terms in the order x then m.
  """
  names = {"p_q": "q/kernel", "p_k": "k/kernel", "p_v": "v/kernel",
           "p_o": "y/kernel", "p_l": "logits/kernel",
           "p_w": "weights/kernel",
           "relative_attention_bias": "relative_attention_bias"}
  dynamic = mtf_layer.dynamic_projections
  for kind, terms in (("logits", (("x2l", "p_xl"), ("m2l", "p_ml"))),
                      ("weights", (("x2w", "p_xw"), ("m2w", "p_mw")))):
    enabled = [ours for term, ours in terms if term in dynamic]
    for i, ours in enumerate(enabled):
      names[ours] = "%s/%s_dynamic_%d/kernel" % (kind, kind, i)
  return {ours: (names[ours], _identity) for ours in our_shapes}


def _general_bilinear_map(mtf_layer, our_shapes):
  """mtf GBMA: q/kernel [_d_model, heads, d_model] is our p[d_model, heads,
  d_model_m]; y/kernel [heads, _d_model, d_model] is our q[d_model_m, heads,
  d_model] transposed."""
  del mtf_layer, our_shapes
  return {"p": ("q/kernel", _identity),
          "q": ("y/kernel", lambda a: a.transpose(1, 0, 2))}


def _th_dims(heads_k, heads, heads_v):
  return dict(key_heads_dims=[heads_k], softmax_heads_dims=[heads],
              value_heads_dims=[heads_v], key_size=6, value_size=7)


def _mtf_dynamic(*terms):
  return tl.TalkingHeadsSelfAttention(
      dynamic_projections=list(terms), dynamic_projections_init_scale=1.0,
      **_th_dims(("heads_k", 3), ("heads", 4), ("heads_v", 5)))


def _our_dynamic(*terms):
  return layers.DynamicProjectionsAttention(
      dynamic=terms, heads_k=3, heads=4, heads_v=5, d_k=6, d_v=7)


ALL_FOUR = ("x2l", "m2l", "x2w", "m2w")

PAIRS = {
    "multi_head_h4_dkv3": Pair(
        lambda: [tl.SelfAttention(num_heads=4, key_value_size=3)],
        lambda: [layers.MultiHeadAttention(heads=4, d_k=3, d_v=3)],
        _multi_head_map, True),
    "talking_heads_hk3_h4_hv5_dk6_dv7": Pair(
        lambda: [tl.TalkingHeadsSelfAttention(
            **_th_dims(("heads_k", 3), ("heads", 4), ("heads_v", 5)))],
        lambda: [layers.TalkingHeadsAttention(
            heads_k=3, heads=4, heads_v=5, d_k=6, d_v=7)],
        _talking_heads_map, True),
    "logits_projection_only": Pair(
        lambda: [tl.TalkingHeadsSelfAttention(
            **_th_dims(("heads_k", 3), ("heads", 4), ("heads", 4)))],
        lambda: [layers.ProjectLogitsAttention(heads_k=3, heads=4, d_k=6,
                                               d_v=7)],
        _talking_heads_map, True),
    "weights_projection_only": Pair(
        lambda: [tl.TalkingHeadsSelfAttention(
            **_th_dims(("heads", 4), ("heads", 4), ("heads_v", 5)))],
        lambda: [layers.ProjectWeightsAttention(heads=4, heads_v=5, d_k=6,
                                                d_v=7)],
        _talking_heads_map, True),
    "dynamic_all_four": Pair(
        lambda: [_mtf_dynamic(*ALL_FOUR)],
        lambda: [_our_dynamic(*ALL_FOUR)],
        _talking_heads_map, True),
    "dynamic_each_term_alone": Pair(
        lambda: [_mtf_dynamic(t) for t in ALL_FOUR],
        lambda: [_our_dynamic(t) for t in ALL_FOUR],
        _talking_heads_map, True),
    "general_bilinear_h3": Pair(
        lambda: [tl.GeneralBilinearSelfAttention(heads_dims=[("heads", 3)])],
        lambda: [layers.GeneralBilinearAttention(heads=3)],
        _general_bilinear_map, True),
    "multi_head_relative_bias_bidirectional": Pair(
        lambda: [tl.SelfAttention(num_heads=4, key_value_size=3,
                                  relative_attention_type="bias",
                                  relative_attention_num_buckets=8)],
        lambda: [layers.MultiHeadAttention(heads=4, d_k=3, d_v=3,
                                           relative_attention_type="bias",
                                           relative_attention_num_buckets=8)],
        _multi_head_map, False),
    "talking_heads_relative_bias_causal": Pair(
        lambda: [tl.TalkingHeadsSelfAttention(
            relative_attention_type="bias", relative_attention_num_buckets=8,
            **_th_dims(("heads_k", 3), ("heads", 4), ("heads_v", 5)))],
        lambda: [layers.TalkingHeadsAttention(
            heads_k=3, heads=4, heads_v=5, d_k=6, d_v=7,
            relative_attention_type="bias",
            relative_attention_num_buckets=8)],
        _talking_heads_map, True),
}


def _build(layer_list, autoregressive, seed):
  probes = [eu.Probe(layer, "att%d" % i) for i, layer in enumerate(layer_list)]
  # same token ids in both models; different seeds, so only the copy of the
  # variables can make them agree
  ids = np.random.RandomState(0).randint(1, VOCAB, size=(BATCH, LENGTH))
  h = harness.Harness(probes, d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                      length=LENGTH, autoregressive=autoregressive, seed=seed,
                      inputs=ids, config=su.session_config())
  return h, probes


def _fetch(h, probes):
  names = ["loss", "logits"] + ["grad:" + n for n in h.grads]
  out = h.fetch(names)
  out.update(eu.run(h, eu.export(h, {"y%d" % i: p.y
                                     for i, p in enumerate(probes)})))
  return out


@pytest.fixture(scope="module", params=list(PAIRS), ids=list(PAIRS))
def pair(request):
  """Both models, ours loaded with mtf's weights; fetched results of each."""
  spec = PAIRS[request.param]
  theirs, their_probes = _build(spec.mtf_layers(), spec.autoregressive, 21)
  ours, our_probes = _build(spec.our_layers(), spec.autoregressive, 22)
  their_values = theirs.variable_values()
  our_values = ours.variable_values()
  # our variable name -> (mtf variable name, transform of values and grads)
  links = {}
  for name in our_values:
    hits = [i for i, p in enumerate(our_probes) if "/" + p.scope in name]
    if not hits:
      links[name] = (name, _identity)  # embeddings, layer norms
      continue
    i, = hits
    scope = our_probes[i].scope  # the same in both models
    prefix, short = name.split(scope)
    our_shapes = {k: v.shape for k, v in
                  eu.layer_values(our_values, scope).items()}
    theirs_short, fn = spec.mapping(their_probes[i].inner, our_shapes)[short]
    links[name] = (prefix + scope + theirs_short, fn)
  assign = {}
  for name, (their_name, fn) in links.items():
    value = fn(their_values[their_name])
    assert value.shape == our_values[name].shape, (name, their_name)
    assign[name] = value
  ours.assign(assign)
  yield dict(links=links, their_values=their_values,
             theirs=_fetch(theirs, their_probes), ours=_fetch(ours,
                                                              our_probes),
             n_layers=len(our_probes))
  theirs.close()
  ours.close()


def test_variable_mapping_is_one_to_one(pair):
  used = [their for their, _ in pair["links"].values()]
  assert sorted(used) == sorted(pair["their_values"])


def test_same_loss_logits_and_attention_output(pair):
  theirs, ours = pair["theirs"], pair["ours"]
  np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=OUT_TOL)
  assert eu.max_rel_err(ours["logits"], theirs["logits"]) < OUT_TOL
  for i in range(pair["n_layers"]):
    assert eu.max_rel_err(ours["y%d" % i], theirs["y%d" % i]) < OUT_TOL, i


def test_same_gradient_of_every_variable(pair):
  theirs, ours = pair["theirs"], pair["ours"]
  errors = {}
  for name, (their_name, fn) in pair["links"].items():
    ours_grad = ours["grad:" + name]
    assert np.max(np.abs(ours_grad)) > 0, name
    errors[name] = eu.max_rel_err(ours_grad, fn(theirs["grad:" + their_name]))
  bad = {k: e for k, e in errors.items() if e >= GRAD_TOL}
  assert not bad, bad
