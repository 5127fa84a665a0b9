"""Bad configurations fail fast with a message that names the fix.

Every case runs training.train() in this process (the test session's 8
logical CPU devices) and must raise ConfigError before any graph exists:
the model directory is never created.  Two cases go through the real
`mtf_th` command line (exit status 2, one message on stderr).
"""
import os
import subprocess

import pytest

from mtf_talking_heads import training
from _cli_util import MTF_TH

T5 = ["experiments/t5_heads/07_talking_heads_24_32.gin", "models/t5_tiny.gin"]
BERT = ["experiments/bert_heads/01_multi_head_12_64.gin", "models/bert_tiny.gin"]
ALBERT = ["experiments/albert_heads/01_multi_head_6_128.gin",
          "models/albert_tiny.gin"]
LM = ["experiments/lm_heads/06_talking_heads_8_16.gin", "models/lm_tiny.gin"]

# name -> (gin files, gin params, words the message must contain)
CASES = {
    "corpus_missing": (T5, ["th_data.corpus_paths.train = '/no/such/dir/*.txt'",
                            "th_data.corpus_paths.validation = '/no/such/v.txt'"],
                       ["th_data.corpus_paths.train", "no file matches"]),
    "corpus_empty": (T5, ["th_data.corpus_paths.train = '{empty}'",
                          "th_data.corpus_paths.validation = '{empty}'"],
                     ["th_data.corpus_paths.train", "empty"]),
    "gin_file_missing": (["experiments/t5_heads/07_talking_heads_24_23.gin"],
                         [], ["no such file", "07_talking_heads_24_32.gin"]),
    "gin_binding_unknown_param": (T5, ["mtf_th.TalkingHeadsAttention.num_heads = 4"],
                                  ["num_heads", "TalkingHeadsAttention"]),
    "gin_binding_unknown_configurable": (T5, ["mtf_th.TalkingHeadAttention.heads = 4"],
                                         ["TalkingHeadAttention", "spelling"]),
    "gin_param_not_a_binding": (T5, ["heads"], ["not a binding", "name = value"]),
    "layout_unknown_dim": (T5, ["mesh_shape = 'model:2'", "layout = 'head:model'"],
                           ["'head'", "does not have", "heads"]),
    "mesh_too_big": (T5, ["mesh_shape = 'model:4,batch:4'"],
                     ["needs 16 devices", "8"]),
    "batch_not_divisible": (T5, ["mesh_shape = 'batch:3'", "layout = 'batch:batch'"],
                            ["batch_size 8", "batch:3", "multiple of 3"]),
    "heads_not_divisible": (T5, ["mesh_shape = 'model:8'", "heads = 12",
                                 "layout = 'heads:model'"],
                            ["'heads' (size 12)", "model:8"]),
    "two_heads_dims_one_axis": (T5, ["mesh_shape = 'model:2'",
                                     "layout = 'heads_k:model,heads:model'"],
                                ["two of its dims", "'heads_k'", "'heads'",
                                 "p_l"]),
    "heads_and_heads_v_one_axis": (T5, ["mesh_shape = 'model:2'",
                                        "layout = 'heads:model,heads_v:model'"],
                                   ["two of its dims", "'heads'",
                                    "'heads_v'", "p_w"]),
    "attention_file_without_model": (["attention/talking_heads.gin",
                                      "models/t5_tiny.gin"], [],
                                     ["tpu_mesh_shape", "models/*_base.gin"]),
    "targets_too_short": (T5, ["targets_length = 8"],
                          ["targets_length 8", "span corruption", "14"]),
    "aligned_lengths_differ": (BERT, ["targets_length = 32"],
                               ["aligned", "targets_length"]),
    "longer_than_position_table": (ALBERT, ["transformer.Unitransformer.max_length = 32"],
                                   ["position embedding", "max_length = 32"]),
    # a decoder-only fine-tuning reads "<inputs> EOS <targets> EOS": 16 + 32
    # positions do not fit lm_tiny's table of 32
    "delimited_lm_longer_than_position_table": (
        LM + ["experiments/finetune_embedded_lm.gin"],
        ["inputs_length = 32", "targets_length = 16",
         "transformer.Unitransformer.max_length = 32"],
        ["sequence length 48 (inputs_length + targets_length)",
         "position embedding", "max_length = 32", "shorten inputs_length",
         "keeps the table of its pre-training"]),
    "bad_attention_arg": (T5 + ["attention/dynamic_projections.gin"],
                          ["dynamic = ['x2q']"], ["dynamic", "x2q"]),
    "bad_mesh_string": (T5, ["mesh_shape = 'model=4'"], ["mesh_shape", "model:8"]),
    "train_steps_zero": (T5, [], ["--train_steps", "positive"]),
}

@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
  """{case: {"error": the ConfigError's text or None, "model_dir_exists"}}
  for CASES (training.train) and ACCEPTED (the pre-flight only)."""
  tmp = tmp_path_factory.mktemp("errors")
  empty = tmp / "empty.txt"
  empty.write_text("")
  out = {}
  for name, (files, params, _) in CASES.items():
    model_dir = str(tmp / "runs" / name)
    params = [p.replace("{empty}", str(empty)) for p in params]
    steps = 0 if name == "train_steps_zero" else 3
    try:
      training.train(model_dir, files, params, train_steps=steps)
      out[name] = {"error": None}
    except training.ConfigError as e:
      out[name] = {"error": str(e),
                   "model_dir_exists": os.path.exists(model_dir)}
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"error": "UNEXPECTED %s: %s" % (type(e).__name__, e)}
  # layouts that must pass the pre-flight checks (nothing is trained)
  for name, (files, params) in ACCEPTED.items():
    try:
      training.parse_gin(files, params)
      training.preflight()
      out[name] = {"error": None}
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
  return out


# name -> (gin files, gin params) that the checks must accept
ACCEPTED = {
    # the decoder-only fine-tuning of a tiny LM: 16 + 16 = its 32 positions
    "delimited_lm_fits_position_table": (
        LM + ["experiments/finetune_embedded_lm.gin"],
        ["inputs_length = 16", "targets_length = 16",
         "transformer.Unitransformer.max_length = 32"]),
    # a strategy's own dim (core_shard) and heads_k, heads_v on one axis
    "batch_split_layout": (T5, [
        "mesh_shape = 'model:2'",
        "layout = 'heads_k:model,heads_v:model,core_shard:model'",
        "mtf_th.TalkingHeadsAttention.strategy = @mtf_th.BatchSplit()"]),
    "query_split_layout": (T5, [
        "mesh_shape = 'model:2'",
        "layout = 'batch:batch,heads_k:model,heads_v:model,core_shard:model'",
        "mtf_th.TalkingHeadsAttention.strategy = @mtf_th.QuerySplit()"]),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_valid_layout_passes_the_checks(outcomes, name):
  assert outcomes[name]["error"] is None, outcomes[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_error_names_the_fix(outcomes, name):
  result = outcomes[name]
  assert result["error"] and not result["error"].startswith("UNEXPECTED"), \
      result
  for word in CASES[name][2]:
    assert word in result["error"], (word, result["error"])
  assert result["model_dir_exists"] is False  # nothing built or written


def _cli(args, tmp_path):
  return subprocess.run([MTF_TH] + args, cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=600)


def test_cli_missing_gin_file_exits_2(tmp_path):
  proc = _cli(["train", "--model_dir", str(tmp_path / "m"),
               "--gin_file", "models/no_such_model.gin"], tmp_path)
  assert proc.returncode == 2
  assert "no such file" in proc.stderr and "models/no_such_model.gin" in \
      proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "m").exists()


def test_cli_eval_without_checkpoint_exits_2(tmp_path):
  proc = _cli(["eval", "--model_dir", str(tmp_path), "--gin_file", T5[0],
               "--checkpoint_steps", "100,200"], tmp_path)
  assert proc.returncode == 2
  assert "no checkpoint" in proc.stderr and "train first" in proc.stderr


def test_cli_usage_error_exits_2(tmp_path, capsys):
  from mtf_talking_heads.commands import evaluate as eval_command
  from mtf_talking_heads.commands import train as train_command
  assert train_command.main(["--model_dir", str(tmp_path / "m"),
                             "--train_steps", "zero"]) == 2
  assert eval_command.main(["--checkpoint_steps", "1"]) == 2
  err = capsys.readouterr().err
  assert "--train_steps" in err and "positive integer" in err
  assert "--model_dir" in err
  assert not (tmp_path / "m").exists()


def test_cli_says_what_it_does_before_loading_tensorflow(tmp_path):
  import time  # pylint: disable=g-import-not-at-top
  start = time.time()
  proc = subprocess.Popen(
      [MTF_TH, "train", "--model_dir", str(tmp_path / "m"), "--gin_file",
       T5[0], "--gin_file", T5[1]], cwd=str(tmp_path),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    first = proc.stderr.readline()
    seconds = time.time() - start
  finally:
    proc.kill()
    proc.wait()
  assert first.startswith("[train] %s + %s in " % tuple(T5)), first
  assert "building the graph" in first
  assert seconds < 5, seconds  # ~0.5 s idle; TensorFlow's import takes 5-20 s
