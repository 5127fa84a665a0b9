"""`mtf_th plan`'s bad inputs (issues 35 and 34), through the real command.

Each refusal: exit status 2, one line on stderr, its key words, and no
TensorFlow imported (the child process says so: _cli_util.run).  The gin
refusals are core/binding_checks.py's through commands/prechecks.py, the
one validator `mtf_th train` runs too: for each, train (into a new
model_dir, before TensorFlow) prints the same line after its prefix.  The
slice sizes are estimate/hardware.py's; --devices is checked before any
mesh is enumerated.  The vocabulary is the gin files' task's, padded as
mtf pads it (issue 34: --vocab 259 on model:4 was refused as "does not
split this model (batch 8)").
"""
import csv
import io

import pytest

import _cli_util
from mtf_talking_heads.estimate import hardware

TH = ["--gin_file", "experiments/t5_heads/07_talking_heads_24_32.gin",
      "--gin_file", "models/t5_tiny.gin"]
MH = ["--gin_file", "experiments/t5_heads/02_multi_head_12_64.gin",
      "--gin_file", "models/t5_tiny.gin"]
LM = ["--gin_file", "experiments/lm_heads/01_multi_head_4_32.gin"]
CPU = ["--hardware", "cpu", "--devices", "1"]


def _refused(argv, words, prog="plan"):
  """Runs `mtf_th PROG ARGV`; asserts a one-line refusal before TensorFlow
  with `words`; returns the line after "mtf_th PROG: error: "."""
  result = _cli_util.run([prog] + argv)
  lines = result.stderr.splitlines()
  assert result.code == 2, result.stderr
  assert len(lines) == 1 and not result.stdout, result.stderr
  prefix = "mtf_th %s: error: " % prog
  assert lines[0].startswith(prefix), lines[0]
  for word in words:
    assert word in lines[0], lines[0]
  assert result.tensorflow is False
  return lines[0][len(prefix):]


# name -> (gin arguments, words of the line): refused by plan and, with the
# same line, by train
GIN_CASES = {
    "macro_typo": (TH + ["--gin_param", "heds = 12"],
                   ["'heds'", "no gin file uses", "Did you mean 'heads'"]),
    "parameter_the_class_lacks": (
        TH + ["--gin_param", "mtf_th.TalkingHeadsAttention.heads_w = 4"],
        ["mtf_th.TalkingHeadsAttention has no parameter 'heads_w'",
         "Did you mean 'heads_v'"]),
    "dim_the_variant_lacks": (
        MH + ["--gin_param", "mtf_th.MultiHeadAttention.heads_k = 8"],
        ["mtf_th.MultiHeadAttention has no parameter heads_k",
         "its heads dims: heads", "mtf_th.TalkingHeadsAttention"]),
    "groups_of_ungrouped_talking_heads": (
        TH + ["--gin_param", "mtf_th.TalkingHeadsAttention.groups = 2"],
        ["has no parameter groups", "mtf_th.GroupedTalkingHeadsAttention"]),
    "class_the_configuration_does_not_use": (
        TH + ["--gin_param", "mtf_th.MultiHeadAttention.heads = 4"],
        ["binds mtf_th.MultiHeadAttention", "never uses",
         "Did you mean 'mtf_th.TalkingHeadsAttention'"]),
    "macro_the_variant_does_not_read": (
        MH + ["--gin_param", "heads_k = 8"], ["'heads_k'",
                                               "no gin file uses"]),
    "t5_tpu_mesh_shape": (
        TH + ["--gin_param", "utils.tpu_mesh_shape.model_parallelism = 2"],
        ["is ignored", "mesh_shape = 'model:2'"]),
    "scale_file_first": (
        ["--gin_file", "models/t5_tiny.gin", "--gin_file",
         "experiments/t5_heads/07_talking_heads_24_32.gin"],
        ["includes models/t5_base.gin", "put the scale file last"]),
    "mesh_shape_a_number": (TH + ["--gin_param", "mesh_shape = 42"],
                            ["mesh_shape = 42 is not a string", "'model:8'"]),
    "mesh_shape_bad_size": (TH + ["--gin_param", "mesh_shape = 'model:x'"],
                            ["mesh_shape", "'x'", "not an integer"]),
    "seed_a_string": (TH + ["--gin_param", "seed = 'x'"],
                      ["seed = 'x' is not an integer"]),
    "negative_learning_rate": (
        LM + ["--gin_param", "learning_rate = -0.01"],
        ["learning_rate = -0.01", "finite number > 0"]),
    "dropout_rate_above_one": (TH + ["--gin_param", "dropout_rate = 1.5"],
                               ["dropout_rate = 1.5", "[0, 1)"]),
    "batch_size_zero": (TH + ["--gin_param", "batch_size = 0"],
                        ["batch_size must be a positive integer, got 0"]),
    "unknown_task": (TH + ["--gin_param", "MIXTURE_NAME = 'th_span_corupt'"],
                     ["MIXTURE_NAME 'th_span_corupt'",
                      "did you mean th_span_corruption"]),
    # mtf_th.core_kernel (nn/core_kernel.py), refused as text: the exact line
    "core_kernel_kind_misspelt": (
        TH + ["--gin_param", "mtf_th.core_kernel.kind = 'fusd'"],
        ["mtf_th.core_kernel.kind = 'fusd' is not a kernel: choose 'auto', "
         "'fused' or 'einsum'. Did you mean 'fused'?"]),
    "core_kernel_parameter_misspelt": (
        TH + ["--gin_param", "mtf_th.core_kernel.knd = 'fused'"],
        ["--gin_param \"mtf_th.core_kernel.knd = 'fused'\": "
         "mtf_th.core_kernel has no parameter 'knd'; its one parameter is "
         "kind = 'auto', 'fused' or 'einsum'"]),
    "core_kernel_configurable_misspelt": (
        TH + ["--gin_param", "mtf_th.core_kernl.kind = 'fused'"],
        ["--gin_param \"mtf_th.core_kernl.kind = 'fused'\" binds "
         "mtf_th.core_kernl, which is no configurable: the attention core's "
         "kernel is mtf_th.core_kernel.kind = 'auto', 'fused' or 'einsum'"]),
}


@pytest.mark.parametrize("name", sorted(GIN_CASES))
def test_plan_refuses_what_train_refuses_with_the_same_line(name, tmp_path):
  argv, words = GIN_CASES[name]
  line = _refused(argv + CPU, words)
  assert _refused(["--model_dir", str(tmp_path / "run")] + argv, words,
                  prog="train") == line
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("hardware_name,devices,words", [
    ("tpu_v3", 12, ["--devices 12: tpu_v3 has no slice of 12 devices",
                    "8, 32, 64, 128, 256, 512, 1024, 2048 devices",
                    "v3-8, v3-32"]),
    ("tpu_v4", 3, ["--devices 3: tpu_v4 has no slice of 3 devices",
                   "4, 8, 16, 32", "v4-N has N/2: v4-8, v4-16"]),
    ("tpu_v2", 16, ["tpu_v2 has no slice of 16 devices", "8, 32, 128, 256, "
                    "512 devices"]),
    ("tpu_v5e", 2, ["tpu_v5e has no slice of 2 devices", "1, 4, 8",
                    "v5litepod-1, v5litepod-4"]),
    ("tpu_v3", 1099511627776, ["--devices 1099511627776: tpu_v3 has no "
                               "slice"]),
    ("cpu", 1099511627776, ["--devices 1099511627776 is more than the "
                            "planner enumerates on cpu (at most 4096"]),
    ("cpu", 4097, ["at most 4096 logical devices"]),
])
def test_devices_a_generation_has_no_slice_of(hardware_name, devices, words):
  _refused(TH + ["--hardware", hardware_name, "--devices", str(devices)],
           words)


def test_every_slice_size_is_accepted():
  for name in hardware.SLICES:
    for devices in hardware.slice_devices(name):
      hardware.check_devices(name, devices)
  assert hardware.slice_devices("tpu_v4") == (4, 8, 16, 32, 64, 128, 256, 512,
                                              1024, 2048)
  with pytest.raises(ValueError, match="at most 4096"):
    hardware.check_devices("cpu", hardware.MAX_CPU_DEVICES + 1)
  # the hint "a larger slice" names slices that exist
  assert hardware.larger_devices("tpu_v2", 8, 6) == [32, 128, 256, 512]
  assert hardware.larger_devices("cpu", 1024, 6) == [2048, 4096]


