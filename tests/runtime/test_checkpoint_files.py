"""runtime/checkpoint_index.py and run_checks.py: a checkpoint's files read
without TensorFlow, and the one-line refusals of a model_dir's damage.

The index reader is checked against TensorFlow's own reader on a real
sharded checkpoint (same tensor names, the data files' lengths where the
index says the tensors end); each kind of damage (an empty, cut, garbled
index; a cut or missing data shard) is named, and TensorFlow itself fails
on every one of them.  A save killed half-way leaves model.ckpt-N_temp/:
stale_temp_dirs picks the ones a later save supersedes.
"""
import os
import shutil

import pytest
import tensorflow.compat.v1 as tf

from _damage import cut, flip
from mtf_talking_heads.runtime import checkpoint_index
from mtf_talking_heads.runtime import run_checks
from mtf_talking_heads.runtime import run_files


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A model_dir with checkpoints 1, 2, 3 of 3 variables over 2 shards."""
  model_dir = str(tmp_path_factory.mktemp("saved") / "run")
  os.makedirs(model_dir)
  with tf.Graph().as_default():
    with tf.device("/cpu:0"):
      tf.Variable(tf.ones([40, 8]), name="a/kernel")
    with tf.device("/cpu:1"):
      tf.Variable(tf.zeros([3]), name="b")
      tf.Variable(7, name="global_step", dtype=tf.int64)
    saver = tf.train.Saver(sharded=True, max_to_keep=5,
                           save_relative_paths=True)  # as the Estimator
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      for step in (1, 2, 3):
        saver.save(session, os.path.join(model_dir, "model.ckpt"),
                   global_step=step)
  return model_dir


def _copy(saved, tmp_path):
  model_dir = str(tmp_path / "run")
  shutil.copytree(saved, model_dir)
  return model_dir


def test_crc32c_of_the_standard_check_string():
  assert checkpoint_index.crc32c(b"123456789") == 0xe3069283
  assert checkpoint_index.crc32c(b"") == 0


def test_the_index_reads_as_tensorflow_reads_it(saved):
  prefix = os.path.join(saved, "model.ckpt-3")
  with open(prefix + ".index", "rb") as f:
    num_shards, entries = checkpoint_index.read_index(f.read())
  assert num_shards == 2
  assert sorted(entries) == sorted(n for n, _ in tf.train.list_variables(
      prefix)) == ["a/kernel", "b", "global_step"]
  ends = {}
  for shard, offset, size in entries.values():
    ends[shard] = max(ends.get(shard, 0), offset + size)
  for shard in (0, 1):  # the tensors end where the data files end
    assert ends[shard] == os.path.getsize(
        "%s.data-%05d-of-00002" % (prefix, shard))
  assert entries["a/kernel"][2] == 40 * 8 * 4
  assert checkpoint_index.damage(prefix) is None
  assert not [n for n in os.listdir(saved) if n.endswith("_temp")]


def _refused(model_dir, **check_args):
  """run_checks.check's DamagedFile line (it must refuse)."""
  with pytest.raises(run_checks.DamagedFile) as e:
    run_checks.check(model_dir, **check_args)
  return str(e.value)


