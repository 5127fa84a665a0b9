"""runtime/run_files.py: a run's files, read without TensorFlow as TF does.

The `checkpoint` state file is parsed as protobuf's text_format.Merge parses
a CheckpointState, and the listing (latest step, complete checkpoints) agrees
with tf.train.get_checkpoint_state / latest_checkpoint on the same
directories; the watchers' readers never write.
"""
import os

from google.protobuf import text_format
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.python.checkpoint import checkpoint_management

from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import checkpoints

STATES = [
    "", "\n", "# only a comment\n", "hello world",
    'model_checkpoint_path: "model.ckpt-5"\n',
    'model_checkpoint_path: "model.ckpt-5"\n'
    'all_model_checkpoint_paths: "model.ckpt-3"\n'
    'all_model_checkpoint_paths: "model.ckpt-5"\n'
    "all_model_checkpoint_timestamps: 1.7e9\n"
    "all_model_checkpoint_timestamps: 1.7e9\n"
    "last_preserved_timestamp: 1.6e9\n",
    "model_checkpoint_path: 'a' \"b\" ; "
    "all_model_checkpoint_paths: [\"x\", 'y']",
    'all_model_checkpoint_paths: "model.ckpt-5"\n',
    'model_checkpoint_path: "a"\r\nmodel_checkpoint_path: "b"  # last\r\n',
    'model_checkpoint_path "a"', 'model_checkpoint_path: "a',
    "model_checkpoint_path: 5",
    'model_checkpoint_path: "\\303\\251\\x4\\n"',
    'model_checkpoint_path: "\\377"',
    'model_checkpoint_path: "a", last_preserved_timestamp: -Infinity',
    'model_checkpoint_path: "a" last_preserved_timestamp: nanf',
    'model_checkpoint_path: "a" last_preserved_timestamp: "1"',
    'model_checkpoint_path: "a" all_model_checkpoint_paths: []',
    'model_checkpoint_path: "a" all_model_checkpoint_paths: ["x" "y",]',
    'model_checkpoint_path: { }', '[ext]: 1', 'model_checkpoint_path: "a\\"',
]


def _tf_parse(text):
  state = checkpoint_management.CheckpointState()
  try:
    text_format.Merge(text, state)
  except text_format.ParseError:
    return "ParseError"
  return state.model_checkpoint_path, list(state.all_model_checkpoint_paths)


@pytest.mark.parametrize("text", STATES)
def test_state_file_parses_as_protobuf_parses_it(text):
  try:
    ours = run_files._parse_state(text)  # pylint: disable=protected-access
  except ValueError:
    ours = "ParseError"
  assert ours == _tf_parse(text)


def _old_latest_step(model_dir):
  path = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.exists(
      model_dir) else None
  return None if path is None else run_files.checkpoint_step(path)


def _old_checkpoint_steps(model_dir):
  """training/checkpoints.checkpoint_steps as it was, on tf.train."""
  prefixes = set(p[:-len(".index")] for p in tf.io.gfile.glob(
      os.path.join(model_dir, "model.ckpt-*.index")))
  state = tf.train.get_checkpoint_state(model_dir)
  for path in state.all_model_checkpoint_paths if state else ():
    prefixes.add(path if os.path.isabs(path) else os.path.join(model_dir, path))
  steps = []
  for prefix in prefixes:
    shards = tf.io.gfile.glob(prefix + ".data-*-of-*")
    if (tf.io.gfile.exists(prefix + ".index") and shards and
        len(shards) == int(shards[0].rsplit("-of-", 1)[1])):
      steps.append(run_files.checkpoint_step(prefix))
  return sorted(set(steps))


def _outcome(fn, model_dir):
  try:
    return fn(model_dir)
  except ValueError as e:
    return str(e)


