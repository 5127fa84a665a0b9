"""A session hook that makes a training step reproducible.

Owns OrderReadsBeforeWritesHook: within the train op, every read of a
resource variable runs before that variable's write (the rule of TF2's
automatic control dependencies), so two runs with the same seed and data
agree, and a resumed run follows the uninterrupted one.
"""
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat

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
