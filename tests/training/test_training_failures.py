"""Training fails loudly, never loops, never loses anything, and keeps little.

One subprocess (8 logical CPU devices) runs `mtf_th train` (commands.train
.main, in-process) on a tiny 4-head T5 (one block per stack), in order:

  aborted   an op-like AbortedError at the first step (what TF's Estimator
            retried forever): exit 1, one message, no retry, no events file
  resumed   the same command without the failure: trains steps 1..6, keeps
            the last 2 checkpoints, step 3 (--keep_checkpoint_steps) and
            step 0 (where it started); no graph.pbtxt, one events file
  ctrl_c    Ctrl-C (KeyboardInterrupt from a hook) at step 8: exit 130, one
            line with the last checkpoint and the command to resume
  shape     train / eval / decode with 8 heads in the 4-head model's dir:
            exit 2, one line naming the variable and both shapes, nothing
            in the directory changes
  op_eval / op_decode   eval and decode of the 4-head model while every
            session run fails like an op: exit 1, one line, no traceback,
            no eval_results.csv
"""
import json
import shlex
import subprocess
import sys

import pytest

from _cli_util import REPO


_SCRIPT = r"""
import contextlib, io, json, os, sys
from mtf_talking_heads.core import compat
compat.split_cpu(8)
import gin
import tensorflow.compat.v1 as tf
from tensorflow.python.training import monitored_session


class FailAt(tf.train.SessionRunHook):
  # `error` in the update that reaches global step `step`
  def __init__(self, step=None, error=None):
    self.step, self.error, self.sessions = step, error, 0

  def after_create_session(self, session, coord):
    self.sessions += 1
    if self.sessions > 1:  # TF recreated the session: the retry loop
      raise SystemExit("RETRIED: the session was recreated after a failure")

  def before_run(self, run_context):
    # an op failing inside the update that would reach global step `step`
    step = run_context.session.run(tf.train.get_global_step())
    if step + 1 >= self.step and self.error == "aborted":
      raise tf.errors.AbortedError(
          None, None, "Input dims must be <= 5 and >=1\n\t "
          "[[{{node encoder/block_000/layer_000/injected_softmax}}]]")

  def after_run(self, run_context, run_values):
    step = run_context.session.run(tf.train.get_global_step())
    if step >= self.step and self.error == "interrupt":
      raise KeyboardInterrupt()


gin.external_configurable(FailAt, module="test")
from mtf_talking_heads.commands import decode as decode_command
from mtf_talking_heads.commands import evaluate as eval_command
from mtf_talking_heads.commands import train as train_command

model_dir = sys.argv[1]
common = ["--model_dir", model_dir,
          "--gin_file", "experiments/t5_heads/06_talking_heads_12_64.gin",
          "--gin_file", "models/t5_tiny.gin"]
small = ["heads_k = 4", "heads = 4", "heads_v = 4", "d_k = 16", "d_v = 16",
         "num_layers = 1", "save_checkpoints_steps = 1"]
params = lambda extra: sum((["--gin_param", p] for p in small + extra), [])
keep = ["--keep_checkpoint_max", "2", "--keep_checkpoint_steps", "3"]


def listing():
  return sorted((n, os.stat(os.path.join(model_dir, n)).st_mtime_ns,
                 os.path.getsize(os.path.join(model_dir, n)))
                for n in os.listdir(model_dir))


def run(main, argv):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    rc = main(argv)
  return {"rc": rc, "stderr": err.getvalue(), "files": sorted(
      os.listdir(model_dir)) if os.path.isdir(model_dir) else [],
          "argv": argv}


out = {}
out["aborted"] = run(train_command.main, common + params(
    ["mtf_th.train_model.hooks = [@test.FailAt()]", "test.FailAt.step = 1",
     "test.FailAt.error = 'aborted'"])
    + keep + ["--train_steps", "6"])
out["resumed"] = run(train_command.main,
                     common + params([]) + keep + ["--train_steps", "6"])
out["listed"] = tf.train.get_checkpoint_state(
    model_dir).all_model_checkpoint_paths[:]
out["ctrl_c"] = run(train_command.main, common + params(
    ["mtf_th.train_model.hooks = [@test.FailAt()]", "test.FailAt.step = 8",
     "test.FailAt.error = 'interrupt'"])
    + keep + ["--train_steps", "10"])
before = listing()
eight = ["heads_k = 8", "heads = 8", "heads_v = 8"]
out["shape_train"] = run(train_command.main, common + params(eight)
                         + ["--train_steps", "12"])
out["shape_eval"] = run(eval_command.main, common + params(eight))
out["shape_decode"] = run(decode_command.main, common + params(eight) +
                          ["--input", "The module defines"])
out["unchanged"] = listing() == before


@contextlib.contextmanager
def failing_session_runs():
  # eval's and decode's session runs fail as a failing op makes them fail
  real = monitored_session._MonitoredSession.run

  def fail(self, *args, **kwargs):
    raise tf.errors.InvalidArgumentError(
        None, None, "injected failure\n\t [[{{node decoder/injected_op}}]]")

  monitored_session._MonitoredSession.run = fail
  try:
    yield
  finally:
    monitored_session._MonitoredSession.run = real


with failing_session_runs():
  out["op_eval"] = run(eval_command.main, common + params([]))
  out["op_decode"] = run(decode_command.main, common + params([]) +
                         ["--input", "The module defines"])
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("failures") / "model")
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, model_dir], cwd=REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads([l for l in proc.stdout.splitlines()
                     if l.startswith("JSON")][-1][4:])


def _error_lines(result):
  return [l for l in result["stderr"].splitlines()
          if l.startswith("mtf_th ")]


def test_an_aborted_op_stops_the_run_at_once_with_one_message(outcome):
  result = outcome["aborted"]
  assert result["rc"] == 1, result["stderr"][-2000:]
  assert result["stderr"].count("starting at step") == 1  # no retry
  assert "Traceback" not in result["stderr"]
  line, = _error_lines(result)
  assert line.startswith("mtf_th train: error: op ")
  for word in ("encoder/block_000/layer_000/injected_softmax", "AbortedError",
               "Input dims must be <= 5", "not a preemption",
               "TF_ENABLE_ONEDNN_OPTS=0", "(step 0) is intact"):
    assert word in line, (word, line)
  # no events file from an attempt that saved nothing; step 0 is intact
  assert not [f for f in result["files"] if f.startswith("events.out")]
  assert "model.ckpt-0.index" in result["files"]


def test_the_rerun_resumes_keeps_few_checkpoints_and_writes_no_graph(outcome):
  result = outcome["resumed"]
  assert result["rc"] == 0, result["stderr"][-2000:]
  files = result["files"]
  steps = sorted(int(f.split("-")[1].split(".")[0]) for f in files
                 if f.startswith("model.ckpt-") and f.endswith(".index"))
  # last 2, the kept step 3, and step 0 where the run started
  assert steps == [0, 3, 5, 6]
  assert [p.rsplit("-", 1)[1] for p in outcome["listed"]] == ["5", "6"]
  assert "graph.pbtxt" not in files
  assert not [f for f in files if f.endswith(".meta")]
  events = [f for f in files if f.startswith("events.out")]
  assert len(events) == 1


def test_ctrl_c_prints_the_last_checkpoint_and_the_resume_command(outcome):
  result = outcome["ctrl_c"]
  assert result["rc"] == 130
  assert "Traceback" not in result["stderr"]
  line, = _error_lines(result)
  assert "the last checkpoint of" in line and "is step 8" in line
  assert line.endswith("resume with: mtf_th train " +
                       shlex.join(result["argv"]))
  # every complete checkpoint is listed or kept; none half-written
  for name in result["files"]:
    if name.endswith(".index"):
      assert name.replace(".index", ".data-00000-of-00002") in \
          result["files"]


@pytest.mark.parametrize("command", ["train", "eval", "decode"])
def test_another_models_gin_fails_before_touching_the_dir(outcome, command):
  result = outcome["shape_" + command]
  assert result["rc"] == 2, result["stderr"][-2000:]
  assert "Traceback" not in result["stderr"]
  line, = _error_lines(result)
  assert line.startswith("mtf_th %s: error: --model_dir " % command)
  # the recorded identity names the bindings on both sides
  assert "holds a model trained with heads = 4, heads_k = 4, heads_v = 4" \
      in line, line
  assert "heads = 8, heads_k = 8, heads_v = 8" in line, line
  assert outcome["unchanged"]


@pytest.mark.parametrize("command", ["eval", "decode"])
def test_a_failing_op_in_eval_or_decode_is_one_line_and_status_1(outcome,
                                                                 command):
  result = outcome["op_" + command]
  assert result["rc"] == 1, result["stderr"][-2000:]
  assert "Traceback" not in result["stderr"]
  line, = _error_lines(result)
  assert line.startswith("mtf_th %s: error: op 'decoder/injected_op' "
                         "failed (InvalidArgumentError: injected failure) "
                         "while " % command), line
  assert ("checkpoint 8 of " in line and
          "Rerun with --verbose" in line), line
  assert "eval_results.csv" not in result["files"]
