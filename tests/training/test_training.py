"""End-to-end training on the embedded corpus.

A tiny talking-heads T5 (4 heads of 16, one block per stack, so it is
quick) is trained for 12 steps on mesh model:2 (heads:model) with a
checkpoint every 4 steps: the reference run, in this process
(training.train; the test session has 8 logical CPU devices).  Then `mtf_th
train` with the same settings runs in a subprocess and is killed with
SIGKILL after a checkpoint exists, and rerun (a second subprocess): it must
resume, never duplicate a step, and reproduce the reference losses step by
step; no listed checkpoint may be half-written; both `mtf_th train`
processes print progress and none of TF's start-up noise; a third `mtf_th
train` on the directory while the victim holds its lock is refused, and the
rerun takes the killed victim's stale lock over (dir_lock.py).  The reference
model is also evaluated (ln(PPL) per checkpoint), decoded and fine-tuned
with finetune.gin (training.finetune, what `mtf_th finetune` runs, in this
process; the stock t5_mesh_transformer script: test_stock_t5.py).  A tiny
BERT trains too; ALBERT's shared layers are tests/nn/test_albert_bert.py's.
"""
import contextlib
import glob
import io
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import _cli_util
from mtf_talking_heads import training

REPO = _cli_util.REPO
BIN = os.path.dirname(sys.executable)
MTF_TH = _cli_util.MTF_TH
SMALL_HEADS = ["heads_k = 4", "heads = 4", "heads_v = 4", "d_k = 16",
               "d_v = 16"]
T5_FILES = ["experiments/t5_heads/06_talking_heads_12_64.gin",
            "models/t5_tiny.gin"]
T5_PARAMS = SMALL_HEADS + ["mesh_shape = 'model:2'",
                           "layout = 'heads:model,d_ff:model,vocab:model'",
                           "save_checkpoints_steps = 4"]
STEPS = 12


def _flags(files, params):
  return ["--gin_file=%s" % f for f in files] + [
      "--gin_param=%s" % p for p in params]


def _train_cmd(model_dir, steps=STEPS):
  return [MTF_TH, "train", "--model_dir", model_dir,
          "--train_steps", str(steps)] + _flags(T5_FILES, T5_PARAMS)


def _run(cmd, timeout=900):
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, (cmd, proc.stderr[-4000:])
  return proc


def _log(model_dir):
  with open(os.path.join(model_dir, "train_log.csv")) as f:
    lines = f.read().splitlines()
  assert lines[0] == "step,loss,steps_per_sec,elapsed_sec"
  rows = [l.split(",") for l in lines[1:]]
  return [(int(r[0]), float(r[1]), float(r[2]), float(r[3])) for r in rows]


