"""Liveness of the --cluster tasks: a task that stops answering ends the run.

A step waits for every task it runs on, with no deadline: a task that is
stopped (SIGSTOP, a paused VM), hung or cut off from the others keeps its
sockets open, nothing is reset, and the command waited for ever.  A TCP
probe does not see such a task (the kernel still accepts connections), so
the check is an operation on the task: while train, eval, decode or
finetune runs on a cluster (estimator.run), a daemon thread runs a
one-element op on each task's first device every PROBE_EVERY_SECS, through
task 0 (the path the steps take), each in a session of its own (isolated
state, a deadline).  A task is lost when its op does not come back within
the bound (PROBE_TIMEOUT_SECS, or STEP_TIME_FACTOR times the median of the
recent training steps if that is longer: a task slow beyond it counts as
lost) or fails, twice in a row, or once if the task then refuses a TCP
connect (killed).  The run then ends with one line naming the task, the
last checkpoint (a trainer) or the checkpoints scored (eval), and the
command that resumes or reruns (runtime/cluster.Cluster.lost_message),
status 1, its model_dir lock released (runtime/stops.end: the main thread,
waiting inside TensorFlow, cannot be woken).  Task 0 is probed first, so a
stopped task 0 is named as such.  Worst case from the freeze to the line:
PROBE_EVERY_SECS + 2 x the bound (35 s with the defaults).

Example:
  with liveness.watching(model_dir):  # estimator.run
    mtf_utils.run(...)
"""
import collections
import contextlib
import sys
import threading

import tensorflow.compat.v1 as tf

from mtf_talking_heads.runtime import cluster as cluster_lib
from mtf_talking_heads.runtime import dir_lock
from mtf_talking_heads.runtime import stops

PROBE_EVERY_SECS = 5.0
PROBE_TIMEOUT_SECS = 15.0
STEP_TIME_FACTOR = 3.0
STEPS_KEPT = 21  # the recent steps whose median sets the bound
FAILURES = 2  # in a row: the task is lost

_WATCHDOG = []  # the running Watchdog (one run at a time per process)


