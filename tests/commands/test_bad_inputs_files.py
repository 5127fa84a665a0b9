"""Damaged files of a model_dir or a sweep (issue 35), through `mtf_th`.

One tiny LM is trained once for the module (checkpoints 0, 2, 4).  Each
refusal case copies it, damages one file (a checkpoint index emptied or
garbled, a data shard cut, train_log.csv a folder or binary, the lock a
folder or mistyped, the `checkpoint` file gone, a newline in a path, a
results.csv edited, cut or recorded at other steps ...) and runs the
command as a user would: exit status 2, one line on stderr naming the
file and the fix, no TensorFlow imported, and the directory the same byte
for byte (and mtime for mtime) after as before.  What needs TensorFlow
runs in the subprocess that trains the model: a resume after a cut or
unterminated train_log.csv keeps every row; the model.ckpt-N_temp folder
of a killed save is removed by the next save that supersedes it; an eval
stopped during its second checkpoint keeps the first one's result in
eval_results.csv; the library's own setup refuses a damaged checkpoint
too.  Readers' unit tests: tests/runtime/test_run_files.py,
test_checkpoint_files.py, test_dir_lock.py.
"""
import json
import os
import shutil

import pytest

import _cli_util
import _in_process
from _damage import cut, replace_with_folder, write
from mtf_talking_heads.experiments.sweep import results as sweep_results

LM = ["--gin_file", "experiments/lm_heads/05_talking_heads_4_32.gin",
      "--gin_file", "models/lm_tiny.gin", "--gin_param", "d_model = 32",
      "--gin_param", "d_ff = 64"]
ROW = "05_talking_heads_4_32"
SWEEP = ["sweep", "--paper_table", "lm_heads", "--rows", "5", "--scale",
         "tiny", "--train_steps", "8", "--eval_steps", "4,8",
         "--gin_param", "d_model = 32", "--gin_param", "d_ff = 64"]

_SCRIPT = r"""
import json, os, shutil, sys
base = sys.argv[1]
lm = json.loads(sys.argv[2])
import _in_process
from mtf_talking_heads.commands import evaluate, train
from mtf_talking_heads import training
from mtf_talking_heads.training import evaluation
out = {}

def call(name, main, argv):
  out[name] = _in_process.call(main, argv)

def log_text(d):
  with open(os.path.join(d, "train_log.csv")) as f:
    return f.read()

trained = os.path.join(base, "trained")
call("trained", train.main, ["--model_dir", trained, "--train_steps", "4"]
     + lm)
out["trained"]["log"] = log_text(trained)

# a resume after a train_log.csv whose last row lacks its newline, with the
# _temp folders of killed saves of steps 3 and 9 beside it
d = os.path.join(base, "unterminated")
shutil.copytree(trained, d)
with open(os.path.join(d, "train_log.csv"), "r+") as f:
  f.truncate(len(f.read().rstrip("\n")))
for step in (3, 9):
  os.makedirs(os.path.join(d, "model.ckpt-%d_temp" % step))
  open(os.path.join(d, "model.ckpt-%d_temp" % step,
                    "part-00000-of-00002.index"), "w").close()
call("unterminated", train.main, ["--model_dir", d, "--train_steps", "6"]
     + lm)
out["unterminated"]["log"] = log_text(d)
out["unterminated"]["files"] = sorted(os.listdir(d))

# a resume after a train_log.csv cut inside its last row (a crash)
d = os.path.join(base, "cut")
shutil.copytree(trained, d)
with open(os.path.join(d, "train_log.csv"), "r+") as f:
  f.truncate(len(f.read().rstrip("\n")) - 5)
out["cut_before"] = log_text(d)
call("cut", train.main, ["--model_dir", d, "--train_steps", "6"] + lm)
out["cut"]["log"] = log_text(d)

# an eval stopped (Ctrl-C) while it scores its second checkpoint
d = os.path.join(base, "stopped_eval")
shutil.copytree(trained, d)
configure = evaluation.estimator_lib.configure_estimator
def stop_at_the_second(estimator, seed):
  configure(estimator, seed)
  evaluate_fn, calls = estimator.evaluate, []
  def evaluate_or_stop(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return evaluate_fn(*args, **kwargs)
  estimator.evaluate = evaluate_or_stop
evaluation.estimator_lib.configure_estimator = stop_at_the_second
call("stopped_eval", evaluate.main, [
    "--model_dir", d, "--checkpoint_steps", "2,4", "--gin_param",
    "mtf_th.evaluate_checkpoints.max_eval_examples = 8"])
evaluation.estimator_lib.configure_estimator = configure
with open(os.path.join(d, "eval_results.csv")) as f:
  out["stopped_eval"]["eval_results"] = f.read()

# the library's setup refuses what the command's pre-check refuses
d = os.path.join(base, "library")
shutil.copytree(trained, d)
open(os.path.join(d, "model.ckpt-4.index"), "w").close()
try:
  training.train(d, lm[1:4:2], lm[5::2], train_steps=6)
  out["library"] = "trained"
except training.ConfigError as e:
  out["library"] = str(e)
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The trained model_dir and the outcomes of _SCRIPT's cases."""
  base = str(tmp_path_factory.mktemp("bad_files"))
  out = _in_process.run_script(_SCRIPT, [base, json.dumps(LM)], cwd=base)
  assert out["trained"]["code"] == 0, out["trained"]["stderr"][-2000:]
  return dict(base=base, trained=os.path.join(base, "trained"), after=out)