def _listed_checkpoints(model_dir):
  state = tf.train.get_checkpoint_state(model_dir)
  return [os.path.join(model_dir, os.path.basename(p))
          for p in state.all_model_checkpoint_paths]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted 12-step run, in this process: (model_dir, stderr)."""
  model_dir = str(tmp_path_factory.mktemp("t5") / "reference")
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    training.train(model_dir, T5_FILES, T5_PARAMS, train_steps=STEPS)
  return model_dir, err.getvalue()


def test_t5_trains_logs_and_checkpoints(reference):
  model_dir, stderr = reference
  rows = _log(model_dir)
  assert [r[0] for r in rows] == list(range(1, STEPS + 1))
  losses = [r[1] for r in rows]
  assert all(math.isfinite(l) for l in losses)
  # from ~ln(8100) = 9.0 the loss falls by far more than noise in 12 steps
  assert losses[0] > 8.5
  assert np.mean(losses[-3:]) < losses[0] - 1.5
  assert all(r[2] > 0 for r in rows)
  assert [r[3] for r in rows] == sorted(r[3] for r in rows)
  assert [int(p.rsplit("-", 1)[1]) for p in _listed_checkpoints(model_dir)
          ][-3:] == [4, 8, 12]
  assert os.path.exists(os.path.join(model_dir, "operative_config.gin"))
  assert glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))
  assert "starting at step 0 of %d" % STEPS in stderr
  assert "steps/s" in stderr and "ETA" in stderr


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
  """`mtf_th train` (the reference's settings, the victim) killed with
  SIGKILL after a checkpoint, then rerun.  Returns a dict: model_dir,
  resumed_from (the checkpoint step), victim (its Popen), victim_output
  (stdout, stderr), second (a second writer's _cli_util.Result, while the
  victim held the lock), rerun (the rerun's CompletedProcess)."""
  base = tmp_path_factory.mktemp("killed")
  model_dir = str(base / "model")
  cmd = _train_cmd(model_dir)
  with open(str(base / "victim.out"), "w+") as out, \
      open(str(base / "victim.err"), "w+") as err:
    killed_after, victim, second = _kill_after_a_checkpoint(cmd, model_dir,
                                                            out, err)
    out.seek(0)
    err.seek(0)
    victim_output = (out.read(), err.read())
  assert killed_after is not None and killed_after < STEPS, \
      "the run ended before it could be killed"
  assert victim.returncode == -signal.SIGKILL
  # every listed checkpoint is complete (index + all data shards)
  for prefix in _listed_checkpoints(model_dir):
    assert os.path.exists(prefix + ".index"), prefix
    shards = glob.glob(prefix + ".data-*-of-*")
    assert shards and len(shards) == int(shards[0].rsplit("-of-", 1)[1])
  resumed_from = int(tf.train.latest_checkpoint(model_dir).rsplit("-", 1)[1])
  assert resumed_from in (4, 8)
  return dict(model_dir=model_dir, resumed_from=resumed_from,
              victim=victim, victim_output=victim_output, second=second,
              rerun=_run(cmd))


def test_a_second_writer_is_refused_and_a_stale_lock_taken_over(killed):
  """dir_lock.py with real `mtf_th train` processes: while the victim holds
  the lock, a second `mtf_th train` on the directory is refused in one line
  before TensorFlow; the victim's lock, left by SIGKILL, is taken over by
  the rerun, which releases it at its end; the refused run wrote nothing
  (one events file each for the victim and the rerun)."""
  second, rerun = killed["second"], killed["rerun"]
  assert second.code == 2 and second.tensorflow is False, second.stderr
  (line,) = second.stderr.splitlines()
  assert line.startswith("mtf_th train: error: --model_dir %s is in use by "
                         "PID %d" % (killed["model_dir"], killed["victim"].pid))
  assert ("taking over the stale lock of --model_dir %s" % killed["model_dir"]
          in rerun.stderr)
  assert "PID %d" % killed["victim"].pid in rerun.stderr
  files = os.listdir(killed["model_dir"])
  assert "mtf_th.lock" not in files
  assert len([f for f in files if f.startswith("events.out")]) == 2


def test_train_is_quiet_without_verbose(killed):
  """No CUDA-plugin lines, pkg_resources warning or tf.Print (compat.py) in
  either `mtf_th train` process; progress and the last step's loss."""
  (victim_out, victim_err), proc = killed["victim_output"], killed["rerun"]
  for noise in _cli_util.NOISE:
    for text in (proc.stderr, victim_err, victim_out):
      assert noise not in text, (noise, text[-3000:])
  assert "steps/s" in proc.stderr and "ETA" in proc.stderr
  assert "step %d loss" % STEPS in proc.stdout


def _kill_after_a_checkpoint(cmd, model_dir, stdout, stderr):
  """Starts cmd; once it holds model_dir's lock (building its graph) runs a
  second `mtf_th train` there; SIGKILLs it once step >= 5 is logged and
  checkpoint 4 or 8 is listed.  Returns (the last logged step or None, the
  Popen, the second run's _cli_util.Result)."""
  victim = subprocess.Popen(cmd, cwd=REPO, stdout=stdout, stderr=stderr)
  killed_after = second = None
  lock = os.path.join(model_dir, "mtf_th.lock")
  deadline = time.time() + 900
  try:
    while time.time() < deadline and victim.poll() is None:
      if second is None and os.path.exists(lock):
        second = _cli_util.run(cmd[1:])
      ckpt = os.path.join(model_dir, "checkpoint")
      log = os.path.join(model_dir, "train_log.csv")
      if os.path.exists(ckpt) and os.path.exists(log):
        steps = [int(l.split(",")[0]) for l in open(log).read().splitlines()[1:]
                 if l.count(",") == 3]
        listed = tf.train.get_checkpoint_state(model_dir)
        if steps and max(steps) >= 5 and listed and any(
            p.endswith("-4") or p.endswith("-8")
            for p in listed.all_model_checkpoint_paths):
          victim.send_signal(signal.SIGKILL)
          killed_after = max(steps)
          break
      time.sleep(0.05)
  finally:
    if victim.poll() is None and killed_after is None:
      victim.kill()
    victim.wait()
  assert second is not None, "the victim never held its lock"
  return killed_after, victim, second


def test_kill_9_then_resume_reproduces_the_reference(reference, killed):
  ref_dir, _ = reference
  model_dir, resumed_from = killed["model_dir"], killed["resumed_from"]
  proc = killed["rerun"]
  assert "starting at step %d" % resumed_from in proc.stderr
  rows = _log(model_dir)
  steps = [r[0] for r in rows]
  assert steps == list(range(1, STEPS + 1))  # each step once, in order
  reference_losses = [r[1] for r in _log(ref_dir)]
  np.testing.assert_allclose([r[1] for r in rows], reference_losses,
                             rtol=0, atol=1e-5)
  latest = tf.train.latest_checkpoint(model_dir)
  assert latest.endswith("-%d" % STEPS)
  assert tf.train.load_checkpoint(latest).get_tensor("global_step") == STEPS


def test_eval_and_decode(reference):
  model_dir, _ = reference
  evals = training.evaluate(model_dir, T5_FILES, T5_PARAMS,
                            checkpoint_steps=[4, 12])
  given = training.decode(model_dir, T5_FILES, T5_PARAMS, inputs=[
      "The module defines the following functions.",
      "Return the number of items in a container."])
  assert [e["step"] for e in evals] == [4, 12]
  assert all(e["split"] == "validation" for e in evals)
  assert evals[0]["tokens"] == evals[1]["tokens"] > 100  # same held-out set
  assert all(0 < e["ln_ppl"] < math.log(8200) for e in evals)
  assert evals[1]["ln_ppl"] < evals[0]["ln_ppl"] - 0.5  # training helped
  with open(os.path.join(model_dir, "eval_results.csv")) as f:
    lines = f.read().splitlines()
  assert lines[0] == "step,split,ln_ppl,tokens"
  assert [l.split(",")[:2] for l in lines[1:]] == [["4", "validation"],
                                                   ["12", "validation"]]
  assert abs(float(lines[2].split(",")[2]) - evals[1]["ln_ppl"]) < 1e-5
  for d in given:
    assert d["step"] == 12
    assert isinstance(d["input"], str) and d["input"].strip()
    assert isinstance(d["output"], str) and d["output"].strip()
  assert len(given) == 2
  assert given[0]["input"] == "The module defines the following functions."
  assert given[1]["input"] == "Return the number of items in a container."


@pytest.mark.slow
def test_finetune_gin_builds_and_freezes_the_embedding(reference, tmp_path):
  pre_dir, _ = reference
  model_dir = str(tmp_path / "finetuned")
  training.finetune(model_dir, pre_dir, T5_FILES + ["experiments/finetune.gin"],
                    T5_PARAMS + ["MIXTURE_NAME = 'th_span_corruption'",
                                 "targets_length = 14"], finetune_steps=2)
  assert [r[0] for r in _log(model_dir)] == [STEPS + 1, STEPS + 2]
  before = tf.train.load_checkpoint(tf.train.latest_checkpoint(pre_dir))
  after = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  assert after.get_tensor("global_step") == STEPS + 2
  np.testing.assert_array_equal(after.get_tensor("shared/embedding"),
                                before.get_tensor("shared/embedding"))
  name = [n for n, _ in tf.train.list_variables(pre_dir)
          if n.endswith("encoder/block_000/layer_000/TalkingHeadsAttention/p_q")
          or (n.startswith("encoder/") and n.endswith("/p_q"))][0]
  assert not np.array_equal(after.get_tensor(name), before.get_tensor(name))
  operative = open(os.path.join(model_dir, "operative_config.gin")).read()
  assert "dropout_rate = 0.1" in operative
  assert "constant_learning_rate.learning_rate = 0.001" in operative


def test_bert_trains_and_keeps_its_layers_apart(tmp_path):
  """BERT's AdamW (peak rate 1e-4 moves little in 10 steps: 0.003 here)."""
  model_dir = str(tmp_path / "bert")
  rows = training.train(
      model_dir, ["experiments/bert_heads/03_talking_heads_12_64.gin",
                  "models/bert_tiny.gin"],
      ["heads = 4", "d_k = 16", "d_v = 16", "mesh_shape = 'model:2'",
       "save_checkpoints_steps = 100", "warmup_steps = 1", "heads_k = 4",
       "heads_v = 4", "learning_rate = 0.003"], train_steps=10)
  losses = [r["loss"] for r in rows]
  assert len(losses) == 10 and all(math.isfinite(l) for l in losses)
  assert np.mean(losses[-3:]) < losses[0] - 1.0, losses
  variables = [n for n, _ in tf.train.list_variables(
      tf.train.latest_checkpoint(model_dir)) if "/adam_" not in n]
  assert any("block_001" in n for n in variables)  # BERT layers are separate
  assert not any("/shared_" in n for n in variables)
