"""Progress of long jobs: a training hook, the train log and the eval table.

Files other commands read (keep the formats exactly):

  <model_dir>/train_log.csv     step,loss,steps_per_sec,elapsed_sec
      one row per logged step, appended while training; `step` is the global
      step after the update (1 = the first update), `loss` the training loss
      of that update's batch, `steps_per_sec` the rate since the previous
      row, `elapsed_sec` training wall time summed over all runs that led to
      this step (a resumed run continues from the row of its checkpoint).
      A resumed run writes no row for a step that is already in the file.
  <model_dir>/eval_results.csv  step,split,ln_ppl,tokens
      one row per evaluated checkpoint and split (re-evaluating replaces it).

Both are written so a crash (even kill -9) leaves at most a partial last
line, which the next run removes before appending.
"""
import csv
import io
import os
import sys
import time

import tensorflow.compat.v1 as tf

TRAIN_LOG = "train_log.csv"
TRAIN_LOG_FIELDS = ("step", "loss", "steps_per_sec", "elapsed_sec")
EVAL_RESULTS = "eval_results.csv"
EVAL_FIELDS = ("step", "split", "ln_ppl", "tokens")


def _repair(path, fields):
  """Drops a partial last line and a missing header; returns the rows."""
  if not os.path.exists(path):
    return []
  with open(path, "r", newline="") as f:
    text = f.read()
  if text and not text.endswith("\n"):
    text = text[:text.rfind("\n") + 1]
  lines = text.splitlines(True)
  header = ",".join(fields) + "\n"
  if not lines or lines[0] != header:
    lines = [header] + [l for l in lines if l.strip() and l != header]
  good = [lines[0]]
  for line in lines[1:]:
    if len(line.rstrip("\n").split(",")) == len(fields):
      good.append(line)
  new_text = "".join(good)
  if new_text != text or not os.path.exists(path):
    _write_atomic(path, new_text)
  return list(csv.DictReader(io.StringIO(new_text)))


def _write_atomic(path, text):
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_train_log(model_dir):
  """Rows of <model_dir>/train_log.csv as dicts of numbers, by step."""
  path = os.path.join(model_dir, TRAIN_LOG)
  if not os.path.exists(path):
    return []
  rows = _repair(path, TRAIN_LOG_FIELDS)
  return [{"step": int(r["step"]), "loss": float(r["loss"]),
           "steps_per_sec": float(r["steps_per_sec"]),
           "elapsed_sec": float(r["elapsed_sec"])} for r in rows]


class TrainLog(object):
  """Appends rows to <model_dir>/train_log.csv, never duplicating a step."""

  def __init__(self, model_dir):
    self.path = os.path.join(model_dir, TRAIN_LOG)
    tf.io.gfile.makedirs(model_dir)
    if os.path.exists(self.path):
      rows = read_train_log(model_dir)
    else:
      _write_atomic(self.path, ",".join(TRAIN_LOG_FIELDS) + "\n")
      rows = []
    self.steps = set(r["step"] for r in rows)
    self.elapsed_at = {r["step"]: r["elapsed_sec"] for r in rows}

  def elapsed_before(self, step):
    """Training seconds recorded up to `step` (0 if unknown)."""
    earlier = [s for s in self.elapsed_at if s <= step]
    return self.elapsed_at[max(earlier)] if earlier else 0.0

  def append(self, step, loss, steps_per_sec, elapsed_sec):
    """Writes one row (flushed) unless `step` is already logged."""
    if step in self.steps:
      return False
    with open(self.path, "a", newline="") as f:
      f.write("%d,%.9g,%.6g,%.3f\n" % (step, loss, steps_per_sec, elapsed_sec))
      f.flush()
    self.steps.add(step)
    return True


def write_eval_results(model_dir, results):
  """Adds/replaces rows (dicts with EVAL_FIELDS) in eval_results.csv."""
  path = os.path.join(model_dir, EVAL_RESULTS)
  tf.io.gfile.makedirs(model_dir)
  rows = _repair(path, EVAL_FIELDS) if os.path.exists(path) else []
  table = {(int(r["step"]), r["split"]): r for r in rows}
  for r in results:
    table[(int(r["step"]), r["split"])] = {
        "step": int(r["step"]), "split": r["split"],
        "ln_ppl": "%.6f" % r["ln_ppl"], "tokens": int(r["tokens"])}
  out = io.StringIO()
  writer = csv.DictWriter(out, EVAL_FIELDS, lineterminator="\n")
  writer.writeheader()
  for key in sorted(table):
    writer.writerow(table[key])
  _write_atomic(path, out.getvalue())
  return path


def read_eval_results(model_dir):
  path = os.path.join(model_dir, EVAL_RESULTS)
  if not os.path.exists(path):
    return []
  return [{"step": int(r["step"]), "split": r["split"],
           "ln_ppl": float(r["ln_ppl"]), "tokens": int(r["tokens"])}
          for r in _repair(path, EVAL_FIELDS)]


def format_seconds(seconds):
  seconds = int(round(max(seconds, 0)))
  if seconds >= 3600:
    return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
  if seconds >= 60:
    return "%dm%02ds" % (seconds // 60, seconds % 60)
  return "%ds" % seconds


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
    self._log = TrainLog(model_dir)
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
    self._offset = self._log.elapsed_before(self._start_step)
    self._t0 = time.time()
    self._last_row = (self._start_step, self._t0)
    self._last_print = self._t0
    self._print("starting at step %d of %d" % (self._start_step,
                                               self._train_steps))

  def before_run(self, run_context):
    del run_context
    return tf.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    now = time.time()
    # read after the update (a separate tiny run: mtf's train op increments
    # the step without ordering it against reads in the same run)
    step = int(run_context.session.run(self._global_step))
    loss = float(run_values.results)
    if step % self._log_every == 0 or step == self._train_steps:
      last_step, last_t = self._last_row
      rate = (step - last_step) / max(now - last_t, 1e-9)
      self._log.append(step, loss, rate, self._offset + now - self._t0)
      self._last_row = (step, now)
    if now - self._last_print >= self._print_every or step == self._train_steps:
      done = step - self._start_step
      rate = done / max(now - self._t0, 1e-9)
      left = (self._train_steps - step) / rate if rate > 0 else float("inf")
      self._print("step %d/%d (%.0f%%) loss %.4f  %.2f steps/s  ETA %s"
                  % (step, self._train_steps,
                     100.0 * step / max(self._train_steps, 1), loss, rate,
                     format_seconds(left)))
      self._last_print = now

  def _print(self, message):
    print("[%s] %s" % (self._label, message), file=self._stream, flush=True)
