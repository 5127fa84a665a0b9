"""Incremental decoding == teacher forcing, for every attention variant.

For each variant a tiny model with random weights (d_model 16, vocab 24,
batch 2, decoded length 5) is built by tests/_decode_util.py.  Three checks:

  1. greedy decoding with mtf's own loop (Unitransformer.sample_autoregressive
     or Bitransformer.decode, temperature 0.0) produces, at every position,
     the argmax of the teacher-forced logits of the decoded sequence;
  2. the logits of an unrolled loop that calls the model in "incremental"
     mode one position at a time equal the teacher-forced logits at every
     position, to LOGITS_TOL; the first 3 steps start from empty caches,
     the later ones continue from the states "first_part" recorded for a
     3-token prefix (the partial-sequence path of sample_autoregressive);
  3. the "first_part" logits equal the teacher-forced ones on the prefix.

Decoder self-attention runs in a Unitransformer; attention over the encoder
output in a Bitransformer (encoder: TalkingHeadsAttention; decoder: the
variant's self-attention + its <Variant>EncoderAttention).  Dynamic
projections use dynamic_init_scale=1.0 so that their terms move the logits.

The contrast case shows why our layers cache R_Ml: mtf 0.1.21's
TalkingHeadsSelfAttention(dynamic_projections=["m2l"]) recomputes the
memory-dependent projection from the current position only, so its
incremental logits agree at position 0 (the memory is that position alone)
and differ from teacher forcing afterwards.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
from mesh_tensorflow.transformer import transformer_layers
import numpy as np
import pytest

from _equiv_util import relative_error
import _decode_util
from mtf_talking_heads.nn import layers

LOGITS_TOL = 1e-5  # max |stepped - teacher-forced| / max |teacher-forced|
HEADS = dict(heads_k=4, heads=6, heads_v=4, d_k=4, d_v=4)
DYN = dict(HEADS, dynamic_init_scale=1.0)

# id -> (self-attention factory, encoder-attention factory)
VARIANTS = {
    "multi_head": (
        lambda: layers.MultiHeadAttention(heads=4, d_k=4, d_v=4),
        lambda: layers.MultiHeadEncoderAttention(heads=4, d_k=4, d_v=4)),
    "talking_heads": (
        lambda: layers.TalkingHeadsAttention(**HEADS),
        lambda: layers.TalkingHeadsEncoderAttention(**HEADS)),
    "talking_heads_relative_bias": (
        lambda: layers.TalkingHeadsAttention(relative_attention_type="bias",
                                             **HEADS),
        lambda: layers.TalkingHeadsEncoderAttention(
            relative_attention_type="bias", **HEADS)),
    "project_logits": (
        lambda: layers.ProjectLogitsAttention(heads_k=4, heads=6, d_k=4,
                                              d_v=4),
        lambda: layers.ProjectLogitsEncoderAttention(heads_k=4, heads=6,
                                                     d_k=4, d_v=4)),
    "project_weights": (
        lambda: layers.ProjectWeightsAttention(heads=6, heads_v=4, d_k=4,
                                               d_v=4),
        lambda: layers.ProjectWeightsEncoderAttention(heads=6, heads_v=4,
                                                      d_k=4, d_v=4)),
    "general_bilinear": (
        lambda: layers.GeneralBilinearAttention(heads=4),
        lambda: layers.GeneralBilinearEncoderAttention(heads=4)),
    "dynamic_all": (
        lambda: layers.DynamicProjectionsAttention(**DYN),
        lambda: layers.DynamicProjectionsEncoderAttention(**DYN)),
    "dynamic_m2l": (
        lambda: layers.DynamicProjectionsAttention(dynamic=["m2l"], **DYN),
        lambda: layers.DynamicProjectionsEncoderAttention(dynamic=["m2l"],
                                                          **DYN)),
    "dynamic_m2w": (
        lambda: layers.DynamicProjectionsAttention(dynamic=["m2w"], **DYN),
        lambda: layers.DynamicProjectionsEncoderAttention(dynamic=["m2w"],
                                                          **DYN)),
}


def _check(run):
  """The three checks of the module docstring; returns the decoded ids."""
  r = run.results
  decoded = r["decoded"]
  np.testing.assert_array_equal(decoded,
                                r["forced_on_decoded"].argmax(-1))
  forced, p = r["forced"], run.prefix
  assert relative_error(r["stepped"], forced) <= LOGITS_TOL
  assert relative_error(r["first_part"][:, :p], forced[:, :p]) <= LOGITS_TOL
  return decoded


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoder_self_attention(variant):
  decoded = _check(_decode_util.DecodeRun([VARIANTS[variant][0]()]))
  # a random model still decodes more than one distinct token
  assert len(np.unique(decoded)) > 1, decoded


# In `make test-fast` too: these three cover every code path of the
# encoder-attention layers (the cached constant K, V, R_Ml, R_Mw; GBMA's
# cached M); the other variants differ only in their dims and are marked slow.
# mtf's enc-dec relative position bias needs gin bindings of its span-based
# relative positions (relative_position_spans.num_sentinels), so the
# relative-bias variant is checked in decoder self-attention only.
_ENC_DEC_FAST = ("talking_heads", "general_bilinear", "dynamic_all")


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=() if v in _ENC_DEC_FAST else (pytest.mark.slow,))
    for v in VARIANTS if v != "talking_heads_relative_bias"])
def test_encoder_attention_in_bitransformer(variant):
  self_attention, encoder_attention = VARIANTS[variant]
  run = _decode_util.DecodeRun(
      [self_attention(), encoder_attention()],
      encoder_layers=[layers.TalkingHeadsAttention(**HEADS)])
  _check(run)
  # the encoder output matters: at position 0 both rows read token 0, so
  # their logits differ only through the (different) encoder inputs
  forced = run.results["forced"]
  assert relative_error(forced[0, 0], forced[1, 0]) > 1e-3


def test_mtf_talking_heads_m2l_breaks_incremental_decoding():
  """mtf 0.1.21's m2l uses only the current position's memory while decoding."""
  run = _decode_util.DecodeRun([transformer_layers.TalkingHeadsSelfAttention(
      key_heads_dims=[("heads_k", 4)], softmax_heads_dims=[("heads", 6)],
      value_heads_dims=[("heads_v", 4)], key_size=4, value_size=4,
      dynamic_projections=["m2l"], dynamic_projections_init_scale=1.0)])
  r = run.results
  forced, stepped = r["forced"], r["stepped"]
  # teacher forcing and "first_part" agree (no cache involved) ...
  assert relative_error(r["first_part"][:, :run.prefix],
                         forced[:, :run.prefix]) <= LOGITS_TOL
  # ... and so does the first incremental step, whose memory is itself ...
  assert relative_error(stepped[:, 0], forced[:, 0]) <= LOGITS_TOL
  # ... but every later step differs: R_Ml comes from the wrong position.
  for position in range(1, run.length):
    assert relative_error(stepped[:, position], forced[:, position]) > 1e-2
