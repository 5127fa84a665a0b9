"""t5's Python API with this package's layers (training/t5_api.py).

The Python block of docs/training.md's section "t5's Python API" runs as
written, with runs/t5_api in a temporary directory (one module-scoped run:
t5_api.mtf_model, MtfModel.train 4 steps of the tiny talking-heads
encoder-decoder on model:2 on th_prefix_lm_bytes, eval on
th_embedded_continuation_bytes, predict two lines).  Then:

1. train: checkpoints 0, 2, 4 (save every 2 steps), the latest step 4, and
   train_log.csv's four losses finite and equal (to 1e-5) to those of
   `mtf_th train`'s Python API, training.train, with the same gin files,
   bindings and seed in another model_dir.
2. eval: one prediction per held-out example (132) and the accuracy t5
   wrote to the events file equal to the predictions file against the
   targets file.
3. predict: one line per input, text (not "b'...'" reprs), equal to what
   training.decode (`mtf_th decode`) gives for the same inputs.
4. a gin file that does not exist: one ConfigError line before TensorFlow
   builds anything.
"""
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
from mtf_talking_heads import training
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import t5_api
from _cli_util import REPO

DOC = os.path.join(REPO, "docs", "training.md")
SECTION = "### t5's Python API"
MODEL_DIR = "runs/t5_api"
TASK = "th_embedded_continuation_bytes"
INPUTS = ["The module defines", "The function returns"]


def doc_block():
  """The first ```python block after SECTION in docs/training.md."""
  with open(DOC) as f:
    text = f.read()
  after = text[text.index(SECTION):]
  return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def _gin(block):
  """(gin_files, gin_params) the block passes to mtf_model."""
  namespace = {}
  exec(re.search(r"gin_files=(\[.*?\])", block, re.S).group(0).replace(  # pylint: disable=exec-used
      "gin_files=", "files = "), namespace)
  exec(re.search(r"gin_params=(\[.*?\])", block, re.S).group(0).replace(  # pylint: disable=exec-used
      "gin_params=", "params = "), namespace)
  return namespace["files"], namespace["params"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """The doc's block, run once; returns (model_dir, its namespace, block)."""
  root = tmp_path_factory.mktemp("t5_api")
  model_dir = str(root / "t5_api")
  block = doc_block()
  assert block.count(MODEL_DIR) == 4  # every path the block writes
  namespace = {}
  exec(compile(block.replace(MODEL_DIR, model_dir), DOC, "exec"),  # pylint: disable=exec-used
       namespace)
  return model_dir, namespace, block


def test_train_matches_mtf_th_train(run, tmp_path):
  model_dir, namespace, block = run
  assert isinstance(namespace["model"], t5_api.MtfModel)
  assert training.checkpoint_steps(model_dir) == [0, 2, 4]
  assert training.latest_step(model_dir) == 4
  rows = run_files.read_train_log(model_dir)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  losses = [r["loss"] for r in rows]
  assert all(math.isfinite(x) and 0 < x < 10 for x in losses)
  files, params = _gin(block)
  cli = training.train(str(tmp_path / "cli"), files, params, train_steps=4)
  np.testing.assert_allclose(losses, [r["loss"] for r in cli], rtol=1e-5)


def _events_value(directory, tag):
  (path,) = tf.io.gfile.glob(os.path.join(directory, "events.out.*"))
  for event in tf.compat.v1.train.summary_iterator(path):
    for value in event.summary.value:
      if value.tag == tag:
        return event.step, value.simple_value
  raise AssertionError("no %s in %s" % (tag, path))


def test_eval_writes_the_tasks_accuracy(run):
  model_dir, _, _ = run
  eval_dir = os.path.join(model_dir, "validation_eval")

  def lines(name):
    with open(os.path.join(eval_dir, name)) as f:
      return f.read().split("\n")[:-1]

  predictions = lines(TASK + "_4_predictions")
  targets = lines(TASK + "_targets")
  assert len(predictions) == len(targets) == 132
  step, accuracy = _events_value(eval_dir, "eval/%s/accuracy" % TASK)
  right = sum(p == t for p, t in zip(predictions, targets))
  assert step == 4
  assert accuracy == pytest.approx(100.0 * right / len(targets))


def test_predict_writes_what_mtf_th_decode_prints(run):
  model_dir, _, block = run
  with open(os.path.join(model_dir, "outputs.txt-4")) as f:
    written = f.read().split("\n")[:-1]
  assert len(written) == len(INPUTS)
  assert not any(line.startswith(("b'", 'b"')) for line in written)
  assert "\\n".join(INPUTS) in block  # the block's inputs.txt
  files, params = _gin(block)
  decoded = training.decode(model_dir, files, params, inputs=INPUTS)
  assert [d["output"] for d in decoded] == written


def test_missing_gin_file_is_one_line(tmp_path):
  with pytest.raises(training.ConfigError) as e:
    t5_api.mtf_model(str(tmp_path / "m"), gin_files=["models/nope.gin"])
  assert "models/nope.gin" in str(e.value)
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "m")