def _plan_csv(argv):
  result = _cli_util.run(["plan"] + argv + ["--format", "csv"])
  assert result.code == 0, result.stderr
  assert result.tensorflow is False
  return list(csv.DictReader(io.StringIO(result.stdout)))


def test_vocab_259_is_padded_as_mtf_pads_it_and_splits_model_4():
  """Issue 34: 259 ids are a vocab dim of 384, which model:4 splits."""
  rows = _plan_csv(LM + ["--hardware", "cpu", "--devices", "4",
                         "--mesh_shape", "model:4", "--vocab", "259"])
  assert rows and {r["mesh_shape"] for r in rows} == {"batch:1,model:4"}
  # the lm_heads rows' task is th_lm_bytes (259 ids): the same plan by default
  assert _plan_csv(LM + ["--hardware", "cpu", "--devices", "4",
                         "--mesh_shape", "model:4"]) == rows
  assert _plan_csv(LM + ["--hardware", "cpu", "--devices", "4",
                         "--mesh_shape", "model:4", "--vocab", "384"]) == rows


def test_the_task_vocabulary_changes_the_memory():
  """th_span_corruption's 8100 ids (8192 padded) against T5's 32128: the
  embedding, its gradient and its optimizer slots shrink."""
  args = TH + CPU + ["--mesh_shape", "batch:1"]
  own = {r["strategy"]: float(r["state_gib"]) for r in _plan_csv(args)}
  padded = {r["strategy"]: float(r["state_gib"])
            for r in _plan_csv(args + ["--vocab", "8100"])}
  t5 = {r["strategy"]: float(r["state_gib"])
        for r in _plan_csv(args + ["--vocab", "32128"])}
  assert own == padded
  assert t5["heads_parallel"] > own["heads_parallel"]


def test_a_mesh_that_does_not_split_names_the_dim():
  line = _refused(LM + ["--gin_param", "heads = 256", "--hardware", "cpu",
                        "--devices", "256", "--mesh_shape",
                        "batch:1,model:256"],
                  ["--mesh_shape batch:1,model:256 does not split this model",
                   "the padded vocab (384) is not divisible by the model axis",
                   "th_lm_bytes's 259 ids padded to a multiple of 128"])
  assert "batch 16" not in line
  _refused(LM + ["--hardware", "cpu", "--devices", "8", "--mesh_shape",
                 "batch:1,model:8"],
           ["dec_self heads_k (4) is not divisible by the model axis"])
  _refused(LM + ["--hardware", "cpu", "--devices", "3"],
           ["no mesh of 3 devices splits this model",
            "batch:3,model:1: batch 16 is not divisible",
            "batch:1,model:3: d_ff (512) is not divisible"])


def test_a_vocabulary_plan_cannot_know_is_asked_for():
  _refused(TH + CPU + ["--gin_param",
                       "th_data.vocabulary_options.path = '/my/spm.model'"],
           ["cannot tell the vocabulary size of th_data.vocabulary_options"
            ".path '/my/spm.model'", "give --vocab N"])
  # given, it plans
  assert _plan_csv(TH + CPU + ["--vocab", "32000", "--gin_param",
                               "th_data.vocabulary_options.path = "
                               "'/my/spm.model'"])


def test_perf_checks_the_gin_files_as_plan_does_and_pads_the_vocab():
  for name in ("macro_typo", "scale_file_first", "mesh_shape_a_number"):
    argv, words = GIN_CASES[name]
    assert _refused(argv, words, prog="perf") == _refused(argv + CPU, words)
  outputs = []
  for vocab in ("259", "384"):
    result = _cli_util.run(["perf"] + TH + ["--mesh_shape", "model:4",
                                            "--vocab", vocab])
    assert result.code == 0 and result.tensorflow is False, result.stderr
    outputs.append(result.stdout)
  assert outputs[0] == outputs[1]
