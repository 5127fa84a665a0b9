"""The errors of train, eval, decode and fine-tune, and op-failure messages.

Owns ConfigError (a configuration problem, found before any graph is built),
TrainingError (an op failed while the graph ran), Interrupted (Ctrl-C,
SIGTERM), and the one-line message that names a failing op, its cause and
the fix, or the task a --cluster run lost.
"""
import contextlib
import re

import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import spec
from mtf_talking_heads.runtime import cluster as cluster_lib

# Errors of a lost or unreachable task (--cluster).
LOST_TASK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                    tf.errors.CancelledError, tf.errors.DeadlineExceededError)


class ConfigError(ValueError):
  """A configuration problem found before any graph is built."""


def positive_int(name, value, hint=""):
  """spec.positive_int, raising ConfigError: "NAME must be a positive
  integer, got V" + hint."""
  try:
    return spec.positive_int(name, value, hint)
  except ValueError as e:
    raise ConfigError(str(e)) from None


class TrainingError(RuntimeError):
  """An op failed while the graph ran (train, eval or decode).

  Not a configuration problem (ConfigError).  Raised after the first
  failure: nothing is retried, because only a lost remote TPU worker is a
  real preemption.  The message names the failing op, the cause and what to
  change; the model directory keeps its last checkpoint.
  """


class Interrupted(KeyboardInterrupt):
  """Ctrl-C (or, under `mtf_th`, SIGTERM) during a run.

  Attributes:
    model_dir: the model directory.
    checkpoint_step: the step of its last complete checkpoint (None: none).
  """

  def __init__(self, model_dir, checkpoint_step):
    super().__init__(model_dir, checkpoint_step)
    self.model_dir = model_dir
    self.checkpoint_step = checkpoint_step


_FIXES = (
    ("Input dims must be <= 5",
     "a oneDNN kernel takes at most 5 dims: run with TF_ENABLE_ONEDNN_OPTS=0 "
     "in the environment, or choose a sharding strategy whose attention "
     "tensors have at most 5 dims"),
    ("OOM", "out of memory: lower batch_size, the sequence lengths or the "
            "model size, or use a larger mesh"),
    ("Permission denied", "a file could not be written: make --model_dir "
                          "writable or give a writable --model_dir (the same "
                          "command fails again until then)"),
    ("Read-only file system", "the file system is read-only: give a "
                              "--model_dir on a writable one"),
)


def op_failure(e):
  """What failed: "op 'NAME' failed (ErrorClass: cause)", and the fix."""
  text = str(getattr(e, "message", "") or e)
  match = re.search(r"\{\{node ([^}]+)\}\}", text)
  op = (e.op.name if getattr(e, "op", None) is not None else
        match.group(1) if match else "unknown op")
  cause = next((l.strip() for l in text.splitlines()
                if l.strip() and not l.strip().startswith(
                    ("Graph execution error", "Detected at node", "[[",
                     "File ", "Node:"))), text.strip() or type(e).__name__)
  fix = next((f for key, f in _FIXES if key in text),
             "rerun with --verbose for TensorFlow's log of the op")
  return ("op %r failed (%s: %s)" % (op, type(e).__name__, cause[:300]),
          fix[0].upper() + fix[1:])


@contextlib.contextmanager
def op_errors_stop(doing):
  """An op failing in eval or decode: one TrainingError line, no traceback.

  Args:
    doing: what was running, e.g. "evaluating checkpoint 8 of runs/x".
  Raises:
    TrainingError: naming the op, the cause and what to change.
  """
  try:
    yield
  except tf.errors.OpError as e:
    lost = lost_task_error(e, None, None)  # --cluster: a lost task
    if lost is not None:
      raise lost from None
    failure, fix = op_failure(e)
    raise TrainingError("%s while %s. %s." % (failure, doing, fix)) from None


def lost_task_error(e, model_dir, checkpoint_step):
  """The TrainingError for an op error that lost a task, or None.

  Args:
    e: the tf.errors.OpError the run ended with.
    model_dir: the model directory (None: eval/decode, no resume step).
    checkpoint_step: its last complete checkpoint's step (or None).
  """
  active = cluster_lib.active()
  if active is None or not isinstance(e, LOST_TASK_ERRORS):
    return None
  text = str(getattr(e, "message", "") or e)
  cause = next((l.strip() for l in text.splitlines()
                if l.strip() and not l.startswith(("Graph execution", "From",
                                                   "Additional GRPC"))),
               type(e).__name__)
  cause = "%s: %s" % (type(e).__name__, cause[:120])
  if model_dir is None:
    return TrainingError(active.lost_message(cause))
  return TrainingError(
      active.fault_message(model_dir, checkpoint_step, cause))
