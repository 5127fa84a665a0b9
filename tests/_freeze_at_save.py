"""A fault for tests: SIGSTOP a server at a chosen moment of a run.

Imported by `mtf_th train|decode --module_import _freeze_at_save` (tests/
on PYTHONPATH) with MTF_TH_TEST_FREEZE in the environment:

  "PID:N"        when the run's N-th checkpoint save begins
                 (runtime/stops.save_started, which the trainer calls right
                 before TF's Saver writes the checkpoint), so the save op
                 waits inside TensorFlow on the frozen task;
  "PID:watch:S"  S seconds after the cluster's liveness watch begins
                 (training/liveness.watching asks runtime/dir_lock.holds
                 whether the run holds its model_dir; only a stop asks it
                 otherwise), so the run is building or running its graph
                 past the cluster's pre-flight.

Process PID gets SIGSTOP.  Imports only the standard library and
runtime/ modules (module imports run before TensorFlow loads).
"""
import os
import signal
import threading

from mtf_talking_heads.runtime import dir_lock
from mtf_talking_heads.runtime import stops

_FIELDS = os.environ["MTF_TH_TEST_FREEZE"].split(":")
_PID = int(_FIELDS[0])


def _freeze():
  os.kill(_PID, signal.SIGSTOP)


if _FIELDS[1] == "watch":
  _holds = dir_lock.holds
  _timer = []

  def _holds_then_freeze(model_dir):
    if not _timer:
      _timer.append(threading.Timer(float(_FIELDS[2]), _freeze))
      _timer[0].daemon = True
      _timer[0].start()
    return _holds(model_dir)

  dir_lock.holds = _holds_then_freeze
else:
  _AT = int(_FIELDS[1])
  _saves = [0]
  _save_started = stops.save_started

  def _freezing_save_started():
    _save_started()
    _saves[0] += 1
    if _saves[0] == _AT:
      _freeze()

  stops.save_started = _freezing_save_started
