"""The stock t5 console script runs our gin files, as the README says.

``t5_mesh_transformer`` imports mesh_tensorflow before it reads
--module_import (stack breakage 8); the start-up file that setup.py installs
(mtf_talking_heads_startup.pth) mends mtf first.  The real script trains a
tiny talking-heads T5 two steps, evaluates its perplexity and decodes two
lines (its file run three times in one Python, which imports TensorFlow and
t5 once); `mtf_th train --module_import` imports the module before gin is
read.
"""
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from _cli_util import MTF_TH

BIN = os.path.dirname(sys.executable)
STOCK = os.path.join(BIN, "t5_mesh_transformer")
FILES = ["experiments/t5_heads/06_talking_heads_12_64.gin",
         "models/t5_tiny.gin"]
PARAMS = ["heads_k = 4", "heads = 4", "heads_v = 4", "d_k = 16", "d_v = 16",
          "mesh_shape = 'model:2'"]


def _gin(params=()):
  return ["--gin_file=%s" % f for f in FILES] + [
      "--gin_param=%s" % p for p in PARAMS + list(params)]


# The console script (its file, as its shebang runs it) run once per
# command line in one Python, so TensorFlow and t5 are imported once: absl's
# flags are reset and gin cleared before each run; stops at the first
# failure with its status.
_STOCK_BATCH = r"""
import json, runpy, sys
from absl import flags
import gin
script, commands = sys.argv[1], json.loads(sys.argv[2])
for argv in commands:
  flags.FLAGS.unparse_flags()
  gin.clear_config()  # also unlocks what the last run's finalize() locked
  sys.argv = [script] + argv
  try:
    runpy.run_path(script, run_name="__main__")
    code = 0
  except SystemExit as e:  # absl's app.run exits with main's return value
    code = e.code or 0
  print("status %s" % code, flush=True)
  if code:
    sys.exit(1)
"""


def _run_stock(commands, cwd, timeout=1800):
  """Runs `t5_mesh_transformer ARGV` for each ARGV of commands in order."""
  proc = subprocess.run([sys.executable, "-c", _STOCK_BATCH, STOCK,
                         json.dumps(commands)], cwd=cwd, capture_output=True,
                        text=True, timeout=timeout)
  statuses = [l for l in proc.stdout.splitlines() if l.startswith("status ")]
  done = statuses.count("status 0")
  assert proc.returncode == 0 and done == len(commands), (
      commands[min(done, len(commands) - 1)], statuses, proc.stderr[-4000:])
  return proc


def test_stock_script_help_imports_mtf_and_our_module(tmp_path):
  # absl's --help exits with status 1 after the usage; before the start-up
  # hook the script died importing mtf (AttributeError, also status 1)
  proc = subprocess.run([STOCK, "--module_import=mtf_talking_heads", "--help"],
                        cwd=str(tmp_path), capture_output=True, text=True,
                        timeout=300)
  text = proc.stdout + proc.stderr
  assert "Traceback" not in text and "register_tensor_conversion" not in text
  assert "USAGE: " in text


@pytest.mark.slow
def test_stock_script_trains_evaluates_and_decodes(tmp_path):
  """Train, perplexity_eval, infer: the console script three times in one
  Python (_STOCK_BATCH); the --help test above starts it on its own."""
  model_dir = str(tmp_path / "stock")
  stock = ["--module_import=mtf_talking_heads", "--model_dir=%s" % model_dir]
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("The module defines a class.\nReturn the number.\n")
  outputs = tmp_path / "decoded.txt"
  _run_stock([
      stock + _gin(["utils.run.train_steps = 2"]),
      stock + _gin(["utils.run.mode = 'perplexity_eval'",
                    "utils.run.perplexity_eval_steps = 2",
                    "utils.run.dataset_split = 'validation'",
                    "utils.run.eval_checkpoint_step = 2"]),
      stock + _gin(["utils.run.mode = 'infer'",
                    "utils.run.eval_checkpoint_step = 2",
                    "decode_from_file.input_filename = %r" % str(inputs),
                    "decode_from_file.output_filename = %r" % str(outputs)])],
             str(tmp_path))
  assert tf.train.latest_checkpoint(model_dir).endswith("-2")
  with open(os.path.join(model_dir, "train_log.csv")) as f:  # mtf_th.train_model
    assert [l.split(",")[0] for l in f.read().splitlines()[1:]] == ["1", "2"]
  names = [n for n, _ in tf.train.list_variables(model_dir)]
  assert any(n.endswith("TalkingHeadsAttention/p_l") for n in names), names
  with open(os.path.join(model_dir, "commands", "command")) as f:
    assert "--module_import=mtf_talking_heads" in f.read()
  evals = [d for d in os.listdir(model_dir) if d.startswith("eval_")]
  assert evals and os.listdir(os.path.join(model_dir, evals[0]))
  (decoded,) = tmp_path.glob("decoded.txt*")
  assert len(decoded.read_text().splitlines()) == 2


def test_mtf_th_module_import_runs_before_gin_is_parsed(tmp_path):
  # the module registers a gin configurable that the binding needs
  module = tmp_path / "my_gin_ext.py"
  module.write_text(
      "import gin\n"
      "@gin.configurable(module='my_ext')\n"
      "def scale(factor=1):\n"
      "  return factor\n")
  env = dict(os.environ, PYTHONPATH=str(tmp_path))
  # mesh_shape is too big: the run stops at the pre-flight, after gin
  base = [MTF_TH, "train", "--model_dir", str(tmp_path / "m"),
          "--train_steps", "1"] + _gin(["my_ext.scale.factor = 2",
                                        "mesh_shape = 'model:1000'"])
  without = subprocess.run(base, cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=600)
  assert without.returncode == 2 and "my_ext.scale" in without.stderr
  imported = subprocess.run(base + ["--module_import", "my_gin_ext"],
                            cwd=str(tmp_path), env=env, capture_output=True,
                            text=True, timeout=600)
  assert imported.returncode == 2, imported.stderr[-2000:]
  assert "my_ext.scale" not in imported.stderr
  assert "needs 1000 devices" in imported.stderr
  missing = subprocess.run(base + ["--module_import", "no_such_module_x"],
                           cwd=str(tmp_path), env=env, capture_output=True,
                           text=True, timeout=600)
  assert missing.returncode == 2
  assert "--module_import" in missing.stderr
  assert "no_such_module_x" in missing.stderr
  assert not (tmp_path / "m").exists()
