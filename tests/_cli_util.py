"""Run `mtf_th` in a subprocess, as a user would, and see what it imported.

run() starts the console script's entry point (mtf_talking_heads_startup.mtf_th,
the light import) in a fresh Python with this checkout first on the path, and
reports whether TensorFlow was imported by the time the command exited: the
refusals that need no TensorFlow must not load it.
"""
import collections
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MTF_TH = os.path.join(os.path.dirname(sys.executable), "mtf_th")

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


def env(extra=None):
  out = dict(os.environ)
  out["PYTHONPATH"] = os.pathsep.join(
      [REPO] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p])
  out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  out.update(extra or {})
  return out


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
