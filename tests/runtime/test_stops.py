"""runtime/stops.py: a stop that works while the main thread cannot run
Python (issue 34), on small Python processes without TensorFlow.

The child's main thread blocks SIGINT and SIGTERM and sleeps in libc
(ctypes), as a main thread waiting inside TensorFlow does: Python's handler
never runs there, so only stops' thread can end it.  It holds a directory's
lock (runtime/dir_lock.py), as `mtf_th train` holds its model_dir's.
A stop that Python drops in a finalizer prints no traceback.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import _cli_util
from mtf_talking_heads.runtime import dir_lock
from mtf_talking_heads.runtime import stops

# argv[1]: the locked directory; argv[2]: what the child does after its
# first line ("wait", "save SECS": a checkpoint save of SECS seconds is in
# progress, "end": another thread ends the run with its own line while the
# main thread has claimed its line).
_CHILD = r"""
import ctypes, os, signal, sys, threading, time
from mtf_talking_heads.runtime import dir_lock, stops
directory, what = sys.argv[1], sys.argv[2].split()
signal.signal(signal.SIGINT, lambda *_: None)  # Python handlers, as cli's
signal.signal(signal.SIGTERM, lambda *_: None)
stops.install()
stops.force_with(lambda signum: "prog: interrupted by %d" % signum,
                 prog="prog")
dir_lock.acquire(directory, "--model_dir")
if what[0] == "save":
  stops.save_started()
  threading.Timer(float(what[1]), stops.save_ended).start()
if what[0] == "end":
  assert stops.claim(7)
  threading.Timer(0.5, stops.end, ["a second line", 1]).start()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
print("ready", flush=True)
while True:
  ctypes.CDLL(None).sleep(60)
"""


def _child(tmp_path, what):
  directory = str(tmp_path)
  proc = subprocess.Popen([sys.executable, "-c", _CHILD, directory, what],
                          env=_cli_util.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "ready\n", proc.communicate()
  assert os.path.exists(os.path.join(directory, dir_lock.LOCK_FILE))
  return proc, directory


def _stop(proc, sig=None):
  if sig is not None:
    proc.send_signal(sig)
  start = time.time()
  try:
    _, err = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return proc.returncode, time.time() - start, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_forced_stop_after_the_main_threads_time(tmp_path, sig):
  """The line, 128 + the signal, the lock released, FORCE_AFTER_SECS on."""
  proc, directory = _child(tmp_path, "wait")
  code, seconds, err = _stop(proc, sig)
  assert (code, err) == (128 + sig, "prog: interrupted by %d\n" % sig)
  assert stops.FORCE_AFTER_SECS <= seconds <= 10, seconds
  assert os.listdir(directory) == []


def test_a_save_in_progress_is_waited_for_up_to_its_bound(tmp_path):
  proc, _ = _child(tmp_path, "save 6")  # ends 6 s after the start
  code, seconds, _ = _stop(proc, signal.SIGTERM)
  assert code == 143 and 5 <= seconds <= 9, seconds
  proc, _ = _child(tmp_path, "save 60")  # never in time: SAVE_WAIT_SECS
  code, seconds, _ = _stop(proc, signal.SIGTERM)
  assert code == 143, code
  assert stops.SAVE_WAIT_SECS <= seconds <= 10, seconds


def test_one_line_when_the_main_thread_claimed_it(tmp_path):
  """A thread's end() after the main thread's claim prints nothing and
  exits with the main thread's status; the lock is still released."""
  proc, directory = _child(tmp_path, "end")
  code, _, err = _stop(proc)
  assert (code, err) == (7, "")
  assert os.listdir(directory) == []


def test_a_stop_dropped_in_a_finalizer_prints_no_traceback():
  """A handler's KeyboardInterrupt raised inside a __del__ (or a garbage
  collector callback) is dropped by Python with "Exception ignored ...
  Traceback"; once stopping, stops keeps that quiet (the forced stop ends
  the command); any other dropped exception is still reported."""
  code = ("import signal\n"
          "from mtf_talking_heads.runtime import stops\n"
          "stops.install()\n"
          "class Stop:\n"
          "  def __del__(self):\n"
          "    raise KeyboardInterrupt()\n"
          "class Bug:\n"
          "  def __del__(self):\n"
          "    raise ValueError('a bug')\n"
          "Stop()\n"
          "stops.note_signal(signal.SIGTERM)\n"
          "Stop()\n"
          "Bug()\n")
  proc = subprocess.run([sys.executable, "-c", code], env=_cli_util.env(),
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr.count("Exception ignored in") == 2, proc.stderr
  assert "KeyboardInterrupt" in proc.stderr.split("Exception ignored in")[1]
  assert "ValueError: a bug" in proc.stderr.split("Exception ignored in")[2]


# Two commands in one process after install() (a script calling cli.console
# twice, a driver running train then eval in-process), each refused with its
# line by run_command: the first one's claim used to refuse the second's,
# whose main thread then waited in hold() for ever.  TensorFlow is not
# needed: the training package and the logging set-up are stand-ins.
_TWO_COMMANDS = r"""
import sys, types
import mtf_talking_heads_startup
mtf_talking_heads_startup.LIGHT_PACKAGE_IMPORT = True  # no TensorFlow
from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.runtime import stops
training = types.ModuleType("mtf_talking_heads.training")
training.ConfigError = type("ConfigError", (ValueError,), {})
training.TrainingError = type("TrainingError", (RuntimeError,), {})
sys.modules["mtf_talking_heads.training"] = training
common.setup_logging = lambda verbose: None
common.announce = lambda prog, args: None
assert stops.install()
def body(args, training):
  raise training.ConfigError("refused %s" % args.model_dir)
for name in ("first", "second"):
  parser = commands.ArgumentParser(prog="mtf_th x")
  parser.add_argument("--model_dir")
  parser.add_argument("--verbose", action="store_true")
  print(common.run_command("mtf_th x", parser, ["--model_dir", name], body,
                           precheck=lambda args: None), flush=True)
"""


def test_two_commands_in_one_process_each_print_their_line():
  proc = subprocess.run([sys.executable, "-c", _TWO_COMMANDS],
                        env=_cli_util.env(), capture_output=True, text=True,
                        timeout=30)
  assert (proc.returncode, proc.stdout, proc.stderr) == (
      0, "2\n2\n", "mtf_th x: error: refused first\n"
      "mtf_th x: error: refused second\n")


def test_reset_clears_the_claim_not_a_forced_stop():
  """In this process (install() never ran here): reset() clears the state
  a command leaves, except while a forced stop is ending the process."""
  saved = dict(stops._state)  # pylint: disable=protected-access
  try:
    stops._state.update(claimed=2, line=print, signal=signal.SIGTERM)  # pylint: disable=protected-access
    assert stops.reset()
    assert (stops._state["claimed"], stops._state["line"],  # pylint: disable=protected-access
            stops.stop_signal()) == (None, None, None)
    stops._state.update(claimed=2, forcing=True)  # pylint: disable=protected-access
    assert not stops.reset()
    assert stops._state["claimed"] == 2  # pylint: disable=protected-access
  finally:
    stops._state.clear()  # pylint: disable=protected-access
    stops._state.update(saved)  # pylint: disable=protected-access
