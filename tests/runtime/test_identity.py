"""runtime/identity.py: the model a model_dir holds, read without TensorFlow.

The architecture read from gin text (every shipped experiment file gives
one, the variant decides which heads dims count), the identity file
(written, read back, damaged), the refusal lines of each role, and the
weight comparisons training/identity.py and visualize use (slots left out,
names in exact brace notation).  No TensorFlow, no training: milliseconds.
"""
import glob
import os

import pytest

from _identity_util import expand
from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.runtime import identity

LM_TH = ["experiments/lm_heads/05_talking_heads_4_32.gin", "models/lm_tiny.gin"]
SMALL = ["num_layers = 2", "d_model = 32", "d_ff = 64"]
TH_ARCH = {"model_type": "lm", "num_layers": 2, "d_model": 32, "d_ff": 64,
           "relative_attention_type": None,
           "dec_self_attention": "@mtf_th.TalkingHeadsAttention",
           "heads": 4, "d_k": 32, "d_v": 32, "heads_k": 4, "heads_v": 4}


def test_architecture_of_a_talking_heads_lm():
  assert identity.architecture_from_gin(LM_TH, SMALL) == TH_ARCH


@pytest.mark.parametrize("variant,keys", [
    ("01_multi_head_8", {"heads", "d_k", "d_v"}),
    ("02_project_logits_8", {"heads", "d_k", "d_v", "heads_k"}),
    ("03_project_weights_8", {"heads", "d_k", "d_v", "heads_v"}),
    ("04_talking_heads_8", {"heads", "d_k", "d_v", "heads_k", "heads_v"}),
    ("09_dp_all_8", {"heads", "d_k", "d_v", "heads_k", "heads_v",
                     "dynamic"}),
    ("10_grouped_talking_heads_8_g2", {"heads", "d_k", "d_v", "heads_k",
                                       "heads_v", "groups"}),
])
def test_the_variant_decides_which_heads_dims_count(variant, keys):
  """A multi-head model's heads_k is no part of it: changing that macro
  changes no weight, so it is never a difference."""
  arch = identity.architecture_from_gin(
      ["experiments/lm_variants/%s.gin" % variant])
  dims = set(arch) - {"model_type", "num_layers", "d_model", "d_ff",
                      "relative_attention_type", "dec_self_attention"}
  assert dims == keys


def test_every_shipped_experiment_has_an_architecture():
  gin_dir = gin_paths.gin_dir()
  names = sorted(glob.glob(os.path.join(gin_dir, "experiments", "*", "*.gin")))
  assert len(names) > 80
  kinds = set()
  for path in names:
    arch = identity.architecture_from_gin([path])
    assert arch is not None, path
    assert {"num_layers", "d_model", "d_ff", "heads"} <= set(arch), path
    kinds.add(arch["model_type"])
    placements = [k for k in arch if k.endswith("_attention")]
    assert placements and all(arch[k].startswith("@mtf_th.")
                              for k in placements), (path, arch)
  assert kinds == {"bitransformer", "lm", "encoder"}


def test_an_operative_config_reads_as_the_files_that_made_it(tmp_path):
  """gin's operative_config.gin writes short binding names (run.model_type),
  keeps only the macros used and writes `import ... as ...`: the same
  architecture comes out (a model_dir trained before the identity file)."""
  operative = tmp_path / "operative_config.gin"
  operative.write_text(
      "import mesh_tensorflow.transformer.utils as mesh_tensorflow5\n"
      "import mtf_talking_heads.nn.layers as mtf_talking_heads2\n"
      "d_ff = 64\nd_k = 32\nd_model = 32\nd_v = 32\n"
      "dec_self_attention = @mtf_th.TalkingHeadsAttention\n"
      "heads = 4\nheads_k = 4\nheads_v = 4\nnum_layers = 2\n"
      "relative_attention_type = None\n"
      "run.model_type = 'lm'\n"
      "TalkingHeadsAttention.heads = %heads\n")
  assert identity.architecture_from_gin([str(operative)]) == TH_ARCH
  assert identity.architecture_from_gin([str(tmp_path / "missing.gin")]) is None


def _model_dir(tmp_path, arch=TH_ARCH, variables=None, checkpoint=True,
               name="run"):
  model_dir = tmp_path / name
  model_dir.mkdir()
  if checkpoint:
    (model_dir / "model.ckpt-2.index").write_text("")
  record = identity.Identity(arch, variables or {
      "transformer/embedding": ([384, 32], "float32")}, None)
  (model_dir / identity.IDENTITY_FILE).write_text(identity.to_text(record))
  return str(model_dir)


