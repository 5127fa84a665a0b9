"""Issue 35, item 1: a model_dir holds one model, and every command knows it.

One tiny talking-heads LM (2 layers, d_model 32) is trained once for the
module, with the identity file the first save writes
(runtime/identity.py, training/identity.py).  Then, through the real
commands:

* a writer (train, finetune's own model_dir, a sweep's run folder) given
  another model is refused in one line naming the difference and the two
  ways out, and the directory is byte-identical afterwards (sizes, sha256
  and mtimes of every file): before TensorFlow loads when the gin text
  shows it (num_layers, the attention class, the heads dims), else once
  the graph's weights are known (a sequence length: the position table);
* a model_dir trained before the identity file (checkpoints, no
  model_identity.json) is protected the same way (its operative_config.gin;
  without that, its latest checkpoint's weights) and resumes with its own
  configuration, which then records its identity;
* eval and decode refuse gin settings of another model, and an old mixed
  model_dir's checkpoints of another model (the issue's eval --
  checkpoint_steps all), while its own checkpoints still evaluate;
* finetune says in one line exactly which weights it loads and which it
  initialises; a talking-heads checkpoint under a multi-head experiment is
  refused unless --allow_partial_load, and then the stated lists are the
  weights that really were loaded (equal values) and initialised;
* visualize refuses a --baseline of another model.

The cases that need TensorFlow run in one subprocess calling each command's
main() (as tests/commands/test_bad_inputs.py does); the ones before it as
`mtf_th` processes, checked for not importing TensorFlow.
"""
import json
import os
import re
import shutil

import pytest

import _cli_util
import _in_process
from _identity_util import expand
from _identity_util import listing
from mtf_talking_heads.runtime import identity

TH = ["--gin_file", "experiments/lm_heads/05_talking_heads_4_32.gin",
      "--gin_file", "models/lm_tiny.gin"]
MH = ["--gin_file", "experiments/lm_heads/01_multi_head_4_32.gin",
      "--gin_file", "models/lm_tiny.gin"]
SIZE = ["--gin_param", "num_layers = 2", "--gin_param", "d_model = 32",
        "--gin_param", "d_ff = 64"]
ONE_LAYER = ["--gin_param", "num_layers = 1"]
WAYS_OUT = "use a new --model_dir, or num_layers = 2 as before"

