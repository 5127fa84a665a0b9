"""Stops that always work: a long command ends on Ctrl-C or SIGTERM in seconds.

Python runs a signal handler only in the main thread, between two bytecodes:
while the main thread waits inside TensorFlow (a step on a frozen
`--cluster` task, a session being created for a huge graph, a checkpoint
save) the handler waits too, and so did the command (for ever, on a frozen
task).  install() and force_with() make the stop independent of the main
thread:

  * install() (the console script, in its main thread): through
    signal.set_wakeup_fd the C-level handler writes the signal's number to
    a pipe the moment it arrives, whatever the main thread is doing; a
    daemon thread reads it.
  * force_with(line) (a long command, once it knows its line): after a
    SIGINT or SIGTERM the main thread gets FORCE_AFTER_SECS to stop
    the usual way (its handler raises KeyboardInterrupt: the command's one
    line, its lock released, status 130 or 143).  If the process is still
    there then, the thread waits for a checkpoint save this process is
    writing (save_started(): at most until SAVE_WAIT_SECS after the
    signal, so no save is cut short unless it takes longer), prints the
    command's line, releases every lock this process holds
    (dir_lock.release_all) and ends the process (os._exit) with 128 + the
    signal's number.  A save cut short is never listed in the `checkpoint`
    file (TF's Saver lists a checkpoint after writing it).

end() ends the process the same way from any thread with any line (the
cluster's liveness watchdog, training/liveness.py), and claim() lets the
main thread and those threads agree on who prints the one line; reset()
at the end of each command (commands/common.run_command) clears the claim
for the next command in the same process.

Imports only the standard library (and runtime/dir_lock.py): the light
commands import it before TensorFlow.

Example (a command, before its long work):
  stops.force_with(lambda signum: "mtf_th train: interrupted")
"""
import os
import signal
import sys
import threading
import time

from mtf_talking_heads.runtime import dir_lock

FORCE_AFTER_SECS = 4.0  # a stop the usual way gets this long ...
SAVE_WAIT_SECS = 8.0  # ... a checkpoint save in progress at most this long
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_lock = threading.Lock()
_state = {"line": None, "after": FORCE_AFTER_SECS, "code": None,
          "prog": None, "thread": None, "signal": None, "forcing": False,
          "claimed": None, "saves": 0}


def install():
  """Reads SIGINT and SIGTERM as they arrive, for the rest of the process.

  Called by the `mtf_th` console script in its main thread (a command's
  main() called by a test installs nothing).  Until force_with() names the
  line, a signal is only recorded.

  Returns:
    True if installed (False: not the main thread).
  """
  with _lock:
    if _state["thread"] is not None:
      return True
  read, write = os.pipe()
  os.set_blocking(write, False)
  try:
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
  except ValueError:  # not the main thread
    os.close(read)
    os.close(write)
    return False
  thread = threading.Thread(target=_read_signals, args=(read,), daemon=True,
                            name="mtf_th stop watch")
  with _lock:
    _state["thread"] = thread
  thread.start()
  sys.unraisablehook = _quiet_stops(sys.unraisablehook)
  return True


def _quiet_stops(hook):
  """sys.unraisablehook without the stop's KeyboardInterrupt: Python runs
  the handler at any bytecode, also in a garbage-collector callback or a
  __del__ (e.g. jax's _xla_gc_callback while TF builds a graph), where the
  exception is printed as "Exception ignored in ... Traceback" and
  dropped; the forced stop then ends the command with its one line."""
  def quiet(unraisable):
    if (isinstance(unraisable.exc_value, KeyboardInterrupt)
        and _state["signal"] is not None):
      return
    hook(unraisable)
  return quiet


def installed():
  """True in the `mtf_th` console script (install() ran)."""
  return _state["thread"] is not None


def force_with(line, after_secs=FORCE_AFTER_SECS, code=None, prog=None):
  """From now on a SIGINT or SIGTERM ends the process within seconds.

  Args:
    line: line(signum) -> the one line a forced stop prints (computed when
      it is needed, e.g. with the last checkpoint's step), or None.
    after_secs: how long the main thread gets to stop the usual way.
    code: the exit status of a forced stop (None: 128 + the signal).
    prog: the command's name for error_line, e.g. "mtf_th train".
  """
  with _lock:
    _state.update(line=line, after=after_secs, code=code, prog=prog)
  signum = _state["signal"]
  if signum is not None:  # it came before: forced from now
    _start_force(signum)