def test_identity_file_round_trip_and_damage(tmp_path):
  variables = {"t/embedding": ([384, 32], "float32"),
               "t/block_000/a/p_q": ([32, 4, 8], "bfloat16")}
  model_dir = _model_dir(tmp_path, variables=variables)
  found = identity.read(model_dir)
  assert found == identity.Identity(
      TH_ARCH, variables, os.path.join(model_dir, identity.IDENTITY_FILE))
  assert identity.recorded(model_dir) == found
  path = os.path.join(model_dir, identity.IDENTITY_FILE)
  for text in ("", "{", '{"format": 2}', '{"format": 1, "architecture": 3, '
               '"variables": {}}', '{"format": 1, "variables": {}}'):
    with open(path, "w") as f:
      f.write(text)
    with pytest.raises(ValueError) as e:
      identity.recorded(model_dir)
    message = str(e.value)
    assert message.startswith(path + " cannot be read (")
    assert message.endswith("): delete it, and the next run derives it "
                            "again from the checkpoints and "
                            "operative_config.gin beside it")
    assert "\n" not in message


def test_no_checkpoint_no_model(tmp_path):
  """Without checkpoints nothing is recorded, even a damaged file: a new
  run's first save writes the identity again."""
  model_dir = _model_dir(tmp_path, checkpoint=False)
  with open(os.path.join(model_dir, identity.IDENTITY_FILE), "w") as f:
    f.write("garbage")
  assert identity.recorded(model_dir) is None
  assert identity.refusal(model_dir, LM_TH, ["num_layers = 1"]) is None
  assert identity.recorded(str(tmp_path / "nowhere")) is None


def test_refusal_lines_of_each_role(tmp_path):
  model_dir = _model_dir(tmp_path)
  source = os.path.join(model_dir, identity.IDENTITY_FILE)
  head = ("holds a model trained with num_layers = 2 (%s), but this "
          "configuration makes num_layers = 1: " % source)
  params = SMALL + ["num_layers = 1"]
  assert identity.refusal(model_dir, LM_TH, SMALL) is None
  assert identity.refusal(model_dir, LM_TH, params) == (
      "--model_dir %s %straining on would mix two models in one directory; "
      "use a new --model_dir, or num_layers = 2 as before"
      % (model_dir, head))
  assert identity.refusal(model_dir, LM_TH, params, role="read") == (
      "--model_dir %s %sleave out the --gin_file / --gin_param that change "
      "it (without --gin_file the model's operative_config.gin is read), or "
      "give num_layers = 2" % (model_dir, head))
  assert identity.refusal(model_dir, LM_TH, params, "run folder",
                          "sweep") == (
      "run folder %s %straining on would mix two models in one run folder; "
      "use a new --output_dir, or the settings it was trained with "
      "(num_layers = 2)" % (model_dir, head))
  mh = ["experiments/lm_heads/01_multi_head_4_32.gin", "models/lm_tiny.gin"]
  assert identity.refusal(model_dir, mh, SMALL, "--pretrained_model_dir",
                          "pretrained") == (
      "--pretrained_model_dir %s holds a model trained with "
      "dec_self_attention = @mtf_th.TalkingHeadsAttention (%s), but this "
      "configuration makes dec_self_attention = @mtf_th.MultiHeadAttention: "
      "fine-tuning would initialise the weights that differ; give the gin "
      "files it was trained with (dec_self_attention = "
      "@mtf_th.TalkingHeadsAttention), or pass --allow_partial_load to load "
      "only the weights of the same name and shape and initialise the "
      "others" % (model_dir, source))
  heads = identity.refusal(model_dir, LM_TH, SMALL + [
      "heads = 8", "heads_k = 8", "heads_v = 8", "d_k = 16", "d_v = 16"])
  assert ("trained with heads = 4, heads_k = 4, heads_v = 4, d_k = 32, "
          "d_v = 32 (" in heads)
  assert ("makes heads = 8, heads_k = 8, heads_v = 8, d_k = 16, d_v = 16: "
          in heads)
  # what the text does not show is left to TensorFlow (training/identity.py)
  assert identity.refusal(model_dir, LM_TH, SMALL + [
      "targets_length = 64"]) is None
  assert identity.refusal("gs://bucket/run", LM_TH, params) is None