_SCRIPT = r"""
import json, os, shutil, sys
base = sys.argv[1]
from _identity_util import listing
from _in_process import call
from mtf_talking_heads.commands import evaluate, finetune, train, visualize
TH, MH, SIZE = json.loads(sys.argv[2])
mains = {"train": train.main, "eval": evaluate.main,
         "finetune": finetune.main, "visualize": visualize.main}
out = {}

def run(name, command, argv, watch):
  before = listing(watch)
  out[name] = dict(call(mains[command], argv),
                   unchanged=listing(watch) == before)

def path(name):
  return os.path.join(base, name)

def copy(source, name, remove=()):
  shutil.copytree(path(source), path(name))
  for f in remove:
    os.remove(os.path.join(path(name), f))

run("trained", "train", ["--model_dir", path("th"), "--train_steps", "2"]
    + TH + SIZE, base)
copy("th", "legacy", ["model_identity.json"])
copy("th", "bare", ["model_identity.json", "operative_config.gin"])
copy("th", "mixed", ["model_identity.json"])
# a sequence length: no architecture macro, but the position table's shape
run("train_other_length", "train", ["--model_dir", path("th"),
    "--train_steps", "4", "--gin_param", "targets_length = 64",
    "--gin_param", "inputs_length = 64"] + TH + SIZE, path("th"))
# no identity file, no operative_config.gin: the checkpoint's weights
run("bare_one_layer", "train", ["--model_dir", path("bare"), "--train_steps",
    "4"] + TH + SIZE + ["--gin_param", "num_layers = 1"], path("bare"))
run("legacy_resume", "train", ["--model_dir", path("legacy"),
    "--train_steps", "3"] + TH + SIZE, base)
run("finetune_partial", "finetune", ["--model_dir", path("ft_mh"),
    "--pretrained_model_dir", path("th"), "--finetune_steps", "1",
    "--allow_partial_load"] + MH + SIZE, path("th"))
run("finetune_same", "finetune", ["--model_dir", path("ft_th"),
    "--pretrained_model_dir", path("th"), "--finetune_steps", "1"] + TH
    + SIZE, path("th"))
run("finetune_bare_refused", "finetune", ["--model_dir", path("ft_bare"),
    "--pretrained_model_dir", path("bare"), "--finetune_steps", "1"] + MH
    + SIZE, path("bare"))
# a model_dir mixed before this check existed: 2-layer talking-heads
# checkpoints 0 and 2, then a multi-head run's checkpoint 4 and its
# operative_config.gin
for suffix in (".index", ".data-00000-of-00002", ".data-00001-of-00002"):
  shutil.copy(os.path.join(path("ft_mh"), "model.ckpt-3" + suffix),
              os.path.join(path("mixed"), "model.ckpt-4" + suffix))
shutil.copy(os.path.join(path("ft_mh"), "operative_config.gin"),
            path("mixed"))
with open(os.path.join(path("mixed"), "checkpoint"), "w") as f:
  f.write('model_checkpoint_path: "model.ckpt-4"\n')
run("mixed_eval_all", "eval", ["--model_dir", path("mixed"),
    "--checkpoint_steps", "all"], path("mixed"))
run("mixed_eval_own", "eval", ["--model_dir", path("mixed"),
    "--checkpoint_steps", "4"], path("th"))
run("visualize_other_baseline", "visualize", ["--model_dir", path("th"),
    "--baseline", os.path.join(path("ft_mh"), "model.ckpt-3")], path("th"))

import numpy as np
import tensorflow.compat.v1 as tf
from mtf_talking_heads.runtime import identity

def weights(prefix):
  return sorted(identity.weights(dict(tf.train.list_variables(prefix))))

th = tf.train.load_checkpoint(os.path.join(path("th"), "model.ckpt-2"))
ft = tf.train.load_checkpoint(os.path.join(path("ft_mh"), "model.ckpt-2"))
out["th_weights"] = weights(os.path.join(path("th"), "model.ckpt-2"))
out["ft_weights"] = weights(os.path.join(path("ft_mh"), "model.ckpt-2"))
out["equal_values"] = sorted(
    n for n in set(out["th_weights"]) & set(out["ft_weights"])
    if np.array_equal(th.get_tensor(n), ft.get_tensor(n)))
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The trained model_dir `th`, copies of it, and the outcomes of the
  cases after TensorFlow (one subprocess: _SCRIPT)."""
  base = str(tmp_path_factory.mktemp("identity"))
  out = _in_process.run_script(_SCRIPT, [base, json.dumps([TH, MH, SIZE])],
                               cwd=base, timeout=1200)
  assert out["trained"]["code"] == 0, out["trained"]["stderr"][-2000:]
  return dict(base=base, th=os.path.join(base, "th"), out=out)


def _one_line(stderr):
  """The refusal: the one line besides the announce and size lines."""
  lines = [l for l in stderr.splitlines() if not l.startswith("[")]
  assert len(lines) == 1, stderr[-2000:]
  return lines[0]


def _copy(world, name, remove=()):
  target = os.path.join(world["base"], "copies", name)
  shutil.copytree(world["th"], target)
  for f in remove:
    os.remove(os.path.join(target, f))
  return target


def test_the_first_save_records_the_model(world):
  found = identity.read(world["th"])
  assert found.architecture == {
      "model_type": "lm", "num_layers": 2, "d_model": 32, "d_ff": 64,
      "relative_attention_type": None,
      "dec_self_attention": "@mtf_th.TalkingHeadsAttention", "heads": 4,
      "d_k": 32, "d_v": 32, "heads_k": 4, "heads_v": 4}
  assert sorted(found.variables) == world["out"]["th_weights"]
  assert found.variables["transformer/embedding"] == ([384, 32], "float32")
  assert found.variables[
      "transformer/block_001/layer_000/TalkingHeadsAttention/p_l"] == (
          [4, 4], "float32")
  assert not os.path.exists(os.path.join(
      world["th"], identity.IDENTITY_FILE + ".tmp"))


