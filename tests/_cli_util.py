"""Run `mtf_th` in a subprocess, as a user would, and see what it imported.

run() starts the console script's entry point (mtf_talking_heads_startup.mtf_th,
the light import) in a fresh Python with this checkout first on the path, and
reports whether TensorFlow was imported by the time the command exited: the
refusals that need no TensorFlow must not load it.
"""
import collections
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MTF_TH = os.path.join(os.path.dirname(sys.executable), "mtf_th")
# what `mtf_th train` without --verbose must not print (compat.py hides it):
# TF's CUDA-plugin "E" lines, setuptools' warning, mtf's per-step tf.Print
NOISE = ("Unable to register cuDNN factory", "pkg_resources is deprecated",
         "tf_loss")

# argv[1:] are mtf_th's arguments; a line on the pipe MTF_TH_TEST_PROBE_FD
# says whether TensorFlow was imported (stdout and stderr stay the command's).
_PROBE = r"""
import os, sys
sys.argv = ["mtf_th"] + sys.argv[1:]
from mtf_talking_heads_startup import mtf_th
try:
  code = mtf_th()
except SystemExit as e:
  code = e.code
except KeyboardInterrupt:
  code = 99
with os.fdopen(int(os.environ["MTF_TH_TEST_PROBE_FD"]), "w") as probe:
  probe.write("tensorflow=%s\n" % ("tensorflow" in sys.modules))
sys.exit(code)
"""

Result = collections.namedtuple("Result", ["code", "stdout", "stderr",
                                           "tensorflow"])



def load_script(path, name):
  """Imports a script of this checkout (e.g. launch/tpu.py) as module `name`,
  so a test calls its main(argv) in-process instead of starting Python."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def snapshot(path):
  """{relative path: mtime_ns} of a directory tree, the directory included:
  equal before and after a refused command = nothing was written."""
  out = {".": os.stat(path).st_mtime_ns}
  for root, dirs, files in os.walk(path):
    for name in dirs + files:
      full = os.path.join(root, name)
      out[os.path.relpath(full, path)] = os.lstat(full).st_mtime_ns
  return out

def env(extra=None):
  out = dict(os.environ)
  out["PYTHONPATH"] = os.pathsep.join(
      [REPO] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p])
  out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  out.update(extra or {})
  return out


def set_stop_signals(disposition):
  """In a child before exec: SIGINT and SIGTERM set to `disposition`.

  signal.SIG_DFL: as a terminal starts a command; signal.SIG_IGN: as a
  script's `cmd &` with `trap '' TERM` does (a shell without job control
  starts a background command with SIGINT ignored).
  """
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, disposition)


def run(args, cwd=None, extra_env=None, timeout=600, user=None):
  """Runs `mtf_th ARGS`; returns Result(code, stdout, stderr, tensorflow).

  Args:
    user: a uid to run as (e.g. 65534, nobody, for read-only directories
      when the tests run as root).
  """
  read, write = os.pipe()
  preexec = None
  if user is not None:
    def preexec():
      os.setgid(user)
      os.setuid(user)
  try:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE] + list(args), cwd=cwd or REPO,
        env=env(dict(extra_env or {}, MTF_TH_TEST_PROBE_FD=str(write))),
        capture_output=True, text=True, timeout=timeout, pass_fds=(write,),
        preexec_fn=preexec)
  finally:
    os.close(write)
  with os.fdopen(read) as f:
    probe = f.read()
  return Result(proc.returncode, proc.stdout, proc.stderr,
                None if not probe else "tensorflow=True" in probe)


def heavy_imports(argv, cwd=None):
  """Runs `mtf_th ARGV` (or, with argv[0] == "-c", `python -c CODE`) under
  PYTHONPROFILEIMPORTTIME; returns (CompletedProcess, the TensorFlow or
  mesh_tensorflow modules it imported: [] for a light command)."""
  command = ([sys.executable] + list(argv) if argv[0] == "-c"
             else [MTF_TH] + list(argv))
  proc = subprocess.run(command, cwd=cwd or REPO, capture_output=True,
                        text=True, timeout=120,
                        env=env({"PYTHONPROFILEIMPORTTIME": "1"}))
  # the profile must be there (else "no TensorFlow line" proves nothing)
  assert re.search(r"import time: .*\|\s+mtf_talking_heads(\.|$)",
                   proc.stderr), proc.stderr[-2000:]
  heavy = [l for l in proc.stderr.splitlines()
           if re.search(r"\|\s+(tensorflow|mesh_tensorflow)(\.|$)", l)]
  return proc, heavy


def start(args, cwd=None, **popen_kwargs):
  """Starts `mtf_th ARGS` (the console script) as a user would; a Popen
  with text stdout and stderr pipes unless popen_kwargs say otherwise."""
  kwargs = dict(cwd=cwd or REPO, env=env(), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
  kwargs.update(popen_kwargs)
  return subprocess.Popen([MTF_TH] + list(args), **kwargs)


def wait_until(ready, proc, timeout=600, poll_secs=0.2):
  """Polls ready() until it is true; fails (with proc's output) if proc
  exits first or `timeout` seconds pass."""
  deadline = time.time() + timeout
  while not ready():
    assert proc.poll() is None, proc.communicate()
    assert time.time() < deadline, "not ready after %d s" % timeout
    time.sleep(poll_secs)


_LOCK_HOLDER = """
import sys, time
sys.argv = ["mtf_th", "train", "--model_dir", sys.argv[1]]
from mtf_talking_heads.runtime import dir_lock
dir_lock.acquire(sys.argv[3], "--model_dir")
print("held", flush=True)
time.sleep(600)
"""


def lock_holder(model_dir):
  """A real process holding model_dir's lock (as `mtf_th train` would);
  kill() and wait() it when done."""
  proc = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, model_dir],
                          env=env(), stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc
