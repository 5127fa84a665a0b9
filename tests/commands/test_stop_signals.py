"""Stopping a command: Ctrl-C or SIGTERM ends it in one line, status 130 or
143, with nothing half-written (a sweep, its runs, the demo; a command with
no handler of its own).  Runs far too long to finish are stopped mid-run:
`mtf_th sweep` and `mtf_th demo` get SIGINT while their child run is under
way, and a sweep also a terminal's Ctrl-C pressed twice (SIGINT to its
process group) and `kill PID` (SIGTERM) in the background (slow).
`mtf_th train` gets SIGTERM while it builds a 24-layer graph: one line
within 10 s (tests/runtime/test_stops.py: the stop while the main thread
cannot run Python; tests/runtime/test_cluster_faults.py: Ctrl-C with a
frozen server).
"""
import collections
import glob
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

import _cli_util

# Ctrl-C tests: runs far too long to finish (tiny steps).  The sweep is
# interrupted once its child `mtf_th train` has saved checkpoint 0 (mid-run:
# training under way); the demo, which runs the same
# sweep code, as soon as its child run holds the run's lock (TensorFlow
# loaded, the graph being built: ~35 s sooner), which is where a Ctrl-C
# lands when it comes early.
LONG = ["--scale", "tiny", "--train_steps", "100000"]


def _saved_a_checkpoint(model_dir):
  """True once <model_dir>/checkpoint lists checkpoint 0 (written after its
  data and index): training under way."""
  return os.path.exists(os.path.join(model_dir, "checkpoint"))


def _holds_the_lock(model_dir):
  """True once the run's `mtf_th train` holds <model_dir>/mtf_th.lock."""
  return os.path.exists(os.path.join(model_dir, "mtf_th.lock"))


# How a user stops a command (`times` signals 0.2 s apart), and the statuses
# of the command and (in a sweep) of its run, which has a process group of
# its own: the sweep passes the stop on to it, once, as SIGTERM.
Stop = collections.namedtuple("Stop", ["signal", "times", "to_group",
                                       "sigint_ignored", "status",
                                       "run_status"])
STOPS = {
    # `kill -INT PID`
    "kill_INT": Stop(signal.SIGINT, 1, False, False, 130, 143),
    # an impatient terminal's Ctrl-C, twice (to the foreground process group)
    "terminal_ctrl_c_twice": Stop(signal.SIGINT, 2, True, False, 130, 143),
    # `kill PID` of a background command (SIGINT ignored, as a shell without
    # job control, e.g. a script's `mtf_th sweep ... &`, starts it)
    "kill_background": Stop(signal.SIGTERM, 1, False, True, 143, 143),
}


# A command that stops where it has no handler of its own (`mtf_th costs`,
# a sweep's --dry_run): `main` sends SIG (argv[1]) to itself TIMES times.
_SIGNALS_TO_ITSELF = r"""
import os, signal, sys, time
import mtf_talking_heads_startup
mtf_talking_heads_startup.LIGHT_PACKAGE_IMPORT = True  # no TensorFlow
from mtf_talking_heads import cli
sig, times = getattr(signal, sys.argv[1]), int(sys.argv[2])
def main(argv):
  try:
    os.kill(os.getpid(), sig)
    time.sleep(30)
  except KeyboardInterrupt:
    for _ in range(times - 1):  # while stopping
      os.kill(os.getpid(), sig)
      time.sleep(0.1)
      print("still stopping", file=sys.stderr, flush=True)
    raise
cli.main = main
code = cli.console(["costs"])
# exiting: ignored after one signal (Python's exit would restore the
# default action), the default action after two
exiting = signal.SIG_IGN if times == 1 else signal.SIG_DFL
assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == [
    exiting, exiting]
sys.exit(code)
"""


@pytest.mark.parametrize("sig, times, status, stderr", [
    ("SIGINT", 1, 130, "mtf_th costs: interrupted\n"),
    ("SIGTERM", 2, 143, "still stopping\nmtf_th costs: interrupted\n"),
    ("SIGINT", 3, -signal.SIGINT, "still stopping\n"),
])
def test_stop_anywhere_is_one_line_and_a_third_signal_kills(sig, times,
                                                             status, stderr):
  """A stop outside a command's own handler: one line, 130 or 143, no
  traceback; a second signal while stopping is ignored, a third kills."""
  proc = subprocess.run(
      [sys.executable, "-c", _SIGNALS_TO_ITSELF, sig, str(times)],
      cwd=_cli_util.REPO, env=_cli_util.env(), capture_output=True,
      text=True, timeout=120,
      preexec_fn=lambda: _cli_util.set_stop_signals(signal.SIG_DFL))
  assert (proc.returncode, proc.stderr) == (status, stderr)


def _stop_command(argv, cwd, ready, stop="kill_INT"):
  """Starts `mtf_th ARGV` in a new session, stops it as STOPS[stop] says
  once ready(); its stderr."""
  how = STOPS[stop]

  def preexec():
    _cli_util.set_stop_signals(signal.SIG_DFL)
    if how.sigint_ignored:
      signal.signal(signal.SIGINT, signal.SIG_IGN)

  proc = _cli_util.start(argv, cwd=cwd, start_new_session=True,
                         preexec_fn=preexec)
  try:
    _cli_util.wait_until(ready, proc, timeout=900, poll_secs=0.1)
    for i in range(how.times):
      time.sleep(0.2 * bool(i))
      if how.to_group:
        os.killpg(proc.pid, how.signal)
      else:
        proc.send_signal(how.signal)
    _, err = proc.communicate(timeout=300)
  finally:  # a failed wait leaves no sweep (nor, through it, a run) behind
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  assert proc.returncode == how.status, err
  return err