DAMAGE = {  # name -> (how, the reason's words)
    "empty_index": (lambda p: cut(p + ".index", 0),
                    "model.ckpt-3.index is damaged: it is empty"),
    "short_index": (lambda p: cut(p + ".index", 20),
                    "it is 20 bytes, shorter than an index's 48-byte footer"),
    "cut_index": (lambda p: cut(p + ".index", os.path.getsize(
        p + ".index") - 3), "its last 8 bytes are not an index's footer"),
    "garbled_index": (lambda p: flip(p + ".index", 5),
                      "a block's checksum does not match its bytes"),
    "index_is_a_folder": (lambda p: (os.remove(p + ".index"),
                                     os.mkdir(p + ".index")),
                          "model.ckpt-3.index is a folder, not a file"),
    "cut_data": (lambda p: cut(p + ".data-00000-of-00002", 100),
                 "model.ckpt-3.data-00000-of-00002 is 100 bytes, but its "
                 "index places tensors up to byte 1280 (cut short)"),
    "missing_data": (lambda p: os.remove(p + ".data-00001-of-00002"),
                     "model.ckpt-3.data-00001-of-00002 is missing (its index "
                     "names 2 data files)"),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_each_damage_is_named_and_tensorflow_fails_on_it(saved, tmp_path,
                                                         name):
  model_dir = _copy(saved, tmp_path)
  prefix = os.path.join(model_dir, "model.ckpt-3")
  how, words = DAMAGE[name]
  how(prefix)
  why = checkpoint_index.damage(prefix)
  assert why is not None and words in why, why
  with pytest.raises((tf.errors.OpError, IndexError, ValueError)):
    reader = tf.train.load_checkpoint(prefix)
    for variable, _ in tf.train.list_variables(prefix):
      reader.get_tensor(variable)
  if name == "missing_data":  # not listed as complete: eval names the step
    assert 3 not in run_files.checkpoint_steps(model_dir)
    return
  # a writer resumes from it: refused, with the step to go back to
  assert _refused(model_dir, writes=True) == (
      "--model_dir %s: %s; training resumes from model.ckpt-3 and cannot "
      "read it: move model.ckpt-3.* away and write model_checkpoint_path: "
      "\"model.ckpt-2\" into %s/checkpoint to resume from step 2, or use a "
      "new --model_dir" % (model_dir, why, model_dir))
  # a reader of it: refused, naming the readable steps; others pass
  line = _refused(model_dir, steps="all")
  assert line.endswith(
      "TensorFlow cannot read checkpoint 3: restore its files, or give "
      "another step with --checkpoint_steps (readable: 1, 2)"), line
  run_checks.check(model_dir, steps=[1, 2])
  assert run_checks.prefix_refusal(model_dir, "--model_dir") == (
      "--model_dir %s: %s; TensorFlow cannot read it: restore its files, or "
      "pass another checkpoint (e.g. %s/model.ckpt-2)"
      % (model_dir, why, model_dir))
  assert run_checks.prefix_refusal(prefix, "--baseline").startswith(
      "--baseline %s: %s" % (prefix, why))
  assert run_checks.prefix_refusal(prefix[:-1] + "2", "--baseline") is None


def test_checkpoints_without_a_checkpoint_file_refuse_a_writer(saved,
                                                              tmp_path):
  """TF would find no latest checkpoint and save over model.ckpt-N; unless
  the run logged no step (a kill during its first save: starting again
  writes the same checkpoint)."""
  model_dir = _copy(saved, tmp_path)
  os.remove(os.path.join(model_dir, "checkpoint"))
  run_checks.check(model_dir, writes=True)  # killed in its first save
  with open(os.path.join(model_dir, run_files.TRAIN_LOG), "w") as f:
    f.write("step,loss,steps_per_sec,elapsed_sec\n1,2.5,1.5,0.700\n")
  assert _refused(model_dir, writes=True) == (
      "--model_dir %s holds model.ckpt-1, 2, 3 but no 'checkpoint' file "
      "naming the latest; training would start again at step 0 over them: "
      "write model_checkpoint_path: \"model.ckpt-3\" into %s/checkpoint, "
      "or use a new --model_dir" % (model_dir, model_dir))
  run_checks.check(model_dir)  # a reader lists the checkpoints themselves
  run_checks.check(str(tmp_path / "new"), writes=True)  # nothing there yet
  run_checks.check("gs://bucket/run", writes=True)  # not checked


def test_a_damaged_log_refuses_a_writer_but_not_a_reader(saved, tmp_path):
  model_dir = _copy(saved, tmp_path)
  os.mkdir(os.path.join(model_dir, run_files.TRAIN_LOG))
  with pytest.raises(run_checks.DamagedFile, match="is a folder, not the "
                     "run's train_log.csv"):
    run_checks.check(model_dir, writes=True)
  run_checks.check(model_dir)  # decode reads no log
  with pytest.raises(run_checks.DamagedFile):
    run_checks.check(model_dir, logs=(run_files.TRAIN_LOG,))


def test_stale_temp_folders_are_those_a_later_save_supersedes(tmp_path):
  for name in ("model.ckpt-3_temp", "model.ckpt-6_temp", "model.ckpt-9_temp",
               "other_temp", "model.ckpt-x_temp"):
    os.makedirs(tmp_path / name)
    (tmp_path / name / "part-00000-of-00002.index").write_bytes(b"x")
  (tmp_path / "model.ckpt-4_temp").write_text("a file, not a save's folder")
  model_dir = str(tmp_path)
  assert checkpoint_index.stale_temp_dirs(model_dir, 2) == []
  assert checkpoint_index.remove_stale_temps(model_dir, 6) == [
      os.path.join(model_dir, "model.ckpt-3_temp"),
      os.path.join(model_dir, "model.ckpt-6_temp")]
  assert sorted(os.listdir(model_dir)) == [
      "model.ckpt-4_temp", "model.ckpt-9_temp", "model.ckpt-x_temp",
      "other_temp"]
  assert checkpoint_index.stale_temp_dirs("gs://b/run", 9) == []