def test_checkpoint_listing_agrees_with_tf_train(tmp_path):
  saved = str(tmp_path / "saved")  # a real Saver: keeps the last 2 of 3
  with tf.Graph().as_default():
    tf.Variable(1.0)
    saver = tf.train.Saver(max_to_keep=2)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      for step in (1, 2, 3):
        saver.save(session, os.path.join(saved, "model.ckpt"),
                   global_step=step)
  complete = ("model.ckpt-5.index", "model.ckpt-5.data-00000-of-00001")
  dirs = {"saved": ((), None), "empty": ((), None),
          "index_only": (("model.ckpt-5.index",), None),
          "shard_missing": (("model.ckpt-9.index",
                             "model.ckpt-9.data-00000-of-00002"), None),
          "unlisted": (complete, None),
          "listed": (complete, 'model_checkpoint_path: "model.ckpt-5"\n'
                               'all_model_checkpoint_paths: "model.ckpt-5"\n'),
          "listed_gone": ((), 'model_checkpoint_path: "model.ckpt-7"\n'),
          "v1_file": (("model.ckpt-7",), 'model_checkpoint_path: '
                                         '"model.ckpt-7"\n'),
          "no_latest": (complete, 'all_model_checkpoint_paths: "x-5"\n'),
          "empty_state": (complete, ""), "garbage": (complete, "hello")}
  for name, (files, state) in dirs.items():
    model_dir = tmp_path / name
    model_dir.mkdir(exist_ok=True)
    for f in files:
      (model_dir / f).write_text("")
    if state is not None:
      (model_dir / "checkpoint").write_text(state)
  dirs["absent"] = None
  for name in dirs:
    model_dir = str(tmp_path / name)
    for old, new in ((_old_latest_step, checkpoints.latest_step),
                     (_old_latest_step, run_files.latest_step),
                     (_old_checkpoint_steps, checkpoints.checkpoint_steps),
                     (_old_checkpoint_steps, run_files.checkpoint_steps)):
      if name == "absent" and old is _old_checkpoint_steps:
        assert new(model_dir) == []
        continue
      assert _outcome(new, model_dir) == _outcome(old, model_dir), (
          name, new.__module__)
  assert run_files.latest_step(saved) == 3
  assert run_files.checkpoint_steps(saved) == [2, 3]
  # the sweep's reading: the step named, whether or not its files are here
  assert run_files.listed_latest_step(str(tmp_path / "listed_gone")) == 7
  assert run_files.listed_latest_step(str(tmp_path / "empty_state")) is None
  assert run_files.listed_latest_step(str(tmp_path / "absent")) is None


def test_watchers_never_write_and_skip_a_cut_line(tmp_path):
  log = ("step,loss,steps_per_sec,elapsed_sec\n1,2.5,1.5,0.7\n"
         "2,2.4,2.0,1.2\n3,2.3,2.")
  (tmp_path / "train_log.csv").write_text(log)
  evals = "step,split,ln_ppl,tokens\n0,validation,9,10\n4,validation,2.5"
  (tmp_path / "eval_results.csv").write_text(evals)
  rows = run_files.scan_train_log(str(tmp_path))
  assert [r["steps_per_sec"] for r in rows] == [1.5, 2.0, 2.0]
  assert rows[-1]["elapsed_sec"] is None
  assert run_files.scan_eval_results(str(tmp_path)) == {0: 9.0, 4: 2.5}
  assert run_files.scan_eval_results(str(tmp_path), "test") == {}
  assert (tmp_path / "train_log.csv").read_text() == log
  assert (tmp_path / "eval_results.csv").read_text() == evals
  assert run_files.scan_train_log(str(tmp_path / "none")) == []
  # the owner's reader leaves out the cut line
  assert [r["step"] for r in run_files.read_train_log(str(tmp_path))] == [1, 2]


def _checkpoint_files(model_dir, step):
  for suffix in (".index", ".data-00000-of-00001"):
    with open(os.path.join(model_dir, "model.ckpt-%d%s" % (step, suffix)),
              "w") as f:
      f.write("x")


@pytest.mark.parametrize("state, damage", [
    ('model_checkpoint_path: "model.ckpt-5"\n', None),
    ("\x00\x01 garbage", "it does not parse"),
    ('model_checkpoint_path: "model.ckpt-5', "it does not parse"),
    ('all_model_checkpoint_paths: "model.ckpt-5"\n',
     "it names no latest checkpoint"),
    ('model_checkpoint_path: "model.ckpt-900"\n',
     "it names model.ckpt-900, whose files are not here"),
    ('model_checkpoint_path: "weights"\n', "it names 'weights', not a "
     "model.ckpt-N"),
])
def test_damaged_state_is_named_while_checkpoints_are_here(tmp_path, state,
                                                           damage):
  _checkpoint_files(str(tmp_path), 5)
  (tmp_path / "checkpoint").write_text(state)
  got = run_files.damaged_state(str(tmp_path))
  if damage is None:
    assert got is None
  else:
    assert got.startswith(damage), got
  # tf.train.latest_checkpoint (run_files.latest_checkpoint) answers None for
  # a damaged file (training would start again at step 0), or raises for
  # one that names no latest checkpoint
  try:
    latest = run_files.latest_checkpoint(str(tmp_path))
  except ValueError as e:
    assert damage == "it names no latest checkpoint", e
    return
  assert (latest is None) == (damage is not None)


def test_damaged_state_without_checkpoints_is_harmless(tmp_path):
  (tmp_path / "checkpoint").write_text("garbage")
  assert run_files.damaged_state(str(tmp_path)) is None
  assert run_files.damaged_state(str(tmp_path / "missing")) is None