def _rows(log):
  lines = log.splitlines()
  assert lines[0] == "step,loss,steps_per_sec,elapsed_sec"
  for line in lines[1:]:  # every line a whole row: none glued to another
    step, loss, rate, elapsed = line.split(",")
    int(step), float(loss), float(rate), float(elapsed)
  return [int(l.split(",")[0]) for l in lines[1:]]


def test_resume_after_an_unterminated_last_row_keeps_every_row(world):
  result = world["after"]["unterminated"]
  assert result["code"] == 0, result["stderr"][-2000:]
  assert _rows(world["after"]["trained"]["log"]) == [1, 2, 3, 4]
  assert _rows(result["log"]) == [1, 2, 3, 4, 5, 6]


def test_resume_after_a_cut_last_row_loses_only_that_row(world):
  assert world["after"]["cut_before"].endswith(
      world["after"]["trained"]["log"].splitlines()[-1][:-5])
  result = world["after"]["cut"]
  assert result["code"] == 0, result["stderr"][-2000:]
  assert _rows(result["log"]) == [1, 2, 3, 5, 6]


def test_the_next_save_removes_the_temp_folder_of_a_killed_save(world):
  """model.ckpt-3_temp (a save of step 3 killed half-way) is superseded by
  the saves of steps 4 and 6 and removed; model.ckpt-9_temp is not (step 9
  has not been saved since)."""
  files = world["after"]["unterminated"]["files"]
  assert "model.ckpt-9_temp" in files and "model.ckpt-3_temp" not in files
  assert "model.ckpt-6.index" in files


def test_a_stopped_eval_keeps_the_results_it_printed(world):
  result = world["after"]["stopped_eval"]
  assert result["code"] == 130, result["stderr"][-2000:]
  printed = [l for l in result["stderr"].splitlines()
             if l.startswith("[eval] checkpoint") and "ln(PPL)" in l]
  assert len(printed) == 1 and printed[0].startswith(
      "[eval] checkpoint 2: ln(PPL) "), result["stderr"]
  ln_ppl = float(printed[0].split()[4])
  lines = result["eval_results"].splitlines()
  assert lines[0] == "step,split,ln_ppl,tokens" and len(lines) == 2
  step, split, value, tokens = lines[1].split(",")
  assert (step, split) == ("2", "validation") and int(tokens) > 0
  assert abs(float(value) - ln_ppl) < 1e-4


def test_the_librarys_setup_refuses_a_damaged_checkpoint(world):
  assert world["after"]["library"].startswith(
      "--model_dir %s: model.ckpt-4.index is damaged: it is empty; training "
      "resumes from model.ckpt-4 and cannot read it: move model.ckpt-4.* "
      "away and write model_checkpoint_path: \"model.ckpt-2\""
      % os.path.join(world["base"], "library"))


# --------------------------------------------------------------------------
# refusals before TensorFlow, the model_dir unchanged byte for byte


def _tree(path):
  """{relative path: (bytes or "<dir>", mtime_ns)} of a directory tree."""
  out = {}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(root, name)
      rel = os.path.relpath(full, path)
      content = "<dir>"
      if not os.path.isdir(full):
        with open(full, "rb") as f:
          content = f.read()
      out[rel] = (content, os.lstat(full).st_mtime_ns)
  return out


def _as_delimited_lm(path):
  with open(path) as f:
    text = f.read()
  assert "run.model_type = 'lm'\n" in text
  write(path, text.replace("run.model_type = 'lm'\n",
                            "run.model_type = 'delimited_lm'\n").encode())


def _lock(content):
  def damage(d):
    if content is None:
      os.makedirs(os.path.join(d, "mtf_th.lock"))
    else:
      write(os.path.join(d, "mtf_th.lock"), content)
  return damage


