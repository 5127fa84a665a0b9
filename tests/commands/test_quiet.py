"""Commands are quiet and the light ones prompt (compat.py, the start-up hook).

* `mtf_th --help`, `mtf_th costs`, `mtf_th sweep --list_paper_tables` and
  the plan of `mtf_th sweep --dry_run` import no TensorFlow or mtf (the
  console script asks the package for a light import).
* Without --verbose, `mtf_th train` shows none of TF's three CUDA-plugin "E"
  lines (NOISE), setuptools' pkg_resources warning or mtf's per-step
  tf.Print (checked on test_training.py's two `mtf_th train` processes: the
  one killed with SIGKILL and its 12-step rerun); with --verbose they are
  back, also when the --verbose is a parent command's (`mtf_th demo
  --verbose` runs train and eval in child processes: one process per mode
  checks both, as `mtf_th train` sets itself up).
"""
import os
import re
import subprocess
import sys

import pytest

import _cli_util

BIN = os.path.dirname(sys.executable)
MTF_TH = _cli_util.MTF_TH
NOISE = _cli_util.NOISE
HEAVY = re.compile(r"\|\s+(tensorflow|mesh_tensorflow|gin\.tf)(\.|$)")

LIGHT_COMMANDS = [
    ["--help"],
    ["costs", "--variant", "talking_heads", "--heads", "24", "--d_k", "32",
     "--d_v", "32", "--d_model", "768", "--length", "512"],
    ["costs", "--paper_table", "t5_heads", "--format", "md"],
    ["sweep", "--list_paper_tables"],
]


@pytest.mark.parametrize("argv", LIGHT_COMMANDS,
                         ids=[" ".join(a[:2]) for a in LIGHT_COMMANDS])