class Watchdog(object):
  """Probes every task of `active` until stop(); calls on_lost(task, cause).

  Args:
    active: the runtime.cluster.Cluster.
    on_lost: called once, from the watchdog's thread, with the lost task's
      index and a short cause.
    every_secs, timeout_secs: see PROBE_EVERY_SECS, PROBE_TIMEOUT_SECS.
  """

  def __init__(self, active, on_lost, every_secs=PROBE_EVERY_SECS,
               timeout_secs=PROBE_TIMEOUT_SECS):
    self._active = active
    self._on_lost = on_lost
    self._every = every_secs
    self._timeout = timeout_secs
    self._steps = collections.deque(maxlen=STEPS_KEPT)
    self._stop = threading.Event()
    self._sessions = {}
    self._abandoned = False  # a failed probe's session was left to close
    self._graphs = {}
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="mtf_th cluster liveness")

  def start(self):
    self._thread.start()
    return self

  def stop(self, wait_secs=5.0):
    """No probe reports after this returns.  Waits (at most wait_secs) for
    a probe in flight; if one is still in flight, or a failed probe's
    session is being abandoned, the process ends without Python's exit
    (stops.exit_hard_at_end: a thread inside TensorFlow while Python exits
    aborts the process, "terminate called ...", instead of its status)."""
    self._stop.set()
    self._thread.join(wait_secs)
    if self._thread.is_alive() or self._abandoned:
      stops.exit_hard_at_end()

  def note_step(self, seconds):
    """A training step took `seconds` (the bound grows with the step)."""
    self._steps.append(float(seconds))

  def bound_secs(self):
    """How long a task may take to run the one-element op: the timeout, or
    STEP_TIME_FACTOR times the median of the recent steps if longer (the
    median: the first step, which sets up the graph on the servers, is
    no measure of the others)."""
    steps = sorted(self._steps)
    median = steps[len(steps) // 2] if steps else 0.0
    return max(self._timeout, STEP_TIME_FACTOR * median)

  def _graph(self, task):
    """(graph, placeholder, output) of the op on task `task`'s device 0."""
    if task not in self._graphs:
      graph = tf.Graph()
      with graph.as_default(), tf.device(cluster_lib.device_name(
          task, 0, self._active.device_type)):
        x = tf.placeholder(tf.int64, [], name="liveness_in")
        y = tf.identity(x, name="liveness_out")
      self._graphs[task] = (graph, x, y)
    return self._graphs[task]

  def _session(self, task, bound_ms):
    """A session on task 0 that sees only task 0 and task `task`."""
    if task not in self._sessions:
      graph, _, _ = self._graph(task)
      config = tf.ConfigProto(isolate_session_state=True,
                              operation_timeout_in_ms=bound_ms)
      for t in sorted({0, task}):
        config.device_filters.append("/job:%s/task:%d" % (cluster_lib.JOB,
                                                           t))
      self._sessions[task] = tf.Session(self._active.target, graph=graph,
                                        config=config)
    return self._sessions[task]

  def probe(self, task, value):
    """None if task `task` ran the op within the bound, else the cause."""
    bound = self.bound_secs()
    bound_ms = int(bound * 1000)
    try:
      session = self._session(task, bound_ms)
      _, x, y = self._graph(task)
      got = session.run(y, feed_dict={x: value}, options=tf.RunOptions(
          timeout_in_ms=bound_ms))
      if int(got) != value:
        return "its one-element op returned %r, not %r" % (got, value)
      return None
    except tf.errors.DeadlineExceededError:
      self._drop(task)
      return ("it did not run a one-element op within %d s, %d times in a "
              "row: stopped, hung or cut off from task 0" % (bound, FAILURES))
    except tf.errors.OpError as e:
      self._drop(task)
      first = (str(e).strip().splitlines() or [""])[0]
      return "%s: %s" % (type(e).__name__, first[:120])

  def _drop(self, task):
    """Abandons task's session: closing it may wait for the lost task."""
    session = self._sessions.pop(task, None)
    if session is not None:
      self._abandoned = True
      threading.Thread(target=_close_quietly, args=(session,),
                       daemon=True).start()

  def _run(self):
    try:
      self._probe_until_lost()
    finally:  # here, not in a thread of its own: Python may be exiting
      for session in self._sessions.values():
        _close_quietly(session)
      self._sessions.clear()

  def _probe_until_lost(self):
    failures = {}
    value = 0
    while not self._stop.wait(self._every):
      task = 0
      while task < self._active.num_tasks and not self._stop.is_set():
        value += 1
        cause = self.probe(task, value)
        if cause is None:
          failures[task] = 0
          task += 1
          continue
        failures[task] = failures.get(task, 0) + 1
        refused = dict((t, r) for t, _, r in self._active.unreachable(2.0))
        if task in refused:  # killed, or its host is down: no second try
          cause = "it refuses connections (%s)" % refused[task]
        if failures[task] >= FAILURES or task in refused:
          if not self._stop.is_set():
            self._on_lost(task, cause)
          return
        # probed again at once


def _close_quietly(session):
  try:
    session.close()
  except Exception:  # pylint: disable=broad-except
    pass


def note_step(seconds):
  """A training step's duration, for the running watchdog (if any)."""
  if _WATCHDOG:
    _WATCHDOG[0].note_step(seconds)


def _end_run(task, cause):
  """The watchdog's on_lost: the run's one line, status 1 (stops.end)."""
  from mtf_talking_heads.training import checkpoints  # pylint: disable=g-import-not-at-top
  active = cluster_lib.active()
  step = None
  if active.resumes:
    try:
      step = checkpoints.latest_step(active.model_dir)
    except Exception:  # pylint: disable=broad-except  (the line must come)
      step = None
  line = stops.error_line(active.lost_message(cause, step, tasks=[task]))
  if stops.installed():
    stops.end(line, 1)
  # a library caller (no `mtf_th` console): the line, and the wait goes on
  print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def watching(model_dir):
  """Watches the active cluster's tasks while the block runs (nothing
  without --cluster).  Records the run on the Cluster: model_dir, whether
  it trains into it (this process holds its lock: it resumes), and resets
  the checkpoints an eval has scored."""
  active = cluster_lib.active()
  if active is None:
    yield
    return
  active.model_dir = model_dir
  active.resumes = dir_lock.holds(model_dir)
  active.scored = []
  watchdog = Watchdog(active, _end_run).start()
  _WATCHDOG[:] = [watchdog]
  try:
    yield
  finally:
    watchdog.stop()
    del _WATCHDOG[:]