# name -> (damage(model_dir), argv with {d} {base}, words of the one line)
TRAIN = ["train", "--model_dir", "{d}", "--train_steps", "6"] + LM
CASES = {
    "empty_index": (
        lambda d: cut(os.path.join(d, "model.ckpt-4.index"), 0), TRAIN,
        ["--model_dir {d}: model.ckpt-4.index is damaged: it is empty; "
         "training resumes from model.ckpt-4 and cannot read it: move "
         "model.ckpt-4.* away and write model_checkpoint_path: "
         "\"model.ckpt-2\" into {d}/checkpoint to resume from step 2, or use "
         "a new --model_dir"]),
    "garbage_index": (
        lambda d: write(os.path.join(d, "model.ckpt-4.index"), b"x" * 600),
        TRAIN, ["model.ckpt-4.index is damaged: its last 8 bytes are not an "
                "index's footer", "resume from step 2"]),
    "eval_cut_data": (
        lambda d: cut(os.path.join(
            d, "model.ckpt-4.data-00001-of-00002"), 1000),
        ["eval", "--model_dir", "{d}"],
        ["--model_dir {d}: model.ckpt-4.data-00001-of-00002 is 1000 bytes, "
         "but its index places tensors up to byte", "TensorFlow cannot read "
         "checkpoint 4: restore its files, or give another step with "
         "--checkpoint_steps (readable: 0, 2)"]),
    "visualize_cut_data": (
        lambda d: cut(os.path.join(
            d, "model.ckpt-4.data-00001-of-00002"), 1000),
        ["visualize", "--model_dir", "{d}"],
        ["--model_dir {d}: model.ckpt-4.data-00001-of-00002 is 1000 bytes",
         "pass another checkpoint (e.g. {d}/model.ckpt-2)"]),
    "state_file_missing": (
        lambda d: os.remove(os.path.join(d, "checkpoint")), TRAIN,
        ["--model_dir {d} holds model.ckpt-0, 2, 4 but no 'checkpoint' file",
         "write model_checkpoint_path: \"model.ckpt-4\" into {d}/checkpoint"]),
    "train_log_is_a_folder": (
        lambda d: replace_with_folder(os.path.join(d, "train_log.csv")),
        TRAIN, ["{d}/train_log.csv is a folder, not the run's train_log.csv: "
                "move it away (mv {d}/train_log.csv {d}/train_log.csv.bad)"]),
    "train_log_is_binary": (
        lambda d: write(os.path.join(d, "train_log.csv"), b"\x00\x9f" * 40),
        TRAIN, ["{d}/train_log.csv has NUL bytes: it is not the run's "
                "train_log.csv as written"]),
    "eval_results_garbled": (
        lambda d: write(os.path.join(d, "eval_results.csv"),
                        b"step,split,ln_ppl,tokens\n2,validation,6.5\n"
                        b"4,validation,6.000000,90\n"),
        ["eval", "--model_dir", "{d}"],
        ["{d}/eval_results.csv: line 2 ('2,validation,6.5') is not a row of "
         "step,split,ln_ppl,tokens: correct or delete that line"]),
    "lock_is_a_folder": (
        _lock(None), TRAIN,
        ["--model_dir {d}: its lock file {d}/mtf_th.lock is a folder, not a "
         "lock file: if no other run writes to {d}, remove it (rm -r "
         "{d}/mtf_th.lock)"]),
    "lock_field_of_wrong_type": (
        _lock(b'{"pid": "1234", "host": "h", "started": 1.0}'), TRAIN,
        ["its lock file {d}/mtf_th.lock has pid '1234', not a process id"]),
    "eval_duplicate_steps": (
        None, ["eval", "--model_dir", "{d}", "--checkpoint_steps", "2,4,2"],
        ["--checkpoint_steps '2,4,2' lists step 2 more than once: give each "
         "step once, e.g. 2,4"]),
    "decode_output_in_missing_folder": (  # as if fine-tuned text-to-text
        lambda d: _as_delimited_lm(os.path.join(d, "operative_config.gin")),
        ["decode", "--model_dir", "{d}", "--input", "a b",
               "--output_file", "{base}/no_such/out.tsv"],
        ["--output_file {base}/no_such/out.tsv: its folder {base}/no_such "
         "does not exist: create it (mkdir -p {base}/no_such)"]),
    "newline_in_model_dir": (
        None, ["train", "--model_dir", "{d}\nrun2"] + LM,
        ["--model_dir '{d}\\nrun2' has a line break or control character in "
         "it"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_damaged_file_is_refused_before_tensorflow(world, tmp_path, name):
  damage, argv, words = CASES[name]
  d = str(tmp_path / "run")
  shutil.copytree(world["trained"], d)
  if damage is not None:
    damage(d)
  fill = dict(d=d, base=str(tmp_path))
  before = _tree(str(tmp_path))
  result = _cli_util.run([a.format(**fill) for a in argv], cwd=str(tmp_path))
  lines = result.stderr.splitlines()
  assert result.code == 2, result.stderr[-2000:]
  assert len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith("mtf_th %s: error: " % argv[0]), lines[0]
  for word in words:
    assert word.format(**fill) in lines[0], lines[0]
  assert result.tensorflow is False
  assert _tree(str(tmp_path)) == before


# --------------------------------------------------------------------------
# a sweep's records: checked against its runs, never trusted as written


def _sweep(base, trained, record=None, eval_steps=(4, 8)):
  """output_dir (no sweep.json: deleted) whose run of ROW seed 1 (a copy of
  `trained`, or a new folder) has eval_results.csv at `eval_steps` (6.1,
  5.9) and, given `record`, results.csv with its cells over a sound line's.
  Returns (output_dir, run folder)."""
  out = os.path.join(base, "sweep")
  run = os.path.join(out, "runs", ROW, "seed_1")
  if trained:
    shutil.copytree(trained, run)
  else:
    os.makedirs(run)
  write(os.path.join(run, "eval_results.csv"), (
      "step,split,ln_ppl,tokens\n%d,validation,6.100000,99\n%d,validation,"
      "5.900000,99\n" % eval_steps).encode())
  if record is not None:
    cells = dict.fromkeys(sweep_results.RESULT_COLUMNS, "")
    cells.update(table="lm_heads", row=ROW, seed="1",
                 early_step=str(eval_steps[0]), early_ln_ppl="6.1",
                 final_step=str(eval_steps[1]), final_ln_ppl="5.9",
                 model_dir=run)
    cells.update(record)
    write(os.path.join(out, "results.csv"), ("%s\n%s\n" % (
        ",".join(sweep_results.RESULT_COLUMNS),
        ",".join(cells[c] for c in sweep_results.RESULT_COLUMNS))).encode())
  return out, run


SWEEP_CASES = {  # name -> (_sweep's arguments, words of the one line)
    "value_edited": (
        dict(record={"final_ln_ppl": "5.5"}),
        ["{out}/results.csv line 2 (row %s seed 1) has final_ln_ppl 5.5 but "
         "the run's own {run}/eval_results.csv says 5.900000 at step 8: the "
         "line was edited; delete that line and rerun the sweep (the run is "
         "read back from its folder, not retrained)" % ROW]),
    "model_dir_missing": (
        dict(record={"model_dir": ""}),
        ["{out}/results.csv line 2 (row %s seed 1) has no model_dir: delete "
         "that line" % ROW]),
    "cut_mid_row": (
        dict(record={}),  # cut 40 bytes short below
        ["{out}/results.csv line 2 (row %s seed 1) is cut short (" % ROW,
         "delete that line and rerun the sweep"]),
    "recorded_at_other_steps": (
        dict(record={}, eval_steps=(2, 4)),
        ["{out}/results.csv line 2 (row %s seed 1) was measured at steps 2,4 "
         "but this sweep measures at 4,8 (--train_steps, --eval_steps): use "
         "a new --output_dir, or the steps it was recorded with" % ROW]),
    "run_trained_to_other_steps": (
        dict(trained=True),
        ["run folder {run} was trained with --train_steps 4 (its "
         "operative_config.gin) but this sweep has 8: use a new "
         "--output_dir, or --train_steps 4"]),
}


@pytest.mark.parametrize("name", sorted(SWEEP_CASES))
def test_a_sweeps_records_are_checked_before_anything_runs(world, tmp_path,
                                                          name):
  kwargs, words = SWEEP_CASES[name]
  kwargs = dict(kwargs)
  trained = world["trained"] if kwargs.pop("trained", False) else None
  out, run = _sweep(str(tmp_path), trained, **kwargs)
  if name == "cut_mid_row":
    path = os.path.join(out, "results.csv")
    with open(path) as f:
      text = f.read()
    cut(path, len(text) - 40)
  before = _tree(str(tmp_path))
  result = _cli_util.run(SWEEP + ["--output_dir", out], cwd=str(tmp_path))
  lines = result.stderr.splitlines()
  assert result.code == 2, result.stderr[-2000:]
  assert len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith("mtf_th sweep: error: "), lines[0]
  for word in words:
    assert word.format(out=out, run=run) in lines[0], lines[0]
  assert result.tensorflow is False
  assert _tree(str(tmp_path)) == before
