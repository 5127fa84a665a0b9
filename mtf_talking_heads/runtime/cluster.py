"""A mesh over TensorFlow servers: --cluster, device order, reachability.

The model is in-graph replication: one client (`mtf_th train --cluster ...`)
builds the whole graph and runs it in a session on task 0's server
(grpc://<task 0>); each `mtf_th server` process is one task of the job
"worker" and owns `devices_per_task` (K) devices.  Mesh slot s (mtf's
row-major slot order, the order of PlacementMeshImpl's devices) lands on

  /job:worker/replica:0/task:<s // K>/device:<CPU|GPU>:<s % K>

so consecutive slots share a task: with mesh 'batch:2;model:2' and K = 2 the
model dimension's two slots of each batch row are one task's two devices,
and only the batch all-reduce crosses tasks.  Which slot lands on which task
is part of what a layout means (which collectives cross the network).

Shared-storage rule: model_dir must be the same readable and writable path
on the client and on task 0's host (task 0 holds mtf's master variables and
runs the saver; the client writes logs and reads checkpoints to resume), and
every data path the same readable path on the client and task 0 (the input
pipeline runs on task 0): a shared file system, or GCS.

This module imports only the standard library: `--cluster` is parsed and
every task is probed before TensorFlow is imported.
"""
import concurrent.futures
import shlex
import socket
import time

from mtf_talking_heads.core import spec

JOB = "worker"
PROBE_TIMEOUT_SECS = 10.0  # per task; the tasks are probed in parallel


class ClusterError(ValueError):
  """A bad --cluster, or a task that does not answer."""


def parse_addresses(text):
  """"host:port,host:port" -> ["host:port", ...] (task i is the i-th).

  The one parser of --cluster for the client and `mtf_th server`: an entry
  with a scheme or a path (grpc://host:2222, which the servers' ClusterSpec
  aborts on) is refused here for both.

  Example:
    parse_addresses("h0:2222, h1:2222") -> ["h0:2222", "h1:2222"]
    parse_addresses("grpc://h0:2222") -> ClusterError("--cluster entry 0
      ('grpc://h0:2222') is not HOST:PORT: give the address without a
      scheme, e.g. h0:2222")

  Raises:
    ClusterError: naming the bad entry and the expected form.
  """
  addresses = [a.strip() for a in str(text or "").split(",")]
  if not text or not any(addresses):
    raise ClusterError("--cluster needs HOST:PORT[,HOST:PORT...] (task 0 "
                       "first), e.g. --cluster=host0:2222,host1:2222")
  for i, address in enumerate(addresses):
    if "://" in address or "/" in address:
      raise ClusterError(
          "--cluster entry %d (%r) is not HOST:PORT: give the address "
          "without a scheme, e.g. %s"
          % (i, address, address.split("://")[-1].split("/")[0]))
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ClusterError(
          "--cluster entry %d (%r) is not HOST:PORT: write e.g. "
          "--cluster=host0:2222,host1:2222" % (i, address))
  if len(set(addresses)) != len(addresses):
    dup = next(a for a in addresses if addresses.count(a) > 1)
    raise ClusterError("--cluster lists %s twice: each task needs its own "
                       "HOST:PORT" % dup)
  return addresses


def device_name(task, index, device_type="CPU"):
  """'/job:worker/replica:0/task:<task>/device:<device_type>:<index>'."""
  return "/job:%s/replica:0/task:%d/device:%s:%d" % (JOB, task, device_type,
                                                      index)


def device_names(num_tasks, devices_per_task, device_type="CPU"):
  """The mesh's devices in slot order: slot s -> task s // K, device s % K.

  Example: device_names(2, 2) ->
    [".../task:0/device:CPU:0", ".../task:0/device:CPU:1",
     ".../task:1/device:CPU:0", ".../task:1/device:CPU:1"]
  """
  return [device_name(s // devices_per_task, s % devices_per_task,
                      device_type)
          for s in range(num_tasks * devices_per_task)]


def slot_task(slot, devices_per_task):
  """The task that mesh slot `slot` runs on."""
  return slot // devices_per_task


