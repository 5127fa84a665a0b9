"""A fault for tests: SIGSTOP a server the moment a checkpoint save begins.

Imported by `mtf_th train --module_import _freeze_at_save` (tests/ on
PYTHONPATH) with MTF_TH_TEST_FREEZE="PID:N" in the environment: when the
run's N-th save begins (runtime/stops.save_started, which the trainer calls
right before TF's Saver writes the checkpoint), process PID gets SIGSTOP,
so the save op waits inside TensorFlow on the frozen task.  Imports only
the standard library and runtime/stops.py (module imports run before
TensorFlow loads).
"""
import os
import signal

from mtf_talking_heads.runtime import stops

_PID, _AT = (int(v) for v in os.environ["MTF_TH_TEST_FREEZE"].split(":"))
_saves = [0]
_save_started = stops.save_started


def _freezing_save_started():
  _save_started()
  _saves[0] += 1
  if _saves[0] == _AT:
    os.kill(_PID, signal.SIGSTOP)


stops.save_started = _freezing_save_started