# --------------------------------------------------------------------------
# issue 35: a cut last line survives, anything else damaged is named

HEADER = "step,loss,steps_per_sec,elapsed_sec\n"


@pytest.mark.parametrize("tail, kept", [
    ("3,2.3,2,1.700\n", [1, 2, 3]),   # sound
    ("3,2.3,2,1.700", [1, 2, 3]),     # complete, no final newline: kept
    ("3,2.3,2,1.7", [1, 2]),          # cut inside elapsed_sec: dropped
    ("3,2.3,2.", [1, 2]),             # cut inside a row: dropped
])
def test_a_resumed_log_keeps_every_row_after_a_cut_last_line(tmp_path, tail,
                                                             kept):
  """A crash leaves at most a partial last line (or a complete one without
  its newline); the resumed writer appends after it and loses no row: the
  old code did not rewrite the file, so the next row was glued to the cut
  line and both were dropped on the next read."""
  path = tmp_path / "train_log.csv"
  path.write_text(HEADER + "1,2.5,1.5,0.700\n2,2.4,2,1.200\n" + tail)
  log = run_files.TrainLog(str(tmp_path))
  assert log.append(4, 2.2, 2.0, 2.2) and log.append(5, 2.1, 2.0, 2.7)
  assert [r["step"] for r in run_files.read_train_log(str(tmp_path))] == (
      kept + [4, 5])
  lines = path.read_text().splitlines()
  assert lines[0] + "\n" == HEADER and len(lines) == len(kept) + 3
  assert lines[-1] == "5,2.1,2,2.700"


def test_a_cut_eval_row_is_dropped_and_the_table_rewritten(tmp_path):
  path = tmp_path / "eval_results.csv"
  path.write_text("step,split,ln_ppl,tokens\n0,validation,9.000000,10\n"
                  "4,validation,2.5")
  run_files.write_eval_results(str(tmp_path), [
      {"step": 8, "split": "validation", "ln_ppl": 2.25, "tokens": 10}])
  assert path.read_text() == ("step,split,ln_ppl,tokens\n0,validation,"
                              "9.000000,10\n8,validation,2.250000,10\n")


DAMAGED = {  # file content -> the words of the one line
    "folder": (None, "is a folder, not the run's"),
    "nul": (b"step,loss\x00\x00\x00", "has NUL bytes"),
    "latin1": ("step,loss\n1,\xe9\n".encode("latin-1"), "is not UTF-8 text"),
    "other_header": (b"a,b,c\n1,2,3\n", "its first line is 'a,b,c', not the "
                     "header"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
@pytest.mark.parametrize("log", ["train_log.csv", "eval_results.csv"])
def test_a_damaged_log_is_named_and_left_as_it_is(tmp_path, name, log):
  content, words = DAMAGED[name]
  path = tmp_path / log
  if content is None:
    path.mkdir()
  else:
    path.write_bytes(content)
  model_dir = str(tmp_path)
  readers = [lambda: run_files.check_file(model_dir, log)]
  if log == "train_log.csv":
    readers += [lambda: run_files.read_train_log(model_dir),
                lambda: run_files.TrainLog(model_dir)]
    scan = run_files.scan_train_log
  else:
    readers += [lambda: run_files.read_eval_results(model_dir),
                lambda: run_files.write_eval_results(model_dir, [])]
    scan = run_files.scan_eval_results
  if name != "other_header":  # the watchers skip lines that do not parse
    readers.append(lambda: scan(model_dir))
  for reader in readers:
    with pytest.raises(run_files.DamagedFile) as e:
      reader()
    message = str(e.value)
    assert message.startswith(str(path)) and words in message, message
    assert "\n" not in message and "mv %s %s.bad" % (path, path) in message
  if content is not None:
    assert path.read_bytes() == content
  assert sorted(os.listdir(model_dir)) == [log]


def test_a_garbled_row_before_the_last_is_named_not_dropped(tmp_path):
  text = HEADER + "1,2.5,1.5,0.700\n2,2.4,2,1.2003,2.3,2,1.700\n4,2,2,2.000\n"
  (tmp_path / "train_log.csv").write_text(text)
  with pytest.raises(run_files.DamagedFile, match=(
      r"train_log.csv: line 3 \('2,2.4,2,1.2003,2.3,2,1.700'\) is not a row "
      r"of step,loss,steps_per_sec,elapsed_sec: correct or delete that "
      r"line$")):
    run_files.read_train_log(str(tmp_path))
  assert (tmp_path / "train_log.csv").read_text() == text
