"""One writer per model_dir (dir_lock.py), with real processes.

A holder process takes a directory's lock; a second `mtf_th train` on it is
refused in one line naming the holder (PID, host, command) before
TensorFlow is imported; a holder killed with SIGKILL leaves a stale lock
that the next writer takes over with a line saying so; another host's lock
is honoured until its heartbeat is STALE_AFTER_SECS old.  With real `mtf_th
train` processes (a second writer refused while the first builds its graph,
the stale lock of one killed with SIGKILL taken over by its rerun and
released at its end): tests/training/test_training.py's kill -9 test.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import _cli_util
from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.runtime import dir_lock

T5 = ["--gin_file", "experiments/t5_heads/07_talking_heads_24_32.gin",
      "--gin_file", "models/t5_tiny.gin"]

def test_second_writer_is_refused_before_tensorflow(tmp_path):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  holder = _cli_util.lock_holder(model_dir)
  lock = os.path.join(model_dir, dir_lock.LOCK_FILE)
  before = (os.listdir(model_dir), open(lock).read())  # (mtime: heartbeat)
  try:
    result = _cli_util.run(["train", "--model_dir", model_dir] + T5)
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mtf_th train: error: --model_dir %s is in "
                               "use by PID %d on host %s (`mtf_th train "
                               "--model_dir %s`" % (
                                   model_dir, holder.pid,
                                   socket.gethostname(), model_dir))
    assert "give another --model_dir" in lines[0]
    assert result.tensorflow is False
    # finetune is a writer too; eval and decode (readers) pass the check
    pretrained = str(tmp_path / "pretrained")
    os.makedirs(pretrained)
    result = _cli_util.run(["finetune", "--model_dir", model_dir,
                            "--pretrained_model_dir", pretrained] + T5)
    assert result.code == 2 and "in use by PID %d" % holder.pid in (
        result.stderr) and result.tensorflow is False
    args = commands.ArgumentParser()
    common.add_common_flags(args)
    common.check_common(
        args.parse_args(["--model_dir", model_dir]), writes=False,
        purpose="eval_results.csv")
    assert (os.listdir(model_dir), open(lock).read()) == before
  finally:
    holder.kill()
    holder.wait()


def test_stale_lock_of_a_killed_writer_is_taken_over(tmp_path):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  holder = _cli_util.lock_holder(model_dir)
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  lock = os.path.join(model_dir, dir_lock.LOCK_FILE)
  assert json.load(open(lock))["pid"] == holder.pid  # left behind
  assert dir_lock.refusal(model_dir, "--model_dir") is None
  out = subprocess.run(
      [sys.executable, "-c",
       "from mtf_talking_heads.runtime import dir_lock as d; import sys; "
       "d.acquire(sys.argv[1], '--model_dir'); d.release(sys.argv[1])",
       model_dir], env=_cli_util.env(), capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  lines = out.stderr.splitlines()
  assert len(lines) == 1, out.stderr
  assert "taking over the stale lock of --model_dir %s" % model_dir in (
      lines[0])
  assert "PID %d on host %s" % (holder.pid, socket.gethostname()) in lines[0]
  assert lines[0].endswith("its PID is no longer running")
  assert not os.path.exists(lock)  # released on a clean exit


def test_another_hosts_lock_until_its_heartbeat_is_stale(tmp_path, capsys):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  lock = os.path.join(model_dir, dir_lock.LOCK_FILE)
  with open(lock, "w") as f:
    json.dump({"pid": 4242, "host": "other-host", "command": "mtf_th train",
               "started": time.time()}, f)
  message = dir_lock.refusal(model_dir, "--model_dir")
  assert "in use by PID 4242 on host other-host" in message
  with pytest.raises(dir_lock.LockedError, match="heartbeat under 10 min"):
    dir_lock.acquire(model_dir, "--model_dir")
  assert json.load(open(lock))["host"] == "other-host"  # untouched
  old = time.time() - dir_lock.STALE_AFTER_SECS - 60
  os.utime(lock, (old, old))
  assert dir_lock.refusal(model_dir, "--model_dir") is None
  with dir_lock.hold(model_dir, "--model_dir"):
    assert json.load(open(lock))["pid"] == os.getpid()
    with dir_lock.hold(model_dir, "--model_dir"):  # re-entrant
      pass
    assert os.path.exists(lock)
  assert not os.path.exists(lock)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and "PID 4242 on host other-host" in err[0]
  assert "heartbeat is 11 min old" in err[0]


def test_not_in_use_is_a_usage_error(tmp_path):
  model_dir = str(tmp_path / "run")
  os.makedirs(model_dir)
  holder = _cli_util.lock_holder(model_dir)
  try:
    with pytest.raises(prechecks.commands.UsageError, match="in use by PID"):
      prechecks.not_in_use(model_dir, "--model_dir")
  finally:
    holder.kill()
    holder.wait()
  prechecks.not_in_use(model_dir, "--model_dir")  # dead holder: free


@pytest.mark.parametrize("content, why", [
    (None, "is a folder, not a lock file"),
    ('{"pid": "x", "host": "h"}', "has pid 'x', not a process id"),
    ('{"pid": 5, "host": 5}', "has host 5, not a host name"),
    ('{"pid": 5, "started": "yesterday"}',
     "has started 'yesterday', not a time in seconds"),
    ('{"pid": true}', "has pid True, not a process id"),
    ("[1, 2]", "holds [1, 2], not a lock's record"),
    ("garbage", "is not the JSON record a lock holds (b'garbage')"),
])
def test_a_damaged_lock_file_is_refused_in_one_line(tmp_path, content, why):
  """Nothing can tell whose a damaged lock is: refused (before and at the
  hold), never taken over or rewritten; an empty one (a crash between the
  truncation and the write) is taken over."""
  model_dir = str(tmp_path)
  lock = os.path.join(model_dir, dir_lock.LOCK_FILE)
  if content is None:
    os.mkdir(lock)
  else:
    with open(lock, "w") as f:
      f.write(content)
  expected = ("--model_dir %s: its lock file %s %s: if no other run writes "
              "to %s, remove it (rm %s%s) and rerun" % (
                  model_dir, lock, why, model_dir,
                  "-r " if content is None else "", lock))
  assert dir_lock.refusal(model_dir, "--model_dir") == expected
  with pytest.raises(dir_lock.LockedError) as e:
    dir_lock.acquire(model_dir, "--model_dir")
  assert str(e.value) == expected
  assert os.path.isdir(lock) if content is None else (
      open(lock).read() == content)
  assert os.listdir(model_dir) == [dir_lock.LOCK_FILE]


def test_an_empty_lock_file_is_taken_over(tmp_path):
  model_dir = str(tmp_path)
  open(os.path.join(model_dir, dir_lock.LOCK_FILE), "w").close()
  assert dir_lock.refusal(model_dir, "--model_dir") is None
  with dir_lock.hold(model_dir, "--model_dir"):
    with open(os.path.join(model_dir, dir_lock.LOCK_FILE)) as f:
      assert json.load(f)["pid"] == os.getpid()
  assert os.listdir(model_dir) == []
