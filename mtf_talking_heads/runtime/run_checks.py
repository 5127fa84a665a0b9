"""A model_dir's files checked before a command reads or writes them.

What `mtf_th train / finetune / eval / decode` (commands/common.py, before
TensorFlow loads) and training/setup.py (the same checks for callers of
the library) refuse, each in one line naming the file and what to do:

  * checkpoints the command reads (run_files + checkpoint_index.damage):
    a writer's latest (the one it resumes from), a reader's asked steps;
    an index that is empty, cut or garbled, a data shard cut short;
  * a writer's model_dir holding model.ckpt-N without a `checkpoint` file
    after it logged steps (TF would start again at step 0 and save over
    them; a run killed during its first save, before any step, may start
    again);
  * train_log.csv (writers) and eval_results.csv (writers and eval) that
    are folders, binary or garbled (run_files.check_file; a cut last line
    is not damage: the writer drops it).

Nothing is written here.  Imports only the standard library.

Example:
  check("/tmp/run", writes=True)   # raises DamagedFile:
  # "--model_dir /tmp/run: model.ckpt-4.index is damaged: it is empty;
  #  training resumes from that checkpoint and cannot read it: ..."
"""
import os

from mtf_talking_heads.runtime import checkpoint_index
from mtf_talking_heads.runtime import run_files

DamagedFile = run_files.DamagedFile


def _sound_steps(model_dir, but):
  return [s for s in run_files.checkpoint_steps(model_dir) if s != but and
          checkpoint_index.damage(_prefix(model_dir, s)) is None]


def _prefix(model_dir, step):
  return os.path.join(model_dir, "model.ckpt-%d" % step)


def _read_steps(model_dir, writes, steps):
  """The steps of the checkpoints the command reads (those that exist)."""
  if writes:
    state = run_files.checkpoint_state(model_dir)
    if state is None:
      return []
    try:
      return [run_files.checkpoint_step(state.latest)]
    except ValueError:
      return []  # not a model.ckpt-N: damaged_state's refusal
  available = run_files.checkpoint_steps(model_dir)
  if not available:
    return []
  if steps is None or steps == -1:
    return available[-1:]
  if steps == "all":
    return available
  if isinstance(steps, int):
    steps = [steps]
  return [s for s in steps if s in available]


def writer_fix(model_dir, step):
  """What a writer whose latest checkpoint `step` is damaged can do."""
  sound = [s for s in _sound_steps(model_dir, step) if s < step]
  if sound:
    return ("move model.ckpt-%d.* away and write model_checkpoint_path: "
            "\"model.ckpt-%d\" into %s to resume from step %d, or use a "
            "new --model_dir" % (step, sound[-1], os.path.join(
                model_dir, run_files.CHECKPOINT_STATE), sound[-1]))
  return ("move model.ckpt-%d.* and the 'checkpoint' file away to start "
          "again at step 0, or use a new --model_dir" % step)


def check_checkpoint(model_dir, step, flag="--model_dir", writes=False,
                     step_flag="--checkpoint_steps"):
  """Raises DamagedFile if model.ckpt-`step` of model_dir cannot be read."""
  why = checkpoint_index.damage(_prefix(model_dir, step))
  if why is None:
    return
  if writes:
    raise DamagedFile(
        "%s %s: %s; training resumes from model.ckpt-%d and cannot read it: "
        "%s" % (flag, model_dir, why, step, writer_fix(model_dir, step)))
  sound = _sound_steps(model_dir, step)
  raise DamagedFile(
      "%s %s: %s; TensorFlow cannot read checkpoint %d: restore its files, "
      "or give another step with %s (%s)" % (
          flag, model_dir, why, step, step_flag,
          "readable: %s" % ", ".join(map(str, sound)) if sound else
          "no other checkpoint here is readable"))


def state_refusal(model_dir, files=run_files.LOCAL):
  """The one line refusing <model_dir>/checkpoint when it cannot be trusted
  while checkpoints are here (run_files.damaged_state), or None.

  `files`: run_files.LOCAL, or training/checkpoints.py's tf.io.gfile ones.
  """
  damage = run_files.damaged_state(model_dir, files)
  if damage is None:
    return None
  steps = sorted(run_files.checkpoint_step(p) for p in
                 run_files.checkpoint_prefixes(model_dir, files))
  return ("--model_dir %s: its 'checkpoint' file cannot be trusted (%s) "
          "while model.ckpt-%s is here; training would start again at step "
          "0 over it: write model_checkpoint_path: \"model.ckpt-%d\" into "
          "that file, or use a new --model_dir"
          % (model_dir, damage, ", ".join(map(str, steps)), steps[-1]))


