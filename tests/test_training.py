"""End-to-end training on the embedded corpus, each run in a subprocess.

A tiny talking-heads T5 (4 heads of 16 so it is quick) is trained for 12
steps on mesh model:2 (heads:model) with a checkpoint every 4 steps: the
reference run.  Then the same command is killed with SIGKILL after a
checkpoint exists and rerun: it must resume, never duplicate a step, and
reproduce the reference losses step by step; no listed checkpoint may be
half-written.  The reference model is also evaluated (ln(PPL) per
checkpoint), decoded and fine-tuned with finetune.gin (the stock
t5_mesh_transformer script: test_stock_t5.py).  A tiny BERT and a tiny ALBERT
train too; ALBERT's layers share one set of variables.
"""
import glob
import json
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
MTF_TH = os.path.join(BIN, "mtf_th")
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


def _python(script, *args, timeout=900):
  proc = _run([sys.executable, "-c", script] + list(args), timeout=timeout)
  line = [l for l in proc.stdout.splitlines() if l.startswith("JSON")][-1]
  return json.loads(line[4:]), proc


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
  """The uninterrupted 12-step run."""
  model_dir = str(tmp_path_factory.mktemp("t5") / "reference")
  proc = _run(_train_cmd(model_dir))
  return model_dir, proc


def test_t5_trains_logs_and_checkpoints(reference):
  model_dir, proc = reference
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
  assert "steps/s" in proc.stderr and "ETA" in proc.stderr


def test_train_is_quiet_without_verbose(reference):
  """No CUDA-plugin lines, pkg_resources warning or tf.Print (compat.py)."""
  _, proc = reference
  for noise in _cli_util.NOISE:
    assert noise not in proc.stderr, (noise, proc.stderr[-3000:])
  assert "step %d loss" % STEPS in proc.stdout


def test_kill_9_then_resume_reproduces_the_reference(reference, tmp_path):
  ref_dir, _ = reference
  model_dir = str(tmp_path / "killed")
  cmd = _train_cmd(model_dir)
  victim = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
  killed_after = None
  deadline = time.time() + 900
  try:
    while time.time() < deadline and victim.poll() is None:
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

  proc = _run(cmd)
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


_EVAL_DECODE = r"""
import json, sys
from mtf_talking_heads import training
model_dir, files, params = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
results = training.evaluate(model_dir, files, params, checkpoint_steps=[4, 12])
given = training.decode(model_dir, files, params,
                        inputs=["The module defines the following functions.",
                                "Return the number of items in a container."])
print("JSON" + json.dumps({"eval": results, "given": given}))
"""


def test_eval_and_decode(reference):
  model_dir, _ = reference
  out, _ = _python(_EVAL_DECODE, model_dir, json.dumps(T5_FILES),
                   json.dumps(T5_PARAMS))
  evals = out["eval"]
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
  for d in out["given"]:
    assert d["step"] == 12
    assert isinstance(d["input"], str) and d["input"].strip()
    assert isinstance(d["output"], str) and d["output"].strip()
  assert len(out["given"]) == 2
  assert out["given"][0]["input"] == "The module defines the following functions."
  assert out["given"][1]["input"] == "Return the number of items in a container."


@pytest.mark.slow
def test_finetune_gin_builds_and_freezes_the_embedding(reference, tmp_path):
  pre_dir, _ = reference
  model_dir = str(tmp_path / "finetuned")
  _run([MTF_TH, "finetune", "--pretrained_model_dir", pre_dir,
        "--model_dir", model_dir, "--finetune_steps", "2"] +
       _flags(T5_FILES + ["experiments/finetune.gin"],
              T5_PARAMS + ["MIXTURE_NAME = 'th_span_corruption'",
                           "targets_length = 14"]))
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


_BERT_ALBERT = r"""
import json, sys
from mtf_talking_heads import training
import tensorflow as tf
small = ["heads = 4", "d_k = 16", "d_v = 16", "mesh_shape = 'model:2'",
         "save_checkpoints_steps = 100", "warmup_steps = 1"]
# BERT's AdamW / ALBERT's LAMB peak rates (1e-4, 0.00176) move little in 10 steps
rates = {"bert": "learning_rate = 0.003", "albert": "learning_rate = 0.01"}
out = {}
for name, files in (("bert", ["experiments/bert_heads/03_talking_heads_12_64.gin",
                              "models/bert_tiny.gin"]),
                    ("albert", ["experiments/albert_heads/06_talking_heads_12_64.gin",
                                "models/albert_tiny.gin"])):
  model_dir = sys.argv[1] + "/" + name
  rows = training.train(model_dir, files,
                        small + ["heads_k = 4", "heads_v = 4", rates[name]],
                        train_steps=int(sys.argv[2]))
  ckpt = tf.train.latest_checkpoint(model_dir)
  out[name] = {"losses": [r["loss"] for r in rows],
               "variables": dict((n, s) for n, s in tf.train.list_variables(ckpt))}
print("JSON" + json.dumps(out))
"""


def test_bert_and_albert_train_and_albert_shares_its_layers(tmp_path):
  out, _ = _python(_BERT_ALBERT, str(tmp_path), "10")
  for name in ("bert", "albert"):
    losses = out[name]["losses"]
    assert len(losses) == 10 and all(math.isfinite(l) for l in losses)
    assert np.mean(losses[-3:]) < losses[0] - 1.0, (name, losses)
  variables = {n: s for n, s in out["albert"]["variables"].items()
               if "/adam_" not in n and not n.startswith("global_step")}
  layer = {n: s for n, s in variables.items()
           if "/shared_attention/" in n or "/shared_feed_forward/" in n}
  # one layer's variables although the stack has 4 blocks
  suffixes = sorted(n.split("/shared_")[1] for n in layer)
  assert suffixes == sorted([
      "attention/TalkingHeadsAttention/p_k", "attention/TalkingHeadsAttention/p_l",
      "attention/TalkingHeadsAttention/p_o", "attention/TalkingHeadsAttention/p_q",
      "attention/TalkingHeadsAttention/p_v", "attention/TalkingHeadsAttention/p_w",
      "attention/rms_norm/scale",
      "feed_forward/DenseReluDense/wi/kernel",
      "feed_forward/DenseReluDense/wo/kernel",
      "feed_forward/rms_norm/scale"]), suffixes
  d, ff, h = 64, 256, 4
  one_layer = (4 * d * h * 16 + 2 * h * h) + 2 * d * ff + 2 * d
  assert sum(int(np.prod(s)) for s in layer.values()) == one_layer
  assert not any("block_00" in n or "layer_00" in n for n in variables)
  # embedding size = d_model (paper 7.2): vocab x 64, and positions x 64
  embedding = {n: s for n, s in variables.items() if "embedding" in n}
  assert sorted(map(tuple, embedding.values())) == [(64, 64), (8192, 64)]
  bert = {n for n in out["bert"]["variables"] if "/adam_" not in n}
  assert any("block_001" in n for n in bert)  # BERT layers are separate
