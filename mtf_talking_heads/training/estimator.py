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

from mtf_talking_heads.core import compat
from mtf_talking_heads.nn import init_seeds
from mtf_talking_heads.runtime import cluster as cluster_lib
from mtf_talking_heads.runtime import dir_lock
from mtf_talking_heads.training import cluster as training_cluster
from mtf_talking_heads.training import devices
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import liveness

# The seed every held-out scoring (eval, eval --metrics, decode, SOP) gives
# its input pipeline and estimator, so each checkpoint sees identical inputs.
EVAL_SEED = 4321


def configure_estimator(estimator, seed):
  """compat.configure_estimator (seed, every logical CPU device, resource
  variables); each variable's initializer seeded by its name, so the initial
  weights are the same on every mesh (init_seeds.py); on --cluster also
  sessions on task 0 with isolated state."""
  compat.configure_estimator(estimator, seed)
  compat.wrap_model_fn(estimator, init_seeds.seeded_model_fn)
  if cluster_lib.active() is not None:
    compat.set_run_config(estimator, training_cluster.configure_run_config(
        estimator.config))


no_session_recovery = compat.no_session_recovery


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
  training_cluster.preflight(model_dir, training_cluster.data_paths())
  kwargs = {} if fn is None else {"train_model_fn": fn}
  with gin.unlock_config(), no_session_recovery(tpu), \
      training_cluster.bounded_session_close(), liveness.watching(model_dir):
    mtf_utils.run(tpu_job_name=None, tpu=tpu, gcp_project=gcp_project,
                  tpu_zone=tpu_zone, model_dir=model_dir,
                  mesh_devices=mesh_devices, mode="train",
                  dataset_split="train", **kwargs)
