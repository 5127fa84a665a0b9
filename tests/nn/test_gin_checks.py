"""--gin_param bindings that the configuration would ignore are errors.

gin accepts a misspelt macro (``heds = 12`` defines a new macro nothing
reads) and a binding of a configurable that is never called (t5's
``utils.tpu_mesh_shape.model_parallelism`` when utils.run.mesh_shape is the
mesh_shape macro; a layer class no layer stack lists).  training.parse_gin
refuses both with a did-you-mean or the macro to use (gin_checks.py).
"""
import subprocess

import pytest
import t5.models.mtf_model  # noqa: F401  (registers t5's MtfModel with gin)

from mtf_talking_heads import training
from _cli_util import MTF_TH

TH = ["experiments/t5_heads/07_talking_heads_24_32.gin", "models/t5_tiny.gin"]
MH = ["experiments/t5_heads/03_multi_head_24_32.gin", "models/t5_tiny.gin"]

REFUSED = {
    "macro_typo": (TH, ["heds = 12"],
                   ["'heds'", "no gin file uses", "Did you mean 'heads'"]),
    "t5_model_parallelism": (
        TH, ["utils.tpu_mesh_shape.model_parallelism = 4"],
        ["is ignored", "utils.tpu_mesh_shape",
         "--gin_param \"mesh_shape = 'model:4'\""]),
    "t5_tpu_topology": (
        TH, ["utils.tpu_mesh_shape.tpu_topology = 'v3-32'"],
        ["is ignored", "mesh_shape = 'batch:B,model:M'"]),
    "mtf_model_parallelism": (
        TH, ["MtfModel.model_parallelism = 2"],
        ["MtfModel", "utils.run", "mesh_shape = 'model:2'"]),
    "unused_layer_class": (
        TH, ["mtf_th.MultiHeadAttention.heads = 4"],
        ["mtf_th.MultiHeadAttention", "never uses",
         "Did you mean 'mtf_th.TalkingHeadsAttention'"]),
    "mtf_layer_shadowed_by_our_stacks": (
        TH, ["transformer_layers.SelfAttention.num_heads = 4"],
        ["transformer_layers.SelfAttention", "never uses"]),
    "macro_the_variant_does_not_read": (
        MH, ["heads_k = 4"], ["'heads_k'", "no gin file uses"]),
}

ACCEPTED = {
    "macro": (TH, ["heads = 4", "mesh_shape = 'model:2'", "seed = 3"]),
    "used_layer": (TH, ["mtf_th.TalkingHeadsAttention.heads = 4",
                        "encoder/mtf_th.TalkingHeadsAttention.heads_k = 4"]),
    "strategy": (TH, ["mtf_th.TalkingHeadsAttention.strategy = "
                      "@mtf_th.BatchSplit()"]),
    "direct_configurable": (TH, ["utils.run.train_steps = 3",
                                 "transformer.Unitransformer.z_loss = 0.0"]),
    # honoured when utils.run.mesh_shape calls it (a TPU run)
    "t5_mesh_honoured": (TH, [
        "utils.run.mesh_shape = @utils.tpu_mesh_shape()",
        "utils.tpu_mesh_shape.model_parallelism = 4",
        "utils.tpu_mesh_shape.tpu_topology = 'v3-32'"]),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ignored_binding_is_a_config_error(name):
  files, params, words = REFUSED[name]
  with pytest.raises(training.ConfigError) as e:
    training.parse_gin(files, params)
  for word in words:
    assert word in str(e.value), (word, str(e.value))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_used_binding_is_accepted(name):
  files, params = ACCEPTED[name]
  training.parse_gin(files, params)


def test_cli_macro_typo_exits_2_before_building_anything(tmp_path):
  proc = subprocess.run(
      [MTF_TH, "train", "--model_dir", str(tmp_path / "m"), "--train_steps",
       "1"] + ["--gin_file=%s" % f for f in TH] + ["--gin_param", "heds = 12"],
      capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if "error" in l]
  assert len(errors) == 1 and "Did you mean 'heads'" in errors[0]
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "m").exists()