class Cluster(object):
  """The servers a command runs on.

  Attributes:
    addresses: ["host:port", ...], task i is addresses[i].
    devices_per_task: K, devices each task gives the mesh.
    device_type: "CPU", or "GPU" when every task has K GPUs (set by the
      pre-flight, which asks the servers).
    command: the command line that resumes this run (for fault messages).
  """

  def __init__(self, addresses, devices_per_task=1, command=None):
    self.addresses = list(addresses)
    try:
      self.devices_per_task = spec.positive_int("--devices_per_task",
                                                devices_per_task)
    except ValueError as e:
      raise ClusterError(str(e)) from None
    self.device_type = "CPU"
    self.command = command
    # the run on the cluster (estimator.run through training/liveness.py):
    # its model_dir, whether it trains into it (resumes from its
    # checkpoints) and, for eval, the checkpoints it has scored
    self.model_dir = None
    self.resumes = False
    self.scored = []

  @property
  def num_tasks(self):
    return len(self.addresses)

  @property
  def size(self):
    """Devices in the cluster: tasks x devices_per_task."""
    return self.num_tasks * self.devices_per_task

  @property
  def target(self):
    """The session target: task 0's server."""
    return "grpc://" + self.addresses[0]

  def devices(self):
    return device_names(self.num_tasks, self.devices_per_task,
                        self.device_type)

  def check_mesh_size(self, mesh_size, mesh_text):
    """Refuses a mesh whose size differs from the cluster's device count."""
    if mesh_size != self.size:
      raise ClusterError(
          "mesh_shape %s has %d slots but the cluster has %d devices (%d "
          "tasks x --devices_per_task %d): they must be equal; change "
          "mesh_shape or --cluster/--devices_per_task"
          % (mesh_text, mesh_size, self.size, self.num_tasks,
             self.devices_per_task))

  def unreachable(self, timeout=PROBE_TIMEOUT_SECS):
    """[(task, address, reason)] of the tasks that refuse a TCP connect."""
    def probe(address):
      host, _, port = address.rpartition(":")
      try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=timeout).close()
        return None
      except OSError as e:
        return str(e) or type(e).__name__
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=min(32, self.num_tasks)) as pool:
      reasons = list(pool.map(probe, self.addresses))
    return [(i, a, r) for i, (a, r) in enumerate(zip(self.addresses, reasons))
            if r is not None]

  def check_reachable(self, timeout=PROBE_TIMEOUT_SECS):
    """Every task answers a TCP connect within `timeout` seconds.

    Raises:
      ClusterError: one line naming the first task that does not answer.
    """
    start = time.time()
    down = self.unreachable(timeout)
    if down:
      task, address, reason = down[0]
      others = (" (also down: %s)" % ", ".join(
          "task %d %s" % (t, a) for t, a, _ in down[1:])) if down[1:] else ""
      raise ClusterError(
          "task %d of --cluster (%s) does not answer (%s, %.1f s)%s: start "
          "it with `mtf_th server --cluster %s --task %d --devices_per_task "
          "%d` on that host, or fix --cluster"
          % (task, address, reason, time.time() - start, others,
             ",".join(self.addresses), task, self.devices_per_task))

  def fault_message(self, model_dir, checkpoint_step, cause, tasks=None,
                    kept=None):
    """One line for a task lost mid-run: which, the checkpoint, the resume.

    Args:
      model_dir: the run's model directory (None: a reader, which reruns).
      checkpoint_step: the last complete checkpoint's step, or None.
      cause: a short description of the error TensorFlow raised.
      tasks: the lost tasks when known (the liveness watchdog names the task
        that stopped answering: a stopped task still accepts a TCP
        connect); None: the tasks that refuse one now.
      kept: what a reader keeps of its work, e.g. "eval_results.csv of
        runs/x holds checkpoints 2, 4" (None: nothing).
    """
    down = (self.unreachable(timeout=2.0) if tasks is None else
            [(t, self.addresses[t], None) for t in tasks])
    which = ("task %s" % ", ".join("%d (%s)" % (t, a) for t, a, _ in down)
             if down else "a task (all answer again now)")
    saved = ("the last checkpoint of %s is step %d; " % (model_dir,
                                                         checkpoint_step)
             if checkpoint_step is not None else
             "%s has no checkpoint yet; " % model_dir if model_dir else "")
    if kept:
      saved += kept + "; "
    again = "resume" if model_dir else "rerun"
    resume = (" and %s with: %s" % (again, self.command)
              if self.command else "")
    return ("lost %s of the cluster (%s); not retried; %srestart the "
            "server%s%s" % (which, cause, saved, "s" if len(down) != 1 else "",
                            resume))


  def lost_message(self, cause, checkpoint_step=None, tasks=None):
    """fault_message for the run on the cluster (model_dir, resumes,
    scored): a trainer's last checkpoint and resume command, a reader's
    scored checkpoints and rerun command."""
    if self.resumes:
      return self.fault_message(self.model_dir, checkpoint_step, cause, tasks)
    kept = None
    if self.scored:
      steps = sorted(set(self.scored))
      kept = "eval_results.csv of %s holds checkpoint%s %s" % (
          self.model_dir, "s" if len(steps) > 1 else "",
          ", ".join(map(str, steps)))
    return self.fault_message(None, None, cause, tasks, kept)


