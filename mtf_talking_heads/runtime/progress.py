"""Progress of long jobs: a training hook, the train log and the eval table.

Files other commands read (keep the formats exactly):

  <model_dir>/train_log.csv     step,loss,steps_per_sec,elapsed_sec
      one row per logged step, appended while training; `step` is the global
      step after the update (1 = the first update), `loss` the training loss
      of that update's batch, `steps_per_sec` the rate since the previous
      row, `elapsed_sec` training wall time summed over all runs that led to
      this step (a resumed run continues from the largest elapsed_sec in the
      file, so the column never decreases).
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

  def last_elapsed(self):
    """The largest elapsed_sec logged (0 if none): where a resumed run's
    clock continues, so elapsed_sec never decreases down the file (a run
    killed after its last checkpoint logged steps that the resumed run does
    again; their time counts too)."""
    return max(self.elapsed_at.values()) if self.elapsed_at else 0.0

  def append(self, step, loss, steps_per_sec, elapsed_sec):
    """Writes one row (flushed) unless `step` is already logged."""
    if step in self.steps:
      return False
    with open(self.path, "a", newline="") as f:
      f.write("%d,%.9g,%.6g,%.3f\n" % (step, loss, steps_per_sec, elapsed_sec))
      f.flush()
    self.steps.add(step)
    self.elapsed_at[step] = elapsed_sec
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


class RateMeter(object):
  """Steady-state steps/s and ETA, leaving out the start-up steps.

  The first steps of a run include graph optimisation and warm-up (often
  tens of seconds for one step), so a rate since the start overstates the
  time left.  The rate here is over the last `window` steps, never counting
  the first `skip` steps after the session started.

  Args:
    start_step: the global step when the session started.
    skip: leading steps left out of the rate.
    window: the rate is measured over at most this many recent steps.
  """

  def __init__(self, start_step, skip=2, window=50):
    self._skip_until = start_step + skip
    self._window = max(int(window), 1)
    self._points = []  # (step, time) from the first counted step on

  def update(self, step, now):
    """Records that global step `step` was reached at time `now`."""
    if step < self._skip_until:
      return
    self._points.append((step, now))
    while (len(self._points) > 2 and
           self._points[-1][0] - self._points[1][0] >= self._window):
      self._points.pop(0)

  def rate(self):
    """Steps per second, or None until two counted steps are recorded."""
    if len(self._points) < 2:
      return None
    (s0, t0), (s1, t1) = self._points[0], self._points[-1]
    return (s1 - s0) / max(t1 - t0, 1e-9) if s1 > s0 else None

  def eta(self, step, train_steps):
    """Seconds until train_steps, or None while the rate is unknown."""
    rate = self.rate()
    if step >= train_steps:
      return 0.0
    return None if not rate else (train_steps - step) / rate


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
    self.last_step = self._start_step
    self._offset = self._log.last_elapsed()
    self._t0 = time.time()
    self._meter = RateMeter(self._start_step)
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
                     "?" if left is None else format_seconds(left)))
      self._last_print = now

  def _print(self, message):
    print("[%s] %s" % (self._label, message), file=self._stream, flush=True)
