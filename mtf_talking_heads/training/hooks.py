"""The train loop's session hooks: reproducible steps and progress.

Owns OrderReadsBeforeWritesHook: within the train op, every read of a
resource variable runs before that variable's write (the rule of TF2's
automatic control dependencies), so two runs with the same seed and data
agree, and a resumed run follows the uninterrupted one; and ProgressHook:
every step to train_log.csv (runtime/run_files.py) and a progress line with
a steady-state ETA (runtime/progress.py).
"""
import sys
import time

import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.runtime import progress
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import liveness

_WRITE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
              "ResourceScatterAdd", "ResourceScatterUpdate")


class OrderReadsBeforeWritesHook(tf.train.SessionRunHook):
  """Within a training step, every variable is read before it is written.

  mtf 0.1.21's train op is tf.group(variable updates + assign_add(step)) in
  a TF1 graph, where nothing orders a variable's reads against its writes:
  a gradient op may read a weight after the optimizer has assigned it, and
  the learning-rate schedule and Adafactor (decay 1 - (t+1)^-0.8) may read
  the global step before or after its increment.  On a multi-threaded CPU
  two runs with the same seed and data then differ after a few steps, and a
  resumed run does not follow the uninterrupted one.  In begin() (before the
  graph is finalised) this hook makes each write in the train op's fan-in
  wait for every read of the same resource variable in that fan-in (reads
  that depend on a write are left alone), the rule TF2's automatic control
  dependencies apply.  Needs resource variables (estimator.configure_estimator).
  """

  def begin(self):
    step = tf.train.get_global_step()
    if step is None:
      return
    graph = step.graph
    increments = [op for op in step.op.outputs[0].consumers()
                  if op.type in ("AssignAdd", "AssignAddVariableOp")]
    if not increments:
      return
    parents = {}
    for op in graph.get_operations():
      for control in op.control_inputs:
        parents.setdefault(control, []).append(op)
    # the train op: the tf.group NoOps above the step increment (tf.group
    # makes one NoOp per device under a final one)
    roots, stack = set(), list(increments)
    while stack:
      for parent in parents.get(stack.pop(), []):
        if parent.type == "NoOp" and parent not in roots:
          roots.add(parent)
          stack.append(parent)
    fanin = _transitive_fanin(roots, stop=None)
    writes = [op for op in fanin if op.type in _WRITE_OPS]
    after_writes = _transitive_fanout(writes, within=fanin)
    reads = {}
    for op in fanin:
      if op.type == "ReadVariableOp" and op not in after_writes:
        reads.setdefault(op.inputs[0].op, []).append(op)
    for write in writes:
      pending = [r for r in reads.get(write.inputs[0].op, [])
                 if r not in write.control_inputs]
      if pending:
        compat.add_control_inputs(write, pending)


class ProgressHook(tf.train.SessionRunHook):
  """Logs every training step to train_log.csv and prints progress lines.

  Fetches the loss (the estimator's LOSSES collection) with each update and
  reads the global step after it: the row's step counts updates done.

  Args:
    model_dir: where train_log.csv lives.
    train_steps: the global step this run stops at (for percent and ETA).
    log_every_steps: write a CSV row every this many steps.
    print_every_secs: print a progress line at most this often.
    stream: where progress lines go (default sys.stderr).
    label: prefix of the progress lines.
  """

  def __init__(self, model_dir, train_steps, log_every_steps=1,
               print_every_secs=10.0, stream=None, label="train"):
    self.last_step = None  # the global step after the last update
    self._run_start = time.time()
    self._log = run_files.TrainLog(model_dir)
    self._train_steps = train_steps
    self._log_every = max(int(log_every_steps), 1)
    self._print_every = print_every_secs
    self._stream = stream or sys.stderr
    self._label = label

  def begin(self):
    losses = tf.get_collection(tf.GraphKeys.LOSSES)
    if not losses:
      raise ValueError("ProgressHook: the graph has no loss in the LOSSES "
                       "collection (is this an Estimator training graph?)")
    self._loss = losses[-1]
    self._global_step = tf.train.get_global_step()

  def after_create_session(self, session, coord):
    del coord
    self._start_step = int(session.run(tf.train.get_global_step()))
    self.last_step = self._start_step
    self._offset = self._log.last_elapsed()
    self._t0 = time.time()
    self._meter = progress.RateMeter(self._start_step)
    self._last_row = (self._start_step, self._t0)
    self._last_print = self._t0
    self._print("starting at step %d of %d" % (self._start_step,
                                               self._train_steps))

  def before_run(self, run_context):
    del run_context
    self._run_start = time.time()
    return tf.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    now = time.time()
    liveness.note_step(now - self._run_start)  # --cluster: the probes' bound
    # read after the update (a separate tiny run: mtf's train op increments
    # the step without ordering it against reads in the same run)
    step = int(run_context.session.run(self._global_step))
    self.last_step = step
    self._meter.update(step, now)
    loss = float(run_values.results)
    if step % self._log_every == 0 or step == self._train_steps:
      last_step, last_t = self._last_row
      rate = (step - last_step) / max(now - last_t, 1e-9)
      self._log.append(step, loss, rate, self._offset + now - self._t0)
      self._last_row = (step, now)
    if now - self._last_print >= self._print_every or step == self._train_steps:
      rate = self._meter.rate()
      left = self._meter.eta(step, self._train_steps)
      self._print("step %d/%d (%.0f%%) loss %.4f  %s steps/s  ETA %s"
                  % (step, self._train_steps,
                     100.0 * step / max(self._train_steps, 1), loss,
                     "?" if rate is None else "%.2f" % rate,
                     "?" if left is None else progress.format_seconds(left)))
      self._last_print = now

  def _print(self, message):
    print("[%s] %s" % (self._label, message), file=self._stream, flush=True)


def _transitive_fanout(ops, within):
  """Ops in `within` reachable from `ops` (data and control edges)."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    for nxt in ([c for t in op.outputs for c in t.consumers()]
                + compat.control_outputs(op)):
      if nxt in within and nxt not in seen:
        seen.add(nxt)
        stack.append(nxt)
  return seen


def _transitive_fanin(ops, stop):
  """All ops that `ops` depend on (data and control edges), except `stop`."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    if op in seen or op is stop:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return seen