def test_legacy_model_dir_reads_its_operative_config(tmp_path):
  """Checkpoints and operative_config.gin, no identity file: trained before
  it existed.  The architecture is the operative config's; the weights
  are left to TensorFlow (its latest checkpoint)."""
  model_dir = tmp_path / "legacy"
  model_dir.mkdir()
  (model_dir / "model.ckpt-0.index").write_text("")
  (model_dir / "operative_config.gin").write_text(
      "include '%s'\nnum_layers = 2\nd_model = 32\nd_ff = 64\n" % LM_TH[0])
  found = identity.recorded(str(model_dir))
  assert found == identity.Identity(
      TH_ARCH, None, str(model_dir / "operative_config.gin"))
  assert "num_layers = 2 (%s)" % found.source in identity.refusal(
      str(model_dir), LM_TH, SMALL + ["num_layers = 1"])
  (model_dir / "operative_config.gin").unlink()
  assert identity.recorded(str(model_dir)).architecture is None


def test_weights_leave_out_slots_and_global_step():
  variables = {"global_step": 1, "t/a/p_q": 2, "t/a/p_q_slot_v": 3,
               "t/a/p_q_slot_vr": 4, "t/b/scale": 5, "t/b/scale_slot_m": 6,
               "t/c/x_slot_v": 7}  # no weight t/c/x: not a slot
  assert identity.weights(variables) == {"t/a/p_q": 2, "t/b/scale": 5,
                                         "t/c/x_slot_v": 7}


def test_compress_is_exact_and_short():
  names = ["t/block_%03d/layer_000/TalkingHeadsAttention/%s" % (b, w)
           for b in range(12) for w in ("p_q", "p_k", "p_l")]
  names += ["t/block_000/layer_001/DenseReluDense/wi/kernel",
            "t/block_002/layer_001/DenseReluDense/wi/kernel",
            "t/embedding", "t/positional_embedding", "t/rms_norm/scale"]
  text = identity.compress(names)
  assert text == (
      "t/block_{000,002}/layer_001/DenseReluDense/wi/kernel, "
      "t/block_{000..011}/layer_000/TalkingHeadsAttention/{p_k,p_l,p_q}, "
      "t/rms_norm/scale, t/{embedding,positional_embedding}")
  assert sorted(expand(text)) == sorted(names)
  assert identity.compress(["a/b"]) == "a/b"
  assert identity.compress(names, limit=2) == (
      "t/block_{000,002}/layer_001/DenseReluDense/wi/kernel, "
      "t/block_{000..011}/layer_000/TalkingHeadsAttention/{p_k,p_l,p_q} "
      "and 2 more")


def _lm(layers, cls="TalkingHeadsAttention", d_ff=64):
  out = {"t/embedding": ([384, 32], "float32")}
  for b in range(layers):
    out["t/block_%03d/layer_000/%s/p_q" % (b, cls)] = ([32, 4, 8], "float32")
    out["t/block_%03d/layer_001/DenseReluDense/wi/kernel" % b] = (
        [32, d_ff], "float32")
  return out


def test_describe_difference_names_layers_classes_and_shapes():
  assert identity.describe_difference(_lm(2), _lm(2), "a", "b") == ""
  assert identity.describe_difference(_lm(2), _lm(1), "the model_dir",
                                      "this configuration") == (
      "2 layers in t/ in the model_dir, 1 in this configuration; only in "
      "the model_dir: t/block_001/layer_000/TalkingHeadsAttention/p_q, "
      "t/block_001/layer_001/DenseReluDense/wi/kernel")
  assert identity.describe_difference(
      _lm(1), _lm(1, "MultiHeadAttention"), "a", "b") == (
          "layers TalkingHeadsAttention in a, MultiHeadAttention in b; only "
          "in a: t/block_000/layer_000/TalkingHeadsAttention/p_q; only in "
          "b: t/block_000/layer_000/MultiHeadAttention/p_q")
  assert identity.describe_difference(_lm(2), _lm(2, d_ff=128), "a", "b") == (
      "t/block_000/layer_001/DenseReluDense/wi/kernel is [32, 64] float32 "
      "in a, [32, 128] float32 in b (and 1 more of other shapes)")
  bf16 = {k: (s, "bfloat16") for k, (s, _) in _lm(1).items()}
  assert identity.describe_difference(_lm(1), bf16, "a", "b").startswith(
      "t/block_000/layer_000/TalkingHeadsAttention/p_q is [32, 4, 8] float32 "
      "in a, [32, 4, 8] bfloat16 in b")
  assert identity.describe_difference(_lm(1), bf16, "a", "b",
                                      dtypes=False) == ""