def _assert_nothing_half_written(output_dir, model_dir, mid_run,
                                 stop="kill_INT"):
  """The interrupted run: its own Ctrl-C line, whole CSV rows, every
  checkpoint the `checkpoint` file lists complete (and, `mid_run`, at least
  one), no temporary or lock file, and no run recorded in results.csv."""
  with open(os.path.join(model_dir, "sweep.log")) as f:
    text = f.read()
  # the sweep waited for the run, which stopped with its own line
  assert text.endswith("# interrupted: the command was sent SIGTERM; exit "
                       "status %d\n" % STOPS[stop].run_status), text[-500:]
  assert "Traceback" not in text, text
  assert "mtf_th train: interrupted" in text
  log = os.path.join(model_dir, "train_log.csv")
  if mid_run or os.path.exists(log):
    with open(log) as f:
      text = f.read()
    assert text.endswith("\n")
    assert all(len(l.split(",")) == 4 for l in text.splitlines())
  prefixes = []
  if mid_run or os.path.exists(os.path.join(model_dir, "checkpoint")):
    with open(os.path.join(model_dir, "checkpoint")) as f:
      prefixes = [l.split('"')[1] for l in f.read().splitlines()
                  if l.startswith("all_model_checkpoint_paths")]
  assert prefixes or not mid_run
  for prefix in prefixes:
    path = os.path.join(model_dir, prefix)
    assert os.path.exists(path + ".index"), path
    shards = glob.glob(path + ".data-*-of-*")
    assert shards and len(shards) == int(shards[0].rsplit("-of-", 1)[1])
  for root, dirs, files in os.walk(output_dir):
    for name in dirs + files:
      assert "_temp" not in name and not name.endswith(".tmp"), name
      assert name != "mtf_th.lock", os.path.join(root, name)
  results = os.path.join(output_dir, "results.csv")
  if os.path.exists(results):
    with open(results) as f:
      assert len(f.read().splitlines()) <= 1  # the header at most


@pytest.mark.slow
@pytest.mark.parametrize("stop", sorted(STOPS))
def test_stopped_sweep_says_one_line_and_130_or_143(tmp_path, stop):
  out_dir = str(tmp_path / "sweep")
  argv = ["sweep", "--paper_table", "lm_heads", "--rows", "5"] + LONG + [
      "--eval_steps", "50000,100000", "--output_dir", out_dir]
  model_dir = os.path.join(out_dir, "runs", "05_talking_heads_4_32", "seed_1")
  err = _stop_command(argv, str(tmp_path),
                      lambda: _saved_a_checkpoint(model_dir), stop)
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith("mtf_th sweep: interrupted; 0 of 1 runs are "
                             "recorded in ")
  assert lines[0].endswith("resume with: mtf_th " + " ".join(argv))
  _assert_nothing_half_written(out_dir, model_dir, mid_run=True, stop=stop)


@pytest.mark.slow
def test_ctrl_c_in_demo_is_one_line_and_130(tmp_path):
  out_dir = str(tmp_path / "demo")
  argv = ["demo"] + LONG + ["--eval_every", "50000", "--output_dir", out_dir]
  model_dir = os.path.join(out_dir, "runs", "02_multi_head_8_16", "seed_1")
  err = _stop_command(argv, str(tmp_path), lambda: _holds_the_lock(model_dir))
  *progress, last = err.splitlines()  # the demo's progress, then Ctrl-C's
  assert progress[0].startswith("[demo] "), err
  assert not any("Traceback" in l or "error" in l for l in progress), err
  assert last.startswith("mtf_th demo: interrupted; 0 of 2 runs finished")
  assert last.endswith("resume with: mtf_th " + " ".join(argv))
  _assert_nothing_half_written(out_dir, model_dir, mid_run=False)


def test_sigterm_while_a_huge_graph_is_built_is_one_line_within_10_s(
    tmp_path):
  """SIGTERM 3 s after `mtf_th train` took its lock: it lands in the
  building of a 24-layer graph (minutes here), where TF's context managers
  turn the KeyboardInterrupt into another error (variable_scope's
  "Improper nesting"), or in TensorFlow's C++ (the session's creation),
  where Python's handler cannot run (runtime/stops.py ends the process):
  either way the stop's one line, status 143, within 10 s, lock released."""
  model_dir = str(tmp_path / "run")
  argv = ["train", "--model_dir", model_dir, "--train_steps", "2",
          "--gin_file=experiments/t5_heads/06_talking_heads_12_64.gin",
          "--gin_file=models/t5_tiny.gin", "--gin_param=num_layers = 24"]
  proc = _cli_util.start(argv, preexec_fn=lambda: _cli_util.set_stop_signals(
      signal.SIG_DFL))
  try:
    _cli_util.wait_until(lambda: _holds_the_lock(model_dir), proc,
                         timeout=600, poll_secs=0.1)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    start = time.time()
    _, err = proc.communicate(timeout=120)
    seconds = time.time() - start
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 143, err[-3000:]
  assert seconds <= 10, seconds
  assert "Traceback" not in err, err[-3000:]
  line, = [l for l in err.splitlines() if l.startswith("mtf_th ")]
  assert line == ("mtf_th train: interrupted before the first checkpoint of "
                  "%s; rerun to start again: mtf_th %s"
                  % (model_dir, shlex.join(argv)))
  assert not os.path.exists(os.path.join(model_dir, "mtf_th.lock"))
