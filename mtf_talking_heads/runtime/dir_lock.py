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

An empty lock file (what a crash between its truncation and its write
leaves) is taken over as well.  A damaged one (a folder, another file's
content, a field of the wrong type) is refused in one line saying to remove
it if no other run writes there: nothing can tell whose it is.

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


# The lock file's fields and their types (a field may be absent: older
# versions wrote fewer).
_FIELDS = {"pid": (int,), "host": (str,), "command": (str,),
           "started": (int, float), "boot": (str, type(None)),
           "start_ticks": (int, type(None))}
_WHAT = {"pid": "a process id", "host": "a host name",
         "command": "a command line", "started": "a time in seconds",
         "boot": "a boot id", "start_ticks": "a count of clock ticks"}


def _read(path):
  """The lock file's record: a dict, or None (no file, empty: a crash
  between truncating and writing it, or damaged: see _damage)."""
  try:
    with open(path, "rb") as f:
      info = json.loads(f.read().decode("utf-8"))
  except (OSError, ValueError):
    return None
  return info if isinstance(info, dict) else None


def _damage(path):
  """Why the lock file at `path` is not one this module wrote (a phrase),
  or None (no file, an empty one, or a sound one)."""
  if not os.path.lexists(path):
    return None
  if os.path.isdir(path):
    return "is a folder, not a lock file"
  if not os.path.isfile(path):
    return "is not a regular file"
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    return "cannot be read (%s)" % (e.strerror or e)
  if not data:
    return None
  try:
    info = json.loads(data.decode("utf-8"))
  except ValueError:
    return "is not the JSON record a lock holds (%r)" % data[:40]
  if not isinstance(info, dict):
    return "holds %r, not a lock's record" % (info,)
  for name, types in sorted(_FIELDS.items()):
    value = info.get(name)
    if name in info and (not isinstance(value, types)
                         or isinstance(value, bool)):
      return "has %s %r, not %s" % (name, value, _WHAT[name])
  return None


def damage_refusal(directory, flag):
  """The one-line refusal of a damaged lock file (a folder, another
  file's content, a field of the wrong type), or None."""
  if not _is_local(directory):
    return None
  path = _path(directory)
  why = _damage(path)
  if why is None:
    return None
  return ("%s %s: its lock file %s %s: if no other run writes to %s, remove "
          "it (rm %s%s) and rerun" % (flag, directory, path, why, directory,
                                      "-r " if os.path.isdir(path) else "",
                                      path))


def _describe(info):
  info = {k: v for k, v in info.items()
          if k not in _FIELDS or isinstance(v, _FIELDS[k])}
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
  if not os.path.isfile(path):
    return None
  info = _read(path) or {}  # {}: being written, or damaged (_damage)
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
  if held or (info and info.get("host") != socket.gethostname() and
              _damage(path) is None and _holder_state(info, path) == "alive"):
    return _describe(info)
  return None


def refusal(directory, flag):
  """The one-line refusal of a second writer, or of a damaged lock file
  (damage_refusal), or None when it may write."""
  holder = in_use(directory)
  if holder is None:
    return damage_refusal(directory, flag)
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
      if os.path.lexists(path) and not os.path.isfile(path):
        raise LockedError(damage_refusal(directory, flag))
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
    damaged = damage_refusal(directory, flag)
    if damaged:
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)
      raise LockedError(damaged)
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


def holds(directory):
  """True while this process holds `directory`'s lock."""
  return _is_local(directory) and os.path.realpath(directory) in _held


def release_all():
  """Releases every lock this process holds, whatever its hold count (a
  process that ends at once: runtime/stops.py); waits at most a second
  for another thread's acquire or release."""
  if not _guard.acquire(timeout=1.0):
    return
  try:
    for key in list(_held):
      fd, _, stop = _held.pop(key)
      stop.set()
      try:
        os.remove(os.path.join(key, LOCK_FILE))
      except OSError:
        pass
      os.close(fd)
  finally:
    _guard.release()


@contextlib.contextmanager
def hold(directory, flag, log=None):
  """acquire() ... release(), e.g. around a training run."""
  acquire(directory, flag, log)
  try:
    yield
  finally:
    release(directory)
