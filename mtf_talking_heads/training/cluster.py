"""Training on TensorFlow servers (--cluster): session, pre-flight, faults.

Owns what the estimator needs to run on the cluster that
mtf_talking_heads.runtime.cluster describes (activated by the command): the session
configuration (target task 0, isolated session state, deadlines), the
pre-flight that asks the servers (devices, shared storage), the exact
mesh-size check.  The one-line message for a task lost mid-run is
errors.lost_task_error.
"""
import contextlib
import os
import uuid

import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.runtime import cluster as cluster_lib
from mtf_talking_heads.training import errors

# A deadline for the pre-flight's calls to the servers.
PREFLIGHT_TIMEOUT_MS = 20000

# How long closing a session may wait for the servers (see
# compat.bounded_session_close): a lost task makes it wait forever.
CLOSE_TIMEOUT_SECS = 10.0


def bounded_session_close():
  """compat.bounded_session_close on a cluster; nothing otherwise."""
  if active() is None:
    return contextlib.nullcontext()
  return compat.bounded_session_close(CLOSE_TIMEOUT_SECS)


def active():
  """The --cluster Cluster this process runs on, or None."""
  return cluster_lib.active()


def scored(step):
  """eval has written checkpoint `step`'s result (a lost task's line names
  the checkpoints scored: runtime/cluster.Cluster.lost_message)."""
  if cluster_lib.active() is not None:
    cluster_lib.active().scored.append(step)


def session_config(base=None):
  """The estimator's ConfigProto on a cluster.

  isolate_session_state: variables live in the servers' resource managers;
  without it a second run on the same servers reuses (or, with other shapes,
  fails to assign) the first run's variables.  Soft placement stays on (the
  estimator's default) for ops without a GPU kernel on GPU hosts.
  """
  config = tf.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  config.isolate_session_state = True
  config.allow_soft_placement = True
  return config


def configure_run_config(config):
  """A RunConfig (replaced copy) whose sessions run on the active cluster."""
  active = cluster_lib.active()
  config = config.replace(session_config=session_config(config.session_config))
  return compat.run_config_with_master(config, active.target)


def check_mesh_size(mesh_shape):
  """The mesh has exactly the cluster's device count (ConfigError if not)."""
  active = cluster_lib.active()
  if active is None or mesh_shape is None:
    return
  try:
    active.check_mesh_size(max(mesh_shape.size, 1), repr(";".join(
        "%s:%d" % (d.name, d.size) for d in mesh_shape.dims)))
  except cluster_lib.ClusterError as e:
    raise errors.ConfigError(str(e)) from e


def _task_devices(names):
  """{task: {"CPU": n, "GPU": n}} from the session's device names."""
  out = {}
  for name in names:
    spec = tf.DeviceSpec.from_string(name)
    if spec.job != cluster_lib.JOB or spec.task is None:
      continue
    counts = out.setdefault(spec.task, {})
    counts[spec.device_type] = counts.get(spec.device_type, 0) + 1
  return out


def _device_type(active, names):
  """"GPU" if every task has K GPUs, else "CPU" (every task needs K CPUs)."""
  per_task = _task_devices(names)
  k = active.devices_per_task
  if all(per_task.get(t, {}).get("GPU", 0) >= k
         for t in range(active.num_tasks)):
    return "GPU"
  for task in range(active.num_tasks):
    cpus = per_task.get(task, {}).get("CPU", 0)
    if cpus < k:
      raise errors.ConfigError(
          "task %d (%s) has %d CPU device%s but --devices_per_task is %d: "
          "start its server with `mtf_th server ... --devices_per_task %d` "
          "or lower --devices_per_task" % (
              task, active.addresses[task], cpus, "" if cpus == 1 else "s",
              k, k))
  return "CPU"


def _storage_error(what, path, active):
  return errors.ConfigError(
      "%s %s is not readable by task 0 (%s) at the same path: the client "
      "and task 0 must see model_dir (task 0 holds the master variables and "
      "runs the saver) and the data (task 0 runs the input pipeline) at the "
      "same paths (a shared file system or GCS; see docs/cluster.md, shared "
      "storage)" % (what, path, active.addresses[0]))


