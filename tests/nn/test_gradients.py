"""Gradients of every attention variant, and bfloat16 robustness.

1. Finite differences in float64: each variant sits in a float64 causal
   Unitransformer (master and activation dtype tf.float64); for every
   variable of the layer and a few random unit directions d, the central
   difference (loss(w + eps d) - loss(w - eps d)) / 2 eps must equal
   <grad, d>.  The token embedding is checked too: its gradient reaches every
   layer's input X, so it covers dLoss/dX of all of them.
2. bfloat16 activations with attention logits scaled to about 1e4 (P_q, or
   GBMA's P, multiplied up): outputs, loss, logits and all gradients stay
   finite and every softmax output W is a distribution over memory
   positions (sums to 1).  W and L are recorded by wrapping
   attention.compute_w while the graph is built.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn import layers
import _equiv_util as eu
import _strategy_util as su

D_MODEL, LENGTH, BATCH, VOCAB = 8, 5, 2, 32
EPS = 1e-5          # float64 central differences
FD_TOL = 1e-7       # |fd - <grad, d>| relative to |grad|
DIRECTIONS = 3
BIG_LOGIT = 1e4
MASKED_BELOW = -1e8  # mtf masks logits with -1e9
TH = dict(heads_k=3, heads=4, heads_v=5, d_k=6, d_v=7)

VARIANTS = {
    "multi_head": lambda: layers.MultiHeadAttention(heads=4, d_k=3, d_v=5),
    "talking_heads": lambda: layers.TalkingHeadsAttention(**TH),
    "logits_projection_only": lambda: layers.ProjectLogitsAttention(
        heads_k=3, heads=4, d_k=6, d_v=7),
    "weights_projection_only": lambda: layers.ProjectWeightsAttention(
        heads=4, heads_v=5, d_k=6, d_v=7),
    "general_bilinear": lambda: layers.GeneralBilinearAttention(heads=3),
    "dynamic_all_four": lambda: layers.DynamicProjectionsAttention(
        dynamic_init_scale=1.0, **TH),
    "talking_heads_relative_bias": lambda: layers.TalkingHeadsAttention(
        relative_attention_type="bias", relative_attention_num_buckets=8,
        **TH),
}
NAMES = list(VARIANTS)


def _harness(probes, **kwargs):
  return harness.Harness(probes, d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                         length=LENGTH, autoregressive=True,
                         config=su.session_config(), **kwargs)


# ------------------------------------------------------- finite differences
@pytest.fixture(scope="module")
def f64():
  probes = [eu.Probe(VARIANTS[n](), n) for n in NAMES]
  h = _harness(probes, master_dtype=tf.float64, activation_dtype=tf.float64,
               seed=5)
  values = h.variable_values()
  grads = h.fetch(["grad:" + n for n in values])
  yield dict(h=h, probes=dict(zip(NAMES, probes)), values=values,
             grads={n: grads["grad:" + n] for n in values})
  h.close()


def _directional_check(run, names, seed):
  """Worst |fd - <g, d>| / |g| over `names` and DIRECTIONS random d."""
  h, values = run["h"], run["values"]
  rng = np.random.RandomState(seed)
  worst = {}
  for name in names:
    w0, g = values[name], run["grads"][name]
    assert g.dtype == np.float64
    assert np.linalg.norm(g) > 0, name
    errs = []
    for _ in range(DIRECTIONS):
      d = rng.randn(*w0.shape)
      d /= np.linalg.norm(d)
      h.assign({name: w0 + EPS * d})
      plus = h.fetch(["loss"])["loss"]
      h.assign({name: w0 - EPS * d})
      minus = h.fetch(["loss"])["loss"]
      fd = (plus - minus) / (2 * EPS)
      errs.append(abs(fd - np.sum(g * d)) / np.linalg.norm(g))
    h.assign({name: w0})
    worst[name] = max(errs)
  return worst


@pytest.mark.parametrize("variant", NAMES)
def test_gradient_matches_finite_differences_float64(f64, variant):
  scope = f64["probes"][variant].scope
  names = sorted(eu.full_names(f64["values"], scope).values())
  assert len(names) >= 2
  worst = _directional_check(f64, names, seed=len(variant))
  assert max(worst.values()) < FD_TOL, worst


def test_input_gradient_through_every_layer_float64(f64):
  worst = _directional_check(f64, ["decoder/embedding"], seed=1)
  assert max(worst.values()) < FD_TOL, worst


def test_loss_is_float64_end_to_end(f64):
  """The check above is only meaningful if nothing rounds to float32."""
  h = f64["h"]
  loss = h.fetch(["loss"])["loss"]
  name = sorted(eu.full_names(f64["values"],
                              f64["probes"]["talking_heads"].scope).values())[0]
  w0 = f64["values"][name]
  h.assign({name: w0 * (1 + 1e-12)})
  nudged = h.fetch(["loss"])["loss"]
  h.assign({name: w0})
  assert loss.dtype == np.float64
  assert 0 < abs(nudged - loss) < 1e-9  # below float32 resolution of loss


# ---------------------------------------------------------------- bfloat16
@pytest.fixture(scope="module")
def bf16():
  """bf16 activations, logits scaled to ~1e4; L and W of every layer."""
  recorded = []

  def recording(original):
    def softmax(l, memory_length):
      w = original(l, memory_length)
      recorded.append((l, w, memory_length))
      return w
    return softmax

  probes = [eu.Probe(VARIANTS[n](), n) for n in NAMES]
  with pytest.MonkeyPatch.context() as mp:
    # W comes from attention.compute_w (general bilinear) or from the
    # strategies' fused softmax (kernels.softmax_last, the default core)
    mp.setattr(attention, "compute_w", recording(attention.compute_w))
    mp.setattr(kernels, "softmax_last", recording(kernels.softmax_last))
    h = _harness(probes, activation_dtype=tf.bfloat16, seed=6)
  assert len(recorded) == len(probes)
  tensors = {}
  for i, (l, w, _) in enumerate(recorded):
    assert l.dtype == tf.float32 and w.dtype == tf.float32
    tensors["l%d" % i], tensors["w%d" % i] = l, w
    tensors["y%d" % i] = probes[i].y
  exported = eu.export(h, tensors)
  axes = [w.shape.dims.index(m) for _, w, m in recorded]

  def max_logit(out, i):
    l = out["l%d" % i]
    return np.max(np.abs(l[l > MASKED_BELOW]))

  # scale the query side of each layer so its largest logit is ~BIG_LOGIT
  before = eu.run(h, exported)
  values = h.variable_values()
  scaled = {}
  for i, (name, probe) in enumerate(zip(NAMES, probes)):
    short = "p" if name == "general_bilinear" else "p_q"
    full = eu.full_names(values, probe.scope)[short]
    scaled[full] = values[full] * (BIG_LOGIT / max_logit(before, i))
  h.assign(scaled)
  out = eu.run(h, exported)
  out.update(h.fetch(["loss", "logits"] + ["grad:" + n for n in h.grads]))
  yield dict(out=out, axes=axes, max_logit=max_logit)
  h.close()


@pytest.mark.parametrize("i", range(len(NAMES)), ids=NAMES)
def test_bf16_logits_near_1e4_stay_finite(bf16, i):
  out = bf16["out"]
  assert 0.5 * BIG_LOGIT < bf16["max_logit"](out, i) < 2 * BIG_LOGIT
  assert np.all(np.isfinite(out["y%d" % i]))
  w = out["w%d" % i]
  assert np.all(np.isfinite(w)) and np.all(w >= 0)
  # compute_w is exp(L - max L) / sum (not mtf.softmax's exp(L - logsumexp)),
  # so even at |L| ~ 1e4 the weights sum to 1 at float32 precision, not at
  # the ~1e-3 spacing of float32 numbers near 1e4
  np.testing.assert_allclose(w.sum(axis=bf16["axes"][i]), 1.0, atol=1e-5)
  # the softmax is saturated: some query puts (almost) all weight on one key
  assert np.max(w) > 0.99


def test_bf16_big_logits_loss_logits_and_gradients_finite(bf16):
  out = bf16["out"]
  assert np.isfinite(out["loss"])
  assert np.all(np.isfinite(out["logits"]))
  grads = {k: v for k, v in out.items() if k.startswith("grad:")}
  assert len(grads) > 20
  bad = [k for k, v in grads.items() if not np.all(np.isfinite(v))]
  assert not bad, bad


def test_harness_refuses_unnamed_layers_that_would_share_weights():
  two = [layers.MultiHeadAttention(heads=2, d_k=4, d_v=4) for _ in range(2)]
  with pytest.raises(ValueError, match=r"layers\[0\] and layers\[1\] are "
                     r"both unnamed MultiHeadAttention: they would share"):
    harness.Harness(two, run=False)
  two[1].set_name("layer_001")
  harness.check_names(two)  # one unnamed and one named: accepted
  two[0].set_name("layer_001")
  with pytest.raises(ValueError, match=r"both named 'layer_001'"):
    harness.check_names(two)
  assert [l.name for l in harness.name_layers(two)] == ["layer_000",
                                                       "layer_001"]
  harness.check_names(two)
