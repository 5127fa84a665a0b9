"""The estimator that mtf's utils.run builds, and how we run it.

Owns run() (utils.run with one of our functions as its train_model_fn: train,
eval or decode), the estimator's configuration (seed, every logical CPU
device, resource variables), the no-retry policy for failing ops, and the
--model_dir check.
"""
import contextlib

import gin
from mesh_tensorflow.transformer import utils as mtf_utils
import tensorflow.compat.v1 as tf

from mtf_talking_heads import compat
from mtf_talking_heads import dir_lock
from mtf_talking_heads import init_seeds
from mtf_talking_heads.training import devices
from mtf_talking_heads.training import errors

# The seed every held-out scoring (eval, eval --metrics, decode, SOP) gives
# its input pipeline and estimator, so each checkpoint sees identical inputs.
EVAL_SEED = 4321


def configure_estimator(estimator, seed):
  """Seeds the graph, seeds each variable's initializer by its name (so the
  initial weights are the same on every mesh, see init_seeds.py), shows
  every logical CPU device to the session and makes new variables resource
  variables.

  Resource variables matter for reproducibility: with TF1 ref variables (what
  tf.disable_v2_behavior() selects) a read aliases the variable's buffer, so
  a gradient op that runs after the optimizer's assign to the same weight
  (nothing orders them) sees the updated value: two runs with the same seed
  and data then differ from the second step on.  A resource read is a copy.
  """
  tf.enable_resource_variables()
  config = estimator._config  # pylint: disable=protected-access
  changes = {"tf_random_seed": seed}
  if not config.master and compat._LOGICAL_CPUS:  # pylint: disable=protected-access
    changes["session_config"] = compat.estimator_session_config(
        len(compat._LOGICAL_CPUS),  # pylint: disable=protected-access
        base=config.session_config)
  config = config.replace(**changes)
  estimator._config = config  # pylint: disable=protected-access
  estimator._model_fn = init_seeds.seeded_model_fn(estimator._model_fn)  # pylint: disable=protected-access
  estimator._session_config = config.session_config  # pylint: disable=protected-access


@contextlib.contextmanager
def no_session_recovery(tpu):
  """TF's MonitoredSession retries AbortedError/UnavailableError forever.

  It treats both as a preemption and rebuilds the session (rewriting the
  graph to the events file) in an endless loop, e.g. on a oneDNN kernel's
  AbortedError; and TPUEstimator (which utils.run uses on CPU too) drops
  both when they reach it, so a run stopped by one would end as if it had
  succeeded.  On CPU nothing can be preempted, so no error is retried or
  dropped; on a TPU only UnavailableError (a lost worker) is.
  """
  from tensorflow.python.training import monitored_session  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import error_handling  # pylint: disable=g-import-not-at-top
  saved = (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
           error_handling._IGNORED_ERRORS)  # pylint: disable=protected-access
  recoverable = (tf.errors.UnavailableError,) if tpu else ()
  monitored_session._PREEMPTION_ERRORS = recoverable  # pylint: disable=protected-access
  error_handling._IGNORED_ERRORS = recoverable  # pylint: disable=protected-access
  try:
    yield
  finally:
    (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
     error_handling._IGNORED_ERRORS) = saved  # pylint: disable=protected-access


def check_model_dir(model_dir):
  if not isinstance(model_dir, str) or not model_dir.strip():
    raise errors.ConfigError("--model_dir is required: the directory for "
                             "checkpoints and logs")
  if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
    raise errors.ConfigError("--model_dir %r exists and is not a directory"
                             % model_dir)


@contextlib.contextmanager
def writer_lock(model_dir):
  """Holds model_dir's lock (dir_lock.py) while this process writes to it.

  Raises:
    ConfigError: another live train/finetune/sweep run holds it (one line).
  """
  try:
    dir_lock.acquire(model_dir, "--model_dir")
  except dir_lock.LockedError as e:
    raise errors.ConfigError(str(e)) from None
  try:
    yield
  finally:
    dir_lock.release(model_dir)


def check_tpu(tpu, tpu_zone=None, gcp_project=None):
  """Resolves --tpu NAME the way utils.run will, before anything is built.

  A TPU name is looked up through the GCE metadata server and the Cloud TPU
  API; without them (no network, not on a GCP VM) TensorFlow's resolver
  fails deep inside utils.run with a long traceback.  A grpc:// address is
  not looked up.

  Raises:
    ConfigError: one line naming --tpu and what to give instead.
  """
  if not tpu or tpu.startswith("grpc://"):
    return
  try:
    tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu, zone=tpu_zone, project=gcp_project)
  except Exception as e:  # pylint: disable=broad-except  (urllib, googleapiclient, ValueError)
    reason = (str(getattr(e, "reason", "")) or str(e)).splitlines()
    raise errors.ConfigError(
        "--tpu %s: cannot resolve this Cloud TPU (%s: %s); run on a GCP VM "
        "with network access and give --tpu_zone and --gcp_project, or give "
        "the TPU's address as --tpu grpc://IP:8470" % (
            tpu, type(e).__name__, reason[0] if reason else "")) from None


def run(model_dir, tpu, tpu_zone, gcp_project, fn, settings):
  """utils.run with `fn` as its train_model_fn (None: gin's binding).

  How: utils.run builds the TPUEstimator exactly as ``t5_mesh_transformer``
  would from the same gin and passes it to its train_model_fn.
  """
  check_tpu(tpu, tpu_zone, gcp_project)
  mesh_devices = None if tpu else devices.mesh_devices(settings.mesh_shape)
  kwargs = {} if fn is None else {"train_model_fn": fn}
  with gin.unlock_config(), no_session_recovery(tpu):
    mtf_utils.run(tpu_job_name=None, tpu=tpu, gcp_project=gcp_project,
                  tpu_zone=tpu_zone, model_dir=model_dir,
                  mesh_devices=mesh_devices, mode="train",
                  dataset_split="train", **kwargs)