def _not_listed(active, error):
  """The ConfigError for a cluster whose task 0 did not list its devices.

  A timeout (gRPC still reconnecting to a task that was restarted, or a task
  that is down) is not the same fault as a task 0 that answers with an
  error, and gets its own advice.
  """
  first = str(error).strip().splitlines()[0] if str(error).strip() else ""
  if isinstance(error, (tf.errors.DeadlineExceededError,
                        tf.errors.UnavailableError)):
    return errors.ConfigError(
        "task 0 (%s) did not list the cluster's devices (timeout %d s, or "
        "unreachable: %s): a task of --cluster is down, still starting, or "
        "was restarted moments ago; check that every `mtf_th server` of "
        "--cluster is running and rerun"
        % (active.addresses[0], PREFLIGHT_TIMEOUT_MS // 1000, first))
  return errors.ConfigError(
      "task 0 (%s) answers but is not an `mtf_th server` of this cluster "
      "(%s)" % (active.addresses[0], first))


def _task_of(name):
  spec = tf.DeviceSpec.from_string(name)
  return spec.task if spec.job == cluster_lib.JOB else None


def _own_devices(active, task):
  """{device name: incarnation} of the server at addresses[task]'s own
  devices (a session on it whose device filter matches no other task, so
  it asks no other task; the incarnation is a random number each server
  start draws).

  Raises:
    ConfigError: it does not answer within PREFLIGHT_TIMEOUT_MS (stopped
      or hung: it still accepts the TCP connect of the first probe).
  """
  config = tf.ConfigProto(isolate_session_state=True,
                          operation_timeout_in_ms=PREFLIGHT_TIMEOUT_MS)
  config.device_filters.append("/job:%s/task:%d" % (cluster_lib.JOB, 1 << 30))
  try:
    with tf.Graph().as_default(), tf.Session(
        "grpc://" + active.addresses[task], config=config) as session:
      return {d.name: d.incarnation for d in session.list_devices()}
  except tf.errors.OpError as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise errors.ConfigError(
        "task %d of --cluster (%s) accepts connections but does not answer "
        "(%s: %s, timeout %d s): it is stopped, hung or not an `mtf_th "
        "server`; restart it with `mtf_th server --cluster %s --task %d "
        "--devices_per_task %d`" % (
            task, active.addresses[task], type(e).__name__, first,
            PREFLIGHT_TIMEOUT_MS // 1000, ",".join(active.addresses), task,
            active.devices_per_task)) from None


def check_same_cluster(active, own, listed):
  """The client and the servers agree on one cluster, or ConfigError.

  Args:
    active: the client's Cluster (--cluster).
    own: per task of --cluster, {device name: incarnation} of the devices
      the server at that address runs itself (_own_devices).
    listed: {device name: incarnation} of every device task 0 lists (its
      cluster: the --cluster the servers were started with).
  Raises:
    ConfigError: a server listed at another place than its --task (the
      order), task 0's cluster with other tasks than --cluster names (a
      subset), or task 0 running a task on another server than the one at
      that address (servers started with other --cluster lists).
  """
  spec = ",".join(active.addresses)
  for task, devices in enumerate(own):
    tasks = sorted(set(_task_of(n) for n in devices) - {None})
    if tasks and tasks != [task]:
      raise errors.ConfigError(
          "--cluster lists %s as task %d, but that server is task %d of its "
          "cluster (started with --task %d): give the client the --cluster "
          "its servers were started with, in the same order"
          % (active.addresses[task], task, tasks[0], tasks[0]))
  theirs = sorted(set(_task_of(n) for n in listed) - {None})
  if theirs != list(range(active.num_tasks)):
    raise errors.ConfigError(
        "task 0 (%s) is in a cluster of %d tasks (%s) but --cluster %s names "
        "%d: give the client the --cluster its servers were started with, "
        "every task in the same order" % (
            active.addresses[0], len(theirs),
            ", ".join("task %d" % t for t in theirs), spec, active.num_tasks))
  for task, devices in enumerate(own):
    seen = {n: i for n, i in listed.items() if _task_of(n) == task}
    if any(seen.get(n, i) != i for n, i in devices.items()) or not (
        set(seen) & set(devices)):
      raise errors.ConfigError(
          "task 0 (%s) runs its task %d on another server than %s (the "
          "servers were started with other --cluster lists): start every "
          "server with the client's --cluster %s" % (
              active.addresses[0], task, active.addresses[task], spec))


def preflight(model_dir, data_paths=()):
  """Asks the servers, before the graph: one cluster, devices, storage.

  Each server answers for itself (its task index and its devices'
  incarnations), and task 0 lists its cluster's devices: they must be the
  same tasks on the same servers as --cluster (check_same_cluster).  Sets
  the active cluster's device_type ("GPU" when every task has K
  GPUs).  Writes a probe file into model_dir and reads it back on task 0,
  and lists every data path on task 0.

  Args:
    model_dir: the run's model directory (must exist).
    data_paths: files (or globs) the input pipeline reads.
  Raises:
    ConfigError: naming the task or path and the fix.
  """
  active = cluster_lib.active()
  if active is None:
    return
  config = tf.ConfigProto(isolate_session_state=True,
                          operation_timeout_in_ms=PREFLIGHT_TIMEOUT_MS)
  probe = os.path.join(model_dir, ".cluster_probe_%s" % uuid.uuid4().hex)
  token = uuid.uuid4().hex
  with tf.io.gfile.GFile(probe, "w") as f:
    f.write(token)
  try:
    own = [_own_devices(active, task) for task in range(active.num_tasks)]
    with tf.Graph().as_default(), tf.Session(active.target,
                                             config=config) as session:
      try:
        listed = session.list_devices()
      except tf.errors.OpError as e:
        raise _not_listed(active, e) from e
      check_same_cluster(active, own, {d.name: d.incarnation for d in listed})
      names = [d.name for d in listed]
      active.device_type = _device_type(active, names)
      with tf.device(cluster_lib.device_name(0, 0, "CPU")):
        read = tf.io.read_file(probe)
        listed = [tf.io.matching_files(p) for p in data_paths]
      try:
        got = session.run(read)
      except tf.errors.OpError:
        got = b""
      if got.decode() != token:
        raise _storage_error("model_dir", model_dir, active)
      for path, files in zip(data_paths, listed):
        if not len(session.run(files)):
          raise _storage_error("data file", path, active)
  finally:
    tf.io.gfile.remove(probe)


def data_paths():
  """The corpus files the configured th_* tasks read (none: other tasks)."""
  try:
    from mtf_talking_heads.data import corpus  # pylint: disable=g-import-not-at-top
    paths = corpus.configured_corpus()
  except (ImportError, ValueError):
    return []
  return list(paths["train"]) + list(paths["validation"])