def test_light_commands_import_no_tensorflow(argv, tmp_path):
  proc = subprocess.run([MTF_TH] + argv, cwd=str(tmp_path),
                        env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  heavy = [l for l in proc.stderr.splitlines() if HEAVY.search(l)]
  assert not heavy, heavy[:5]


_FIRST_LINE = r"""
import sys, time
import mtf_talking_heads_startup as startup
start = time.time()


class Out(object):

  def __init__(self, stream):
    self.stream, self.seen = stream, False

  def write(self, text):
    if text and not self.seen:
      self.seen = True
      sys.stderr.write("FIRST %.2f %s\n" % (time.time() - start,
                                            "tensorflow" in sys.modules))
    return self.stream.write(text)

  def flush(self):
    self.stream.flush()


sys.stdout = Out(sys.stdout)
sys.argv = ["mtf_th"] + sys.argv[1:]
sys.exit(startup.mtf_th())
"""


def test_sweep_dry_run_prints_its_plan_before_importing_tensorflow(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-c", _FIRST_LINE, "sweep", "--dry_run",
       "--paper_table", "t5_heads", "--rows", "1,7", "--output_dir",
       str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  (first,) = [l for l in proc.stderr.splitlines() if l.startswith("FIRST ")]
  assert first.split()[2] == "False", first  # no TensorFlow yet
  assert "pre-flight of `mtf_th train` passed for all 2 rows" in proc.stderr


def test_sweep_dry_run_reports_a_row_that_fails_the_pre_flight(tmp_path):
  # 24 heads do not split over model:16 (row 7); 12 heads (row 2) do not either
  proc = subprocess.run(
      [MTF_TH, "sweep", "--dry_run", "--paper_table", "t5_heads", "--rows",
       "7", "--mesh_shape", "model:16", "--layout", "heads:model",
       "--output_dir", str(tmp_path / "out")],
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2
  assert proc.stdout.startswith("# 1 runs")  # the plan is still printed
  errors = [l for l in proc.stderr.splitlines() if "error" in l]
  assert "row 07_talking_heads_24_32" in errors[0]
  assert "'heads' (size 24)" in errors[0] and "model:16" in errors[0]
  assert not (tmp_path / "out").exists()


# What `mtf_th train` without --verbose sets up (common.setup_logging(False),
# before TensorFlow is loaded), then what compat did to mtf's tf.Print and
# TF's and absl's log levels; run with MTF_TH_VERBOSE=0 (quiet) and =1 (a
# verbose parent command, e.g. `mtf_th demo --verbose`, set it).
_MODE = r"""
import os
from mtf_talking_heads.commands import common
common.setup_logging(False)
from mesh_tensorflow.transformer import utils
import tensorflow.compat.v1 as tf
from absl import logging
print("PRINT", type(utils.tf).__name__, utils.tf.Print(1, [2]))
print("LEVELS", tf.logging.get_verbosity(), logging.get_verbosity(),
      os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
"""


@pytest.fixture(scope="module")
def modes():
  """{"raw": `import tensorflow`, "quiet", "verbose": _MODE}: each a
  CompletedProcess."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  out = {"raw": subprocess.run([sys.executable, "-c", "import tensorflow"],
                               capture_output=True, text=True, timeout=300)}
  for mode, value in (("quiet", "0"), ("verbose", "1")):
    out[mode] = subprocess.run(
        [sys.executable, "-c", _MODE], env=dict(env, MTF_TH_VERBOSE=value),
        capture_output=True, text=True, timeout=300)
    assert out[mode].returncode == 0, out[mode].stderr[-3000:]
  return out


def _line(proc, tag):
  (line,) = [l for l in proc.stdout.splitlines() if l.startswith(tag + " ")]
  return line.split()[1:]


def test_verbose_keeps_what_compat_hides(modes):
  quiet, verbose = modes["quiet"], modes["verbose"]
  # tf.Print passes its input through unless --verbose
  assert _line(quiet, "PRINT") == ["_TfWithoutPrint", "1"]
  assert _line(verbose, "PRINT")[0] != "_TfWithoutPrint"
  assert "pkg_resources is deprecated" in verbose.stderr
  assert "pkg_resources is deprecated" not in quiet.stderr
  if NOISE[0] in modes["raw"].stderr:  # this TF build logs the CUDA lines
    assert NOISE[0] in verbose.stderr and NOISE[0] not in quiet.stderr


def test_demo_verbose_reaches_the_train_and_eval_runs(tmp_path, monkeypatch):
  # the demo runs `mtf_th train/eval` through the sweep in child processes:
  # --verbose reaches them as compat's environment variable
  from mtf_talking_heads.commands import demo  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
  seen = []

  class Proc(object):  # the sweep's child process (sweep/run.py)

    def __init__(self, argv, **kwargs):
      seen.append((argv, os.environ.get(compat.VERBOSE_ENV),
                   kwargs.get("env")))

    def wait(self, timeout=None):
      del timeout
      return 1  # the first run fails: the demo stops there

    def poll(self):
      return 1

  monkeypatch.setattr(subprocess, "Popen", Proc)
  for flags, expected in (([], "0"), (["--verbose"], "1")):
    monkeypatch.setenv(compat.VERBOSE_ENV, "0")  # restored after the test
    seen.clear()
    status = demo.main(flags + [
        "--output_dir", str(tmp_path / ("demo" + "".join(flags))), "--scale",
        "tiny", "--heads", "4", "--train_steps", "2", "--eval_every", "1"])
    assert status == 1
    (argv, verbose, env), = seen
    assert argv[3] == "train" and "--verbose" not in argv, argv
    assert verbose == expected and env is None  # children inherit os.environ


def test_train_without_verbose_is_verbose_under_a_verbose_parent(modes):
  quiet, verbose = _line(modes["quiet"], "LEVELS"), _line(modes["verbose"],
                                                         "LEVELS")
  assert quiet == ["40", "-2", "2"]  # ERROR, ERROR, TF's C++ log: errors
  assert verbose[:2] == ["20", "0"]  # INFO, INFO
  assert verbose[2] != "2"  # TF's C++ log not cut to errors
