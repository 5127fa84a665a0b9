"""hooks.ProgressHook: an honest ETA and a monotonic train_log.csv clock.

The hook is driven by hand (a stand-in session and clock, no TF session):
the first update of a run is slow (graph optimisation, warm-up), the rest
are steady.
"""
import io
import os

import tensorflow.compat.v1 as tf

from mtf_talking_heads.runtime import progress
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import hooks


class _Session(object):
  """Answers the hook's global-step reads."""

  def __init__(self, step):
    self.step = step

  def run(self, fetches):
    del fetches
    return self.step


class _RunContext(object):

  def __init__(self, session):
    self.session = session


def _drive(model_dir, start, stop, durations, train_steps, monkeypatch,
           print_every_secs=1e9):
  """Runs the hook from global step `start` to `stop`; returns its output.

  durations(step) is the wall time of the update that reaches `step`.
  """
  clock = [1000.0]
  monkeypatch.setattr(hooks.time, "time", lambda: clock[0])
  stream = io.StringIO()
  with tf.Graph().as_default():
    tf.train.create_global_step()
    tf.add_to_collection(tf.GraphKeys.LOSSES, tf.constant(1.0))
    hook = hooks.ProgressHook(model_dir, train_steps, stream=stream,
                              print_every_secs=print_every_secs)
    hook.begin()
    session = _Session(start)
    hook.after_create_session(session, None)
    for step in range(start + 1, stop + 1):
      clock[0] += durations(step)
      session.step = step
      hook.after_run(_RunContext(session),
                     tf.train.SessionRunValues(results=2.5, options=None,
                                               run_metadata=None))
  return stream.getvalue()


def test_eta_leaves_out_the_slow_first_steps(tmp_path, monkeypatch):
  # first update 60 s, then 0.5 s per step: a line at step 1 (no rate yet)
  # and at step 11, when 89 steps of 0.5 s are left (not 89 * 65.5 s / 11)
  out = _drive(str(tmp_path), 0, 12, lambda s: 60.0 if s == 1 else 0.5, 100,
               monkeypatch, print_every_secs=5.0)
  first, second = out.strip().splitlines()[1:]
  assert "step 1/100" in first and "ETA ?" in first, out
  assert "step 11/100" in second, out
  assert "2.00 steps/s" in second and "ETA 44s" in second, second


def test_no_eta_until_a_steady_rate_is_measured(tmp_path, monkeypatch):
  out = _drive(str(tmp_path), 0, 1, lambda s: 60.0, 100, monkeypatch,
               print_every_secs=5.0)
  assert "ETA ?" in out.strip().splitlines()[-1], out


def test_rate_meter_follows_a_change_of_speed():
  meter = progress.RateMeter(0, skip=1, window=10)
  t = 0.0
  for step in range(1, 101):
    t += 1.0 if step <= 50 else 0.25
    meter.update(step, t)
  assert abs(meter.rate() - 4.0) < 1e-9
  assert abs(meter.eta(100, 200) - 25.0) < 1e-9


def test_elapsed_never_decreases_across_a_resume(tmp_path, monkeypatch):
  model_dir = str(tmp_path)
  # first run: 1 s per step up to step 35, killed after its checkpoint 30
  _drive(model_dir, 0, 35, lambda s: 1.0, 40, monkeypatch)
  # resumed from checkpoint 30: steps 31..35 are done again, 36.. are new
  _drive(model_dir, 30, 40, lambda s: 0.1, 40, monkeypatch)
  rows = run_files.read_train_log(model_dir)
  assert [r["step"] for r in rows] == list(range(1, 41))
  elapsed = [r["elapsed_sec"] for r in rows]
  assert elapsed == sorted(elapsed), elapsed
  # step 36 continues from the last logged time (35 s) plus the resumed
  # run's 0.6 s for steps 31..36
  assert abs(elapsed[35] - 35.6) < 1e-6, elapsed[35]
  assert os.path.exists(os.path.join(model_dir, "train_log.csv"))
