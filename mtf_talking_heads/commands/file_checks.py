"""Checks of a run's files and of the files a command writes, before
TensorFlow loads: a model_dir's checkpoints and logs (runtime/run_checks.py),
the checkpoint visualize reads, decode's --output_file.  Each function
raises commands.UsageError with one line naming the file and the fix.
Imports only the standard library and runtime's stdlib modules.

Example:
  file_checks.damaged_files("/tmp/run", writes=True)  # UsageError:
  # "--model_dir /tmp/run: model.ckpt-4.index is damaged: it is empty; ..."
"""
import os

from mtf_talking_heads import commands
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.runtime import run_checks


def damaged_files(model_dir, flag="--model_dir", writes=False, steps=None,
                  step_flag="--checkpoint_steps", logs=None):
  """Refuses a model_dir whose checkpoints or logs the command would misread
  (runtime/run_checks.py: a damaged checkpoint index or cut data shard, a
  writer's checkpoints without a `checkpoint` file, train_log.csv or
  eval_results.csv that are folders, binary or garbled).

  Args:
    writes, steps, step_flag, logs: as run_checks.check.
  Raises:
    commands.UsageError: one line naming the file and what to do.
  """
  try:
    run_checks.check(model_dir, flag, writes, steps, step_flag, logs)
  except run_checks.DamagedFile as e:
    raise commands.UsageError(str(e)) from None


def output_file(path, flag):
  """A file the command writes at its end (decode's --output_file): its
  folder exists and is writable, and it is not a folder; checked before
  TensorFlow so a run does not fail after all its work.

  Raises:
    commands.UsageError: one line naming the flag and the fix.
  """
  prechecks.no_newline(path, flag)
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise commands.UsageError("%s %s is a folder: give a file path, e.g. "
                              "%s" % (flag, path, os.path.join(path,
                                                               "out.tsv")))
  if not os.path.isdir(folder):
    raise commands.UsageError(
        "%s %s: its folder %s does not exist: create it (mkdir -p %s) or "
        "give a path in an existing folder" % (flag, path, folder, folder))
  if not os.access(folder, os.W_OK | os.X_OK) or (
      os.path.exists(path) and not os.access(path, os.W_OK)):
    raise commands.UsageError(
        "%s %s cannot be written by this user: give a path in a writable "
        "folder" % (flag, path))


def readable_checkpoint(path, flag):
  """The checkpoint a directory's latest or a prefix names (visualize's
  --model_dir, --baseline) can be read (run_checks.prefix_refusal).

  Raises:
    commands.UsageError: one line naming the damaged file and another
      checkpoint.
  """
  message = run_checks.prefix_refusal(path, flag)
  if message:
    raise commands.UsageError(message)
