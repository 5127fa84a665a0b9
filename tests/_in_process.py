"""Commands' main() run in one child Python, and what they did read back.

The bad-input suites that need TensorFlow load it once: a child script
calls several commands' main() in-process (call()) and prints its outcomes
as one "JSON..." line, which run_script() returns.

Example (the child script):
  from _in_process import call
  out["trained"] = call(train.main, ["--model_dir", d, ...])
  print("JSON" + json.dumps(out))
Example (the test):
  out = run_script(SCRIPT, [base], cwd=base)
"""
import contextlib
import io
import json
import os
import subprocess
import sys

import _cli_util

TESTS = os.path.dirname(os.path.abspath(__file__))


def call(main, argv):
  """main(argv) with stdout and stderr captured.

  Returns:
    {"code": its status (a SystemExit's code too), "stderr": ...,
     "stdout": ...}
  """
  err, std = io.StringIO(), io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
    try:
      code = main(argv)
    except SystemExit as e:
      code = e.code
  return {"code": code, "stderr": err.getvalue(), "stdout": std.getvalue()}


def run_script(script, args, cwd=None, timeout=900, paths=()):
  """Runs `python -c script *args` with this checkout, tests/ and `paths`
  importable; asserts status 0; returns the dict of its last "JSON" line."""
  env = _cli_util.env()
  env["PYTHONPATH"] = os.pathsep.join([_cli_util.REPO, TESTS] + list(paths) +
                                      [env["PYTHONPATH"]])
  proc = subprocess.run([sys.executable, "-c", script] + list(args), cwd=cwd,
                        env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads([l for l in proc.stdout.splitlines()
                     if l.startswith("JSON")][-1][4:])