_ACTIVE = []


def activate(cluster):
  """Makes `cluster` the one the training functions place the mesh on."""
  del _ACTIVE[:]
  if cluster is not None:
    _ACTIVE.append(cluster)


def active():
  """The activated Cluster, or None (one process: logical CPU devices)."""
  return _ACTIVE[0] if _ACTIVE else None


def command_line(prog, argv):
  """The shell command that reruns `prog argv` (the resume command)."""
  return " ".join([prog, shlex.join(list(argv))])


def from_args(args, prog, argv):
  """The Cluster of parsed --cluster / --devices_per_task flags, or None."""
  k = getattr(args, "devices_per_task", None)
  if not getattr(args, "cluster", None):
    if k not in (None, 1):
      raise ClusterError("--devices_per_task goes with --cluster")
    return None
  if getattr(args, "tpu", None):
    raise ClusterError("--cluster and --tpu both say where to run: give one "
                       "of them")
  return Cluster(parse_addresses(args.cluster), 1 if k is None else k,
                 command=command_line(prog, argv))


def free_ports(n, host="localhost"):
  """n TCP ports that were free a moment ago (for local servers)."""
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket()
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def die_with_parent(signal_number=None):
  """In a child before exec (Linux): send it `signal_number` (None:
  SIGTERM) when the process that started it dies, so a killed test,
  benchmark or sweep leaves no server or training run behind (its `with`
  block or interrupt handler never runs then).  Elsewhere, nothing.
  Use as Popen's preexec_fn (functools.partial for another signal)."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
  except OSError:
    return
  pr_set_pdeathsig = 1
  libc.prctl(pr_set_pdeathsig, signal_number or signal.SIGTERM)


class LocalServers(object):
  """`mtf_th server` processes on this host (tests, benchmarks, launch).

  The servers end with the `with` block, or with the process that started
  them if it is killed first (Linux).

  Example:
    with LocalServers(2, devices_per_task=2) as servers:
      ... --cluster servers.spec ...

  Attributes:
    addresses: ["localhost:port", ...]; spec: the --cluster value;
    processes: the subprocess.Popen objects, task i at index i.
  """

  def __init__(self, num_tasks, devices_per_task=1, mtf_th=None, env=None,
               start_timeout_secs=300):
    import os  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    self.addresses = ["localhost:%d" % p for p in free_ports(num_tasks)]
    self.spec = ",".join(self.addresses)
    self.devices_per_task = devices_per_task
    self.mtf_th = mtf_th or [sys.executable, "-m", "mtf_talking_heads.cli"]
    self.env = dict(os.environ if env is None else env)
    self.processes = [None] * num_tasks
    self.start_timeout_secs = start_timeout_secs
    for task in range(num_tasks):
      self.start(task, wait=False)
    for task in range(num_tasks):
      self.wait(task)

  def start(self, task, wait=True):
    """Starts (or restarts) task `task`'s server."""
    import subprocess  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top
    self.logs = getattr(self, "logs", {})
    self.logs[task] = tempfile.TemporaryFile(mode="w+")
    self.processes[task] = subprocess.Popen(
        list(self.mtf_th) + ["server", "--cluster", self.spec, "--task",
                             str(task), "--devices_per_task",
                             str(self.devices_per_task)],
        stdout=subprocess.PIPE, stderr=self.logs[task], text=True,
        env=self.env, preexec_fn=die_with_parent)
    if wait:
      self.wait(task)

  def wait(self, task):
    """Blocks until task `task` prints its listening line."""
    process = self.processes[task]
    deadline = time.time() + self.start_timeout_secs
    line = ""
    while "listening" not in line:
      if process.poll() is not None or time.time() > deadline:
        self.stop()
        self.logs[task].seek(0)
        raise RuntimeError("server task %d did not start: %s"
                           % (task, self.logs[task].read()[-2000:]))
      line = process.stdout.readline()

  def kill(self, task):
    """SIGKILLs task `task` (a lost worker) and reaps it."""
    process = self.processes[task]
    if process is not None and process.poll() is None:
      process.kill()
      process.wait()

  def stop(self):
    """SIGTERM to every server started here (by PID), then reaps them."""
    for process in self.processes:
      if process is not None and process.poll() is None:
        process.terminate()
    for process in self.processes:
      if process is not None:
        try:
          process.wait(timeout=30)
        except Exception:  # pylint: disable=broad-except
          process.kill()
          process.wait()

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.stop()
