"""One writer per directory: the lock of a model_dir (or a sweep's output_dir).

Writers (`mtf_th train`, `mtf_th finetune`, a sweep's or demo's output_dir)
hold <dir>/mtf_th.lock while they run; a second writer is refused with one
line naming the holder (PID, host, command, start time).  Readers
(`mtf_th eval`, `mtf_th decode`) take no lock and may share the directory.

How: the lock file is held with fcntl.flock (released by the kernel when the
holder exits, however it exits) and records JSON {pid, host, command,
started, boot}.  The holder refreshes the file's mtime every HEARTBEAT_SECS.
A lock file that is not held is stale and taken over, with a line saying so:

  * on this host: its holder's PID is no longer running (killed with
    SIGKILL, machine restarted), or flock says nobody holds it;
  * another host's (a shared file system, where flock may not reach across
    hosts): its heartbeat is older than STALE_AFTER_SECS (10 minutes).

A clean exit (also Ctrl-C) removes the file.  Only local directories are
locked; a gs:// model_dir (Cloud TPU runs) is not.

Imports only the standard library: the `mtf_th` commands check the lock
before TensorFlow is imported.

Example:
  with dir_lock.hold("/tmp/run", "--model_dir", "mtf_th train"):
    ...  # train; a second `hold` on /tmp/run in another process raises
"""
import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time

LOCK_FILE = "mtf_th.lock"
HEARTBEAT_SECS = 60
STALE_AFTER_SECS = 600

_held = {}  # realpath -> [fd, count, stop Event]  (this process's locks)
_guard = threading.Lock()


class LockedError(ValueError):
  """The directory is in use by another writer (message: one line)."""


def _is_local(path):
  return "://" not in path


def _path(directory):
  return os.path.join(directory, LOCK_FILE)


def _pid_alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _boot_id():
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    return None


def _start_ticks(pid):
  """The process's start time in clock ticks since boot (None: unknown)."""
  try:
    with open("/proc/%d/stat" % pid) as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def _read(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _describe(info):
  started = info.get("started")
  when = (datetime.datetime.fromtimestamp(started, datetime.timezone.utc)
          .strftime("%Y-%m-%d %H:%M:%S UTC") if started else "?")
  return "PID %s on host %s (`%s`, started %s)" % (
      info.get("pid", "?"), info.get("host", "?"), info.get("command", "?"),
      when)


def _holder_state(info, path):
  """"alive", or why the recorded holder is gone (a phrase)."""
  if info.get("host") == socket.gethostname() and (
      info.get("boot") in (None, _boot_id())):
    pid = info.get("pid")
    if not isinstance(pid, int) or not _pid_alive(pid):
      return "its PID is no longer running"
    ticks = info.get("start_ticks")
    if ticks is not None and _start_ticks(pid) not in (None, ticks):
      return "its PID now belongs to another process"
    return "alive"
  if info.get("host") == socket.gethostname():
    return "this host has restarted since"
  try:
    age = time.time() - os.stat(path).st_mtime
  except OSError:
    return "alive"
  if age > STALE_AFTER_SECS:
    return ("its heartbeat is %d min old (another host's lock is stale after "
            "%d min)" % (age // 60, STALE_AFTER_SECS // 60))
  return "alive"


def in_use(directory):
  """The holder's description if another live process holds `directory`'s
  lock, else None.  Changes nothing (a quick check before the real hold)."""
  if not _is_local(directory) or not os.path.isdir(directory):
    return None
  if os.path.realpath(directory) in _held:
    return None
  path = _path(directory)
  info = _read(path)
  if info is None:
    return None
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
      held = False
      fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise
      held = True
  finally:
    os.close(fd)
  if held or (info.get("host") != socket.gethostname()
              and _holder_state(info, path) == "alive"):
    return _describe(info)
  return None


def refusal(directory, flag):
  """The one-line refusal of a second writer, or None when it may write."""
  holder = in_use(directory)
  if holder is None:
    return None
  return ("%s %s is in use by %s; wait for it to finish or stop it, or give "
          "another %s (eval and decode may share it)"
          % (flag, directory, holder, flag))


def _command():
  argv = list(sys.argv)
  if argv and argv[0].endswith(("mtf_th", "cli.py")):
    argv[0] = "mtf_th"
  return shlex.join(argv)[:300]


def _prog():
  argv = list(sys.argv)
  if argv and argv[0].endswith(("mtf_th", "cli.py")) and len(argv) > 1:
    return "mtf_th " + argv[1]
  return os.path.basename(argv[0]) if argv else "mtf_th"


def _heartbeat(path, stop):
  while not stop.wait(HEARTBEAT_SECS):
    try:
      os.utime(path)
    except OSError:
      return


def acquire(directory, flag, log=None):
  """Takes `directory`'s lock for this process (re-entrant).

  Args:
    directory: an existing local directory (others are not locked).
    flag: the flag that named it, for messages ("--model_dir").
    log: where the take-over line of a stale lock goes (default stderr).
  Raises:
    LockedError: another live writer holds it (one line).
  """
  if not _is_local(directory):
    return
  key = os.path.realpath(directory)
  with _guard:
    if key in _held:
      _held[key][1] += 1
      return
    path = _path(directory)
    while True:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          raise
        info = _read(path) or {}
        raise LockedError(
            "%s %s is in use by %s; wait for it to finish or stop it, or "
            "give another %s (eval and decode may share it)"
            % (flag, directory, _describe(info), flag)) from None
      try:  # the file we locked may have been removed by its last holder
        same = os.path.samestat(os.fstat(fd), os.stat(path))
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    previous = _read(path)
    if previous:
      state = _holder_state(previous, path)
      if state == "alive" and previous.get("host") != socket.gethostname():
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise LockedError(
            "%s %s is in use by %s (heartbeat under %d min old); wait for it "
            "to finish or stop it, or give another %s"
            % (flag, directory, _describe(previous), STALE_AFTER_SECS // 60,
               flag))
      if state == "alive":  # same host, flock free: the holder let it go
        state = "it no longer holds the lock"
      print("%s: taking over the stale lock of %s %s: it was %s, and %s"
            % (_prog(), flag, directory, _describe(previous), state),
            file=log or sys.stderr, flush=True)
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "command": _command(), "started": time.time(),
            "boot": _boot_id(), "start_ticks": _start_ticks(os.getpid())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
    os.fsync(fd)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(path, stop), daemon=True,
                     name="mtf_th.lock heartbeat").start()
    _held[key] = [fd, 1, stop]


def release(directory):
  """Drops one hold of `directory`'s lock; the last removes the file."""
  if not _is_local(directory):
    return
  key = os.path.realpath(directory)
  with _guard:
    if key not in _held:
      return
    _held[key][1] -= 1
    if _held[key][1] > 0:
      return
    fd, _, stop = _held.pop(key)
    stop.set()
    try:
      os.remove(_path(directory))
    except OSError:
      pass
    os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def hold(directory, flag, log=None):
  """acquire() ... release(), e.g. around a training run."""
  acquire(directory, flag, log)
  try:
    yield
  finally:
    release(directory)
