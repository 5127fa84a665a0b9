"""Progress of long jobs: steady-state rate, ETA and durations as text.

Owns RateMeter (steps/s over recent steps, leaving out the start-up steps,
and the ETA from it) and format_seconds.  The training's progress lines come
from training/hooks.py's ProgressHook, the files it writes from
run_files.py.  Imports only the standard library.
"""


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