def check(model_dir, flag="--model_dir", writes=False, steps=None,
          step_flag="--checkpoint_steps", logs=None):
  """Refuses a model_dir whose files the command would misread.

  Args:
    model_dir: the directory (a gs:// one and a new one are not checked).
    flag: the flag that named it, for the message.
    writes: the command trains into it (train, finetune): checks the
      latest checkpoint it resumes from, a missing `checkpoint` file and
      both logs; else it reads `steps` (eval, decode).
    steps: a reader's checkpoints (None: the latest, "all", a step or a
      list of steps; steps not here are left to the command's message).
    step_flag: the reader's flag for steps, for the message.
    logs: the logs to check (run_files.TRAIN_LOG, EVAL_RESULTS); default:
      both for a writer, none for a reader.
  Raises:
    DamagedFile: one line naming the file and what to do.
  """
  if "://" in model_dir or not os.path.isdir(model_dir):
    return
  if logs is None:
    logs = (run_files.TRAIN_LOG, run_files.EVAL_RESULTS) if writes else ()
  for name in logs:
    run_files.check_file(model_dir, name)
  prefixes = run_files.checkpoint_prefixes(model_dir)
  state = os.path.join(model_dir, run_files.CHECKPOINT_STATE)
  if writes and prefixes and not os.path.lexists(state) and (
      run_files.scan_train_log(model_dir)):  # else: killed in its 1st save
    steps_here = sorted(run_files.checkpoint_step(p) for p in prefixes)
    raise DamagedFile(
        "%s %s holds model.ckpt-%s but no 'checkpoint' file naming the "
        "latest; training would start again at step 0 over them: write "
        "model_checkpoint_path: \"model.ckpt-%d\" into %s, or use a new %s"
        % (flag, model_dir, ", ".join(map(str, steps_here)), steps_here[-1],
           state, flag))
  message = state_refusal(model_dir)
  if message:
    raise DamagedFile(message)
  for step in _read_steps(model_dir, writes, steps):
    check_checkpoint(model_dir, step, flag, writes, step_flag)


def prefix_refusal(path, flag="--model_dir"):
  """The one line refusing the checkpoint a reader of a directory's latest
  checkpoint or of a prefix (mtf_th visualize) would read, or None: a
  `checkpoint` file that cannot be trusted, a damaged index or data shard.
  A path with no checkpoint at all is left to the reader's own message.

  Example:
    prefix_refusal(d + "/model.ckpt-4", "--baseline") == (
        "--baseline .../model.ckpt-4: model.ckpt-4.index is damaged: it is "
        "empty; TensorFlow cannot read it: restore its files, or pass "
        "another checkpoint (e.g. .../model.ckpt-2)")
  """
  if "://" in path:
    return None
  if os.path.isdir(path):
    model_dir = path
    if not run_files.checkpoint_prefixes(model_dir):
      return None
    damage = run_files.damaged_state(model_dir)
    prefix = None if damage else run_files.latest_checkpoint(model_dir)
    if prefix is None:
      return None
  elif os.path.lexists(path + ".index"):
    model_dir, prefix = os.path.dirname(path) or ".", path
    damage = None
  else:
    return None  # no such checkpoint: the reader's own message
  why = damage or checkpoint_index.damage(prefix)
  if why is None:
    return None
  try:
    step = run_files.checkpoint_step(prefix) if prefix else None
  except ValueError:
    step = None
  sound = _sound_steps(model_dir, step)
  other = ("e.g. %s" % _prefix(model_dir, sound[-1]) if sound else
           "none other in %s is readable" % model_dir)
  if damage:
    return ("%s %s: its 'checkpoint' file cannot be trusted (%s): pass a "
            "checkpoint prefix (%s), or fix that file" % (flag, path, damage,
                                                          other))
  return ("%s %s: %s; TensorFlow cannot read it: restore its files, or pass "
          "another checkpoint (%s)" % (flag, path, why, other))