# Refused before TensorFlow: name -> (argv with {th} {legacy}, the line's
# words).  Each runs on a fresh copy of the trained model_dir.
BEFORE_TF = {
    "train_one_layer": (
        ["train", "--model_dir", "{dir}", "--train_steps", "4"] + TH + SIZE
        + ONE_LAYER,
        ["mtf_th train: error: --model_dir {dir} holds a model trained with "
         "num_layers = 2 ({dir}/model_identity.json), but this "
         "configuration makes num_layers = 1: training on would mix two "
         "models in one directory; " + WAYS_OUT]),
    "train_multi_head": (
        ["train", "--model_dir", "{dir}", "--train_steps", "4"] + MH + SIZE,
        ["trained with dec_self_attention = @mtf_th.TalkingHeadsAttention",
         "makes dec_self_attention = @mtf_th.MultiHeadAttention",
         "use a new --model_dir, or dec_self_attention = "
         "@mtf_th.TalkingHeadsAttention as before"]),
    "train_other_heads": (
        ["train", "--model_dir", "{dir}", "--train_steps", "4"] + TH + SIZE
        + ["--gin_param", "heads = 8", "--gin_param", "heads_k = 8",
           "--gin_param", "heads_v = 8"],
        ["trained with heads = 4, heads_k = 4, heads_v = 4 (",
         "makes heads = 8, heads_k = 8, heads_v = 8: ",
         "use a new --model_dir, or heads = 4, heads_k = 4, heads_v = 4 as "
         "before"]),
    "legacy_train_one_layer": (
        ["train", "--model_dir", "{legacy}", "--train_steps", "4"] + TH
        + SIZE + ONE_LAYER,
        ["--model_dir {legacy} holds a model trained with num_layers = 2 "
         "({legacy}/operative_config.gin), but", WAYS_OUT]),
    "eval_one_layer": (
        ["eval", "--model_dir", "{dir}"] + TH + SIZE + ONE_LAYER,
        ["mtf_th eval: error: --model_dir {dir} holds a model trained with "
         "num_layers = 2", "leave out the --gin_file / --gin_param that "
         "change it", "or give num_layers = 2"]),
    "decode_one_layer": (
        ["decode", "--model_dir", "{dir}", "--input", "a b"] + TH + SIZE
        + ONE_LAYER,
        ["mtf_th decode: error: --model_dir {dir} holds a model trained "
         "with num_layers = 2", "or give num_layers = 2"]),
    "finetune_multi_head": (
        ["finetune", "--model_dir", "{dir}_ft", "--pretrained_model_dir",
         "{dir}", "--finetune_steps", "1"] + MH + SIZE,
        ["mtf_th finetune: error: --pretrained_model_dir {dir} holds a model "
         "trained with dec_self_attention = @mtf_th.TalkingHeadsAttention",
         "give the gin files it was trained with", "--allow_partial_load"]),
    "damaged_identity_file": (
        ["train", "--model_dir", "{damaged}", "--train_steps", "4"] + TH
        + SIZE,
        ["mtf_th train: error: {damaged}/model_identity.json cannot be read "
         "(", "delete it, and the next run derives it again"]),
}


@pytest.mark.parametrize("name", sorted(BEFORE_TF))
def test_refused_before_tensorflow(world, name):
  argv, words = BEFORE_TF[name]
  dirs = dict(dir=_copy(world, name),
              legacy=_copy(world, name + "_legacy", [identity.IDENTITY_FILE]),
              damaged=_copy(world, name + "_damaged"))
  with open(os.path.join(dirs["damaged"], identity.IDENTITY_FILE), "w") as f:
    f.write('{"format": 1, "architecture": {"num_layers": 2}, "variab')
  before = {k: listing(d) for k, d in dirs.items()}
  result = _cli_util.run([a.format(**dirs) for a in argv], cwd=world["base"])
  assert result.code == 2, result.stderr[-2000:]
  line = _one_line(result.stderr)
  for word in words:
    assert word.format(**dirs) in line, line
  assert result.tensorflow is False
  assert {k: listing(d) for k, d in dirs.items()} == before
  assert not os.path.exists(dirs["dir"] + "_ft")