def stop_signal():
  """The SIGINT or SIGTERM this process is stopping on (None: none yet)."""
  return _state["signal"]


def note_signal(signum):
  """The main thread's handler got `signum` (it may run before the watch
  thread reads the pipe): stop_signal() says so from now on."""
  if signum in STOP_SIGNALS and _state["signal"] is None:
    _state["signal"] = signum
    if _state["line"] is not None:
      _start_force(signum)


def _read_signals(read):
  while True:
    try:
      data = os.read(read, 64)
    except InterruptedError:
      continue
    if not data:
      return
    for signum in data:
      note_signal(signum)


def _start_force(signum):
  with _lock:
    if _state["forcing"]:
      return
    _state["forcing"] = True
  threading.Thread(target=_force, args=(signum, time.monotonic()),
                   daemon=True, name="mtf_th forced stop").start()


def _force(signum, start):
  """After the main thread's time (and a save in progress), ends the
  process with force_with()'s line."""
  time.sleep(_state["after"])
  while _state["saves"] > 0 and time.monotonic() - start < SAVE_WAIT_SECS:
    time.sleep(0.05)
  try:
    line = _state["line"](signum)
  except Exception:  # pylint: disable=broad-except  (the stop must happen)
    line = None
  end(line, 128 + signum if _state["code"] is None else _state["code"])


def error_line(message):
  """"<prog>: error: <message>", the form of a command's error line."""
  return "%s: error: %s" % (_state["prog"] or "mtf_th", message)


def claim(code, line=None):
  """The main thread ends the command with `line` and exit status `code`.

  Prints `line` (to stderr) unless another thread has already printed its
  own and is ending the process; under the lock end() takes, so exactly
  one line is printed and none is cut off by end()'s exit.

  Returns:
    True if the line was printed (the caller returns `code`); False if
    another thread is ending the process (the caller calls hold()).
    Without install() (a command's main() called in-process, e.g. by a
    test, may run many times) always True.
  """
  if not installed():
    _print(line)
    return True
  with _lock:
    if _state["claimed"] is not None:
      return False
    _state["claimed"] = code
    _print(line)
    return True


def reset():
  """The command is done: the next one in this process starts afresh.

  The claim, force_with()'s line and the stop signal belong to one
  command; without this, a process running two commands after install()
  (a script calling cli.console twice, a driver running train then eval
  in-process) had the second command's claim() refused, and its main
  thread waited in hold() for ever.  Nothing is reset while a forced stop
  is ending the process (it ends it within seconds).

  Example (commands/common.run_command):
    try:
      return body(args, training)
    finally:
      stops.reset()

  Returns:
    True if reset (False: a forced stop is under way).
  """
  with _lock:
    if _state["forcing"]:
      return False
    _state.update(line=None, after=FORCE_AFTER_SECS, code=None, prog=None,
                  signal=None, claimed=None)
  return True


def _print(line):
  if line:
    try:
      print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
      pass


def hold():
  """Waits for the thread that claimed the line to end the process."""
  while True:
    time.sleep(60)


def end(line, code):
  """Ends the process now, from any thread, with its one line.

  Prints `line` (unless the main thread has claimed the line: then
  nothing, and the main thread's exit status), releases the locks this
  process holds and exits with `code` without running Python's exit (which
  would wait for the main thread).
  """
  with _lock:
    if _state["claimed"] is None:
      _state["claimed"] = code
      _print(line)
    code = _state["claimed"]
  dir_lock.release_all()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)  # pylint: disable=protected-access


def exit_hard_at_end():
  """A thread of this process may still wait inside TensorFlow when the
  command is done (a probe of a lost --cluster task): the console script
  then ends the process with end() instead of Python's exit, which would
  abort it when that thread returns ("terminate called ...")."""
  _state["hard_exit"] = True


def hard_exit_wanted():
  return bool(_state.get("hard_exit"))


def save_started():
  """A checkpoint save this process writes begins: a forced stop waits for
  save_ended() (up to SAVE_WAIT_SECS after the signal)."""
  with _lock:
    _state["saves"] += 1


def save_ended():
  with _lock:
    _state["saves"] = max(0, _state["saves"] - 1)
