"""Layout rules naming an unknown mesh axis or dim are refused, never ignored.

Issue 20's silent cases: a misspelt axis (heads:modle) or dim (hedas:model)
used to train unsharded, or report 0 bytes, without a word; a layout file
lost to launch/tpu.py's --parallelism.  Each is now one line with a
did-you-mean (spec.check_layout_names), exit status 2.  The refusals of
comm, perf, sweep and tpu.py come before TensorFlow is imported: their
subprocesses report whether `tensorflow` was in sys.modules at that time.
"""
import json
import subprocess
import sys

import pytest

from mtf_talking_heads.core import spec
from _cli_util import REPO

T5 = ["experiments/t5_heads/07_talking_heads_24_32.gin", "models/t5_tiny.gin"]


def test_unknown_axis_and_dim_name_the_closest():
  with pytest.raises(ValueError) as e:
    spec.check_layout_names("heads:modle", ["model"], ["heads", "d_k"])
  assert str(e.value) == (
      "layout rule heads:modle names mesh axis 'modle', which the mesh (axes:"
      " model) does not have (did you mean 'model'?); fix the spelling or "
      "drop the rule")
  with pytest.raises(ValueError, match=r"names tensor dim 'hedas', which the "
                     r"model does not have \(did you mean 'heads'\?\); its "
                     r"dims: d_k, heads$"):
    spec.check_layout_names("hedas:model", ["model"], ["heads", "d_k"])
  # batch and model may be absent from the mesh (one layout, several meshes)
  spec.check_layout_names("batch:batch,heads:model", ["model"], ["batch",
                                                                 "heads"])
  spec.check_layout_names("rows:r;heads:c", ["r", "c"], ["rows", "heads"])


# ------------------------------------------------------------ before TensorFlow
_LIGHT = r"""
import contextlib, io, json, sys
import mtf_talking_heads_startup as startup
startup.LIGHT_PACKAGE_IMPORT = True
results = {}
def run(name, main, argv):
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    code = main(argv)
  results[name] = [code, err.getvalue(), "tensorflow" in sys.modules]
from mtf_talking_heads.commands import comm
from mtf_talking_heads.commands import perf
from mtf_talking_heads.commands import sweep
unit = ["--variant", "talking_heads", "--heads", "4", "--d_k", "4", "--d_v",
        "4", "--d_model", "16", "--length", "8", "--batch", "4",
        "--mesh_shape", "model:2", "--strategy", "heads_parallel"]
run("comm_axis", comm.main, unit + ["--layout", "heads_k:modle"])
run("comm_dim", comm.main, unit + ["--layout", "hedas:model"])
run("perf_dim", perf.main, ["--gin_file", sys.argv[1], "--gin_param",
                            "layout = 'hedas:model'"])
run("perf_axis", perf.main, ["--gin_file", sys.argv[1], "--gin_param",
                             "layout = 'heads:modle'"])
run("sweep_axis", sweep.main, ["--dry_run", "--paper_table", "t5_heads",
                               "--rows", "1", "--output_dir", sys.argv[2],
                               "--mesh_shape", "model:2", "--layout",
                               "heads:modle"])
sys.path.insert(0, "launch")
import tpu
run("tpu_layout_file", tpu.main, [
    "--dry_run", "--name", "x", "--zone", "z", "--project", "p",
    "--model_dir", "gs://b/r", "--experiment", sys.argv[1],
    "--gin_file", "layouts/data_parallel.gin", "--parallelism", "model"])
run("tpu_layout_param", tpu.main, [
    "--dry_run", "--name", "x", "--zone", "z", "--project", "p",
    "--model_dir", "gs://b/r", "--experiment", sys.argv[1],
    "--parallelism", "batch", "--gin_param", "layout = 'heads:model'"])
print("JSON" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def light(tmp_path_factory):
  proc = subprocess.run(
      [sys.executable, "-c", _LIGHT, T5[0],
       str(tmp_path_factory.mktemp("sweep") / "out")],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("JSON")][-1]
  return json.loads(line[4:])


@pytest.mark.parametrize("name,words", [
    # comm_axis used to report 0 bytes sent, comm_dim to be accepted
    ("comm_axis", ["mtf_th comm: error: --layout rule heads_k:modle names "
                   "mesh axis 'modle'", "did you mean 'model'?"]),
    ("comm_dim", ["--layout rule hedas:model names tensor dim 'hedas'",
                  "did you mean 'heads'?", "core_shard"]),
    ("perf_dim", ["mtf_th perf: error: layout 'hedas:model'", "tensor dim "
                  "'hedas'", "did you mean 'heads'?"]),
    # the gin checks train and plan run (core/binding_checks.py): the
    # gin files' mesh_shape, model:1
    ("perf_axis", ["mesh axis 'modle'", "(axes: model)",
                   "did you mean 'model'?"]),
    ("sweep_axis", ["row 01_multi_head_6_128: layout 'heads:modle'",
                    "mesh axis 'modle'", "(axes: model)",
                    "did you mean 'model'?"]),
    ("tpu_layout_file", ["--gin_file layouts/data_parallel.gin sets "
                         "mesh_shape and layout", "which --parallelism model "
                         "(mesh_shape = 'model:8', layout = 'heads:model,"
                         "d_ff:model,vocab:model') overrides",
                         "choose the layout with --parallelism",
                         "drop layouts/data_parallel.gin"]),
    ("tpu_layout_param", ["--gin_param \"layout = 'heads:model'\" overrides "
                          "--parallelism batch (mesh_shape = 'batch:8'",
                          "drop the binding"]),
])
def test_refused_in_one_line_before_tensorflow(light, name, words):
  code, stderr, tensorflow_loaded = light[name]
  assert code == 2
  lines = stderr.splitlines()
  assert len(lines) == 1, lines
  for word in words:
    assert word in lines[0], (word, lines[0])
  assert not tensorflow_loaded


# ------------------------------------------------------- after TensorFlow
@pytest.fixture(scope="module")
def heavy():
  """training.preflight's refusals, in this process (TensorFlow loaded)."""
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  results = {}
  for name, params in (("train_axis", ["layout = 'heads:modle'"]),
                       ("train_dim", ["layout = 'hedas:model'"]),
                       ("train_ok", ["layout = 'batch:batch,heads:model'"])):
    try:
      training.parse_gin(T5, ["mesh_shape = 'model:2'"] + params)
      training.preflight()
      results[name] = None
    except training.ConfigError as e:
      results[name] = str(e)
  return results


def test_train_refuses_a_misspelt_mesh_axis(heavy):
  # used to train unsharded: mtf ignores a rule for an axis the mesh lacks
  assert heavy["train_axis"] == (
      "layout 'heads:modle' (the layout macro or utils.run.layout_rules): "
      "rule heads:modle names mesh axis 'modle', which the mesh (axes: "
      "model) does not have (did you mean 'model'?); fix the spelling or "
      "drop the rule")
  assert "tensor dim 'hedas'" in heavy["train_dim"]
  assert "did you mean 'heads'?" in heavy["train_dim"]
  assert heavy["train_ok"] is None  # batch:batch on a mesh without batch