def test_other_length_is_refused_once_the_weights_are_known(world):
  """No architecture macro differs, the position table does: refused after
  the graph's weights are known, before anything is written."""
  result = world["out"]["train_other_length"]
  assert result["code"] == 2
  assert _one_line(result["stderr"]) == (
      "mtf_th train: error: --model_dir {th} holds another model than this "
      "configuration builds ({th}/model_identity.json): "
      "transformer/positional_embedding is [32, 32] float32 in the "
      "model_dir, [64, 32] float32 in this configuration; use a new "
      "--model_dir, or the gin files it was trained with (see "
      "{th}/operative_config.gin)".format(th=world["th"]))
  assert result["unchanged"]


def test_legacy_model_dir_is_protected_by_its_checkpoint(world):
  """No identity file and no operative_config.gin: the latest checkpoint's
  weights are the model (tf.train.list_variables)."""
  result = world["out"]["bare_one_layer"]
  bare = os.path.join(world["base"], "bare")
  assert result["code"] == 2
  assert _one_line(result["stderr"]) == (
      "mtf_th train: error: --model_dir {d} holds another model than this "
      "configuration builds (model.ckpt-2): 2 layers in transformer/ in the "
      "model_dir, 1 in this configuration; only in the model_dir: "
      "transformer/block_001/layer_000/TalkingHeadsAttention/{{p_k,p_l,p_o,"
      "p_q,p_v,p_w}}, transformer/block_001/layer_000/rms_norm/scale, "
      "transformer/block_001/layer_001/DenseReluDense/wi/kernel, "
      "transformer/block_001/layer_001/DenseReluDense/wo/kernel, "
      "transformer/block_001/layer_001/rms_norm/scale; use a new "
      "--model_dir, or the gin files it was trained with (see "
      "{d}/operative_config.gin)".format(d=bare))
  assert result["unchanged"]


def test_legacy_model_dir_resumes_and_records_its_identity(world):
  result = world["out"]["legacy_resume"]
  legacy = os.path.join(world["base"], "legacy")
  assert result["code"] == 0, result["stderr"][-2000:]
  assert "step 3 loss" in result["stdout"]
  assert identity.read(legacy)._replace(source=None) == identity.read(
      world["th"])._replace(source=None)


def _load_line(stderr):
  lines = [l for l in stderr.splitlines() if l.startswith("[finetune] from ")
           and ": loads " in l]
  assert len(lines) == 1, stderr[-2000:]
  return lines[0]


def test_finetune_states_every_weight_it_loads(world):
  result = world["out"]["finetune_same"]
  assert result["code"] == 0, result["stderr"][-2000:]
  assert _load_line(result["stderr"]) == (
      "[finetune] from %s/model.ckpt-2 (step 2): loads all %d weights of this "
      "configuration (and their optimizer slots), initialises none"
      % (world["th"], len(world["out"]["th_weights"])))
  assert len(world["out"]["th_weights"]) == 23  # docs/training.md
  assert result["unchanged"]  # the pre-trained model_dir


def test_finetune_partial_load_states_exactly_what_it_loads(world):
  """A talking-heads checkpoint under a multi-head experiment with
  --allow_partial_load: the line's lists are exactly the weights both
  have (loaded: equal values in the fine-tuned model's first checkpoint),
  the multi-head ones (initialised) and the talking-heads ones (left out)."""
  out = world["out"]
  result = out["finetune_partial"]
  assert result["code"] == 0, result["stderr"][-2000:]
  line = _load_line(result["stderr"])
  match = re.match(
      r"\[finetune\] from (\S+) \(step 2\): loads (\d+) of this "
      r"configuration's (\d+) weights \((.*)\), initialises (\d+) \((.*)\), "
      r"leaves out (\d+) of the checkpoint's \((.*)\)$", line)
  assert match, line
  th, ft = set(out["th_weights"]), set(out["ft_weights"])
  loaded, initialised, left_out = (sorted(expand(match.group(i)))
                                   for i in (4, 6, 8))
  assert match.group(1) == os.path.join(world["th"], "model.ckpt-2")
  assert loaded == sorted(th & ft) == out["equal_values"]
  assert initialised == sorted(ft - th)
  assert left_out == sorted(th - ft)
  assert [int(match.group(i)) for i in (2, 3, 5, 7)] == [
      len(loaded), len(ft), len(initialised), len(left_out)]
  assert len(loaded) == 11 and len(initialised) == 8 and len(left_out) == 12
  assert all("/MultiHeadAttention/" in n for n in initialised)
  assert all("/TalkingHeadsAttention/" in n for n in left_out)
  assert result["unchanged"]


