"""Modules the sweep imports at first use, not at import time.

progress.py and training/checkpoints.py import TensorFlow; `mtf_th sweep
--list_paper_tables` and the plan of `--dry_run` must not pay for it.  Owns
LazyModule, `progress` and `checkpoints`.
"""
import importlib


class LazyModule(object):
  """A module imported at its first attribute access.

  Example:
    progress = LazyModule("mtf_talking_heads.runtime.progress")  # nothing imported
    progress.format_seconds(90)  # imports progress.py (and TensorFlow) now
  """

  def __init__(self, name):
    self._name = name

  def __getattr__(self, attr):
    return getattr(importlib.import_module(self._name), attr)


progress = LazyModule("mtf_talking_heads.runtime.progress")
checkpoints = LazyModule("mtf_talking_heads.training.checkpoints")