def test_finetune_refuses_another_variant_once_the_weights_are_known(world):
  """The pre-trained model_dir has neither identity file nor
  operative_config.gin: its checkpoint's weights show the variant."""
  result = world["out"]["finetune_bare_refused"]
  bare = os.path.join(world["base"], "bare")
  assert result["code"] == 2
  line = _one_line(result["stderr"])
  assert line.startswith(
      "mtf_th finetune: error: --pretrained_model_dir %s: checkpoint "
      "model.ckpt-2 holds another model than this configuration builds: "
      "layers TalkingHeadsAttention in the checkpoint, MultiHeadAttention "
      "in this configuration; only in the checkpoint: " % bare), line
  assert line.endswith(
      "or pass --allow_partial_load to load only the weights of the same "
      "name and shape and initialise the others"), line
  assert result["unchanged"]
  assert not os.path.exists(os.path.join(world["base"], "ft_bare"))


def test_eval_of_a_mixed_model_dir(world):
  """The issue's case: a multi-head run resumed into a talking-heads
  model_dir (before this check) left checkpoints of two models; eval
  --checkpoint_steps all with the last run's operative_config.gin names the
  first checkpoint of the other model instead of reporting its wrong
  ln(PPL); the multi-head checkpoint alone evaluates."""
  out = world["out"]
  mixed = os.path.join(world["base"], "mixed")
  result = out["mixed_eval_all"]
  assert result["code"] == 2
  assert _one_line(result["stderr"]).startswith(
      "mtf_th eval: error: --model_dir %s: checkpoint model.ckpt-0 holds "
      "another model than this configuration builds: layers "
      "TalkingHeadsAttention in the checkpoint, MultiHeadAttention in this "
      "configuration; " % mixed)
  assert result["stdout"] == "" and result["unchanged"]
  own = out["mixed_eval_own"]
  assert own["code"] == 0, own["stderr"][-2000:]
  assert own["stdout"].splitlines()[1].startswith("4,validation,")


def test_visualize_refuses_a_baseline_of_another_model(world):
  result = world["out"]["visualize_other_baseline"]
  assert result["code"] == 2
  assert _one_line(result["stderr"]).startswith(
      "mtf_th visualize: error: --baseline %s/model.ckpt-3 holds another "
      "model than %s/model.ckpt-2: layers TalkingHeadsAttention in "
      "model.ckpt-2, MultiHeadAttention in the baseline; " % (
          os.path.join(world["base"], "ft_mh"), world["th"]))
  assert result["unchanged"]


def test_sweep_refuses_a_run_folder_of_another_model(world):
  """A sweep's run folder that holds another model than its row's gin files
  make now (a row's file edited, sweep.json deleted): refused before any
  run starts, before TensorFlow, the folder untouched."""
  output_dir = os.path.join(world["base"], "sweep")
  run_dir = os.path.join(output_dir, "runs", "05_talking_heads_4_32",
                         "seed_1")
  shutil.copytree(world["th"], run_dir)
  before = listing(output_dir)
  result = _cli_util.run(
      ["sweep", "--paper_table", "lm_heads", "--rows", "5", "--scale", "tiny",
       "--gin_param", "d_model = 32", "--gin_param", "d_ff = 64",
       "--train_steps", "4", "--eval_steps", "2,4", "--output_dir",
       output_dir], cwd=world["base"])
  assert result.code == 2, result.stderr[-2000:]
  assert _one_line(result.stderr) == (
      "mtf_th sweep: error: run folder %s holds a model trained with "
      "num_layers = 2 (%s/model_identity.json), but this configuration "
      "makes num_layers = 1: training on would mix two models in one run "
      "folder; use a new --output_dir, or the settings it was trained with "
      "(num_layers = 2)" % (run_dir, run_dir))
  assert result.tensorflow is False
  assert listing(output_dir) == before
