"""What real clusters do to a run: frozen and killed tasks (issue 34).

Two `mtf_th server` tasks (one CPU device each) are started once for the
module on free ports and stopped by PID at the end.  The module fixture
`faults` trains the tiny talking-heads T5 on model:2 over them twice:

  1. task 1 gets SIGSTOP mid-run (a hung host, a paused VM: its sockets
     stay open, a TCP connect still succeeds);
  2. after SIGCONT the printed command resumes, and task 0 gets SIGSTOP the
     moment the resumed run's second checkpoint save begins
     (tests/_freeze_at_save.py), so the save waits inside TensorFlow.

Each run ends within 60 s with one line naming the task, the last
checkpoint and the exact resume command, status 1, its lock released and
only complete checkpoints listed; the resumed run's losses equal the
uninterrupted run's (1e-5 relative), on the servers that were frozen and
continued.  Then `mtf_th eval --checkpoint_steps all` on the same servers:
task 1 frozen after the first checkpoint's score ends it within 60 s
keeping that score; rerun, it scores that checkpoint again to the same
number, and Ctrl-C with task 1 frozen ends it within 10 s while it waits
inside TensorFlow; on one server of two devices killed (SIGKILL) after the
first score, it ends within 60 s naming task 0.  `mtf_th decode` with
task 1 frozen 1 s into its watched run ends within 60 s in one line, and
decodes every input once continued.  Last, the servers (stopped and continued several times
by then) each end on their first SIGTERM, status 0, within 10 s.  The
probes' bound (training/liveness.py) is checked without servers.
"""
import collections
import glob
import os
import signal
import subprocess
import time

import pytest
import tensorflow.compat.v1 as tf

import _cli_util
from _cli_util import MTF_TH, REPO
from mtf_talking_heads.runtime import cluster
from mtf_talking_heads.runtime import run_files

T5 = ["--gin_file=experiments/t5_heads/06_talking_heads_12_64.gin",
      "--gin_file=models/t5_tiny.gin",
      "--gin_param=mesh_shape = 'model:2'",
      "--gin_param=layout = 'heads:model,d_ff:model,vocab:model'",
      "--gin_param=heads_k = 4", "--gin_param=heads = 4",
      "--gin_param=heads_v = 4", "--gin_param=d_k = 16",
      "--gin_param=d_v = 16", "--gin_param=num_layers = 1",
      "--gin_param=save_checkpoints_steps = 4"]
RTOL = 1e-5
FROZEN = ("it did not run a one-element op within 15 s, 2 times in a row: "
          "stopped, hung or cut off from task 0")

# How one run ended: exit status, seconds from the fault (SIGSTOP, or the
# signal that stopped it) to its exit, stderr.
Ended = collections.namedtuple("Ended", ["code", "seconds", "stderr"])


@pytest.fixture(scope="module")
def servers():
  with cluster.LocalServers(2, devices_per_task=1, mtf_th=[MTF_TH]) as s:
    try:
      yield s
    finally:  # a failed test may leave one stopped: SIGTERM waits for it
      for process in s.processes:
        if process.poll() is None:
          process.send_signal(signal.SIGCONT)


def _start(argv, extra_env=None):
  """`mtf_th ARGV` as a terminal starts it (SIGINT and SIGTERM default)."""
  return _cli_util.start(argv, env=_cli_util.env(extra_env),
                         preexec_fn=lambda: _cli_util.set_stop_signals(
                             signal.SIG_DFL))


def _stopped(pid):
  """True once process `pid` is stopped (SIGSTOP)."""
  with open("/proc/%d/stat" % pid) as f:
    return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _until_end(proc, since, timeout=300):
  _, err = proc.communicate(timeout=timeout)
  return Ended(proc.returncode, time.time() - since, err)


def _freeze(servers, task, proc, then_signal=None):
  """SIGSTOPs `task` while `proc` runs, optionally sends `then_signal` to
  proc 2 s later, waits for proc's end, SIGCONTs the task."""
  server = servers.processes[task]
  server.send_signal(signal.SIGSTOP)
  since = time.time()
  try:
    if then_signal is not None:
      time.sleep(2)  # the run now waits inside TensorFlow on the task
      proc.send_signal(then_signal)
      since = time.time()
    return _until_end(proc, since)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    server.send_signal(signal.SIGCONT)


def _losses(model_dir):
  return {r["step"]: r["loss"] for r in run_files.scan_train_log(model_dir)}


def _forget_after(model_dir, step):
  """Drops train_log.csv's rows after `step`, so a resumed run logs them
  again (it writes no row for a step already in the file)."""
  path = os.path.join(model_dir, run_files.TRAIN_LOG)
  with open(path) as f:
    kept = [l for l in f.read().splitlines()
            if not l[:1].isdigit() or int(l.split(",")[0]) <= step]
  with open(path, "w") as f:
    f.write("\n".join(kept) + "\n")


def _listed(model_dir):
  """The steps <model_dir>/checkpoint lists, each checked complete (its
  index and every data shard there)."""
  state = run_files.checkpoint_state(model_dir)
  steps = []
  for prefix in state.paths:
    shards = glob.glob(prefix + ".data-*-of-*")
    assert os.path.exists(prefix + ".index") and shards, prefix
    assert len(shards) == int(shards[0].rsplit("-of-", 1)[1]), prefix
    steps.append(run_files.checkpoint_step(prefix))
  assert run_files.checkpoint_step(state.latest) == max(steps)
  return steps


def _one_line(stderr):
  assert "Traceback" not in stderr, stderr[-3000:]
  line, = [l for l in stderr.splitlines() if l.startswith("mtf_th ")]
  return line


@pytest.fixture(scope="module")
def faults(servers, tmp_path_factory):
  """The two faulted training runs of the module docstring."""
  model_dir = str(tmp_path_factory.mktemp("faults") / "run")
  argv = ["train", "--model_dir", model_dir, "--train_steps", "400"] + T5 + [
      "--cluster", servers.spec, "--devices_per_task", "1"]
  out = {"model_dir": model_dir, "argv": argv}
  # 1. task 1 frozen two steps past checkpoint 4 (or a later one)

  def past_a_checkpoint():
    checkpoint = run_files.latest_step(model_dir) or 0
    return checkpoint >= 4 and max(_losses(model_dir)) >= checkpoint + 2

  proc = _start(argv)
  _cli_util.wait_until(past_a_checkpoint, proc, timeout=900, poll_secs=0.05)
  out["first"] = _freeze(servers, 1, proc)
  out["step"] = run_files.latest_step(model_dir)
  out["uninterrupted"] = _losses(model_dir)
  out["listed_after_first"] = _listed(model_dir)
  _forget_after(model_dir, out["step"])
  # 2. resumed; task 0 frozen as the second save begins
  task_0 = servers.processes[0]
  resume = argv + ["--module_import", "_freeze_at_save"]
  proc = _start(resume, {
      "MTF_TH_TEST_FREEZE": "%d:2" % task_0.pid,
      "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])})
  try:
    _cli_util.wait_until(lambda: _stopped(task_0.pid), proc, timeout=900,
                         poll_secs=0.05)
    out["second"] = _until_end(proc, time.time())
  finally:
    task_0.send_signal(signal.SIGCONT)
  out["resume"] = resume
  out["resumed"] = _losses(model_dir)
  out["listed_after_second"] = _listed(model_dir)
  return out


def test_task_1_frozen_mid_run_ends_the_run_in_one_line(faults, servers):
  first, model_dir = faults["first"], faults["model_dir"]
  assert first.code == 1, first.stderr[-3000:]
  assert first.seconds <= 60, first.seconds
  assert _one_line(first.stderr) == (
      "mtf_th train: error: lost task 1 (%s) of the cluster (%s); not "
      "retried; the last checkpoint of %s is step %d; restart the server "
      "and resume with: %s" % (
          servers.addresses[1], FROZEN, model_dir, faults["step"],
          cluster.command_line("mtf_th train", faults["argv"][1:])))
  assert faults["step"] >= 4 and faults["step"] in faults[
      "listed_after_first"]
  assert not os.path.exists(os.path.join(model_dir, "mtf_th.lock"))


def test_task_0_frozen_during_a_checkpoint_save(faults, servers):
  """The save that waited on task 0 is not listed; the one before is the
  last checkpoint, and the line names task 0."""
  second, model_dir, step = faults["second"], faults["model_dir"], faults[
      "step"]
  assert second.code == 1, second.stderr[-3000:]
  assert second.seconds <= 60, second.seconds
  assert second.stderr.count("starting at step %d" % step) == 1
  assert _one_line(second.stderr) == (
      "mtf_th train: error: lost task 0 (%s) of the cluster (%s); not "
      "retried; the last checkpoint of %s is step %d; restart the server "
      "and resume with: %s" % (
          servers.addresses[0], FROZEN, model_dir, step,
          cluster.command_line("mtf_th train", faults["resume"][1:])))
  assert max(faults["listed_after_second"]) == step
  assert not os.path.exists(os.path.join(model_dir, "mtf_th.lock"))


def test_resumed_run_equals_the_uninterrupted_one(faults):
  """After SIGCONT of task 1, the resumed run on the same servers logs the
  uninterrupted run's losses; every checkpoint on disk (listed or not)
  reads whole."""
  step, before, after = faults["step"], faults["uninterrupted"], faults[
      "resumed"]
  compared = sorted(s for s in before if s > step and s in after)
  assert compared[:2] == [step + 1, step + 2], (step, before, after)
  for s in compared:
    assert abs(after[s] - before[s]) <= RTOL * abs(before[s]), (
        s, after[s], before[s])
  model_dir = faults["model_dir"]
  for s in run_files.checkpoint_steps(model_dir):
    reader = tf.train.load_checkpoint(os.path.join(model_dir,
                                                   "model.ckpt-%d" % s))
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)


def _eval(faults, servers):
  return _start(["eval", "--model_dir", faults["model_dir"],
                 "--checkpoint_steps", "all", "--cluster", servers.spec,
                 "--devices_per_task", "1"])


def _scores(model_dir):
  return {r["step"]: r["ln_ppl"] for r in run_files.read_eval_results(
      model_dir)}


def test_eval_keeps_its_scores_when_a_task_freezes_and_ctrl_c_stops_it(
    faults, servers):
  model_dir = faults["model_dir"]
  results = os.path.join(model_dir, run_files.EVAL_RESULTS)
  assert run_files.checkpoint_steps(model_dir)[:2] == [0, 4]
  # task 1 frozen while checkpoint 4 is scored: one line within 60 s
  proc = _eval(faults, servers)
  _cli_util.wait_until(lambda: os.path.exists(results), proc, timeout=900,
                       poll_secs=0.05)
  frozen = _freeze(servers, 1, proc)
  assert frozen.code == 1, frozen.stderr[-3000:]
  assert frozen.seconds <= 60, frozen.seconds
  argv = ["--model_dir", model_dir, "--checkpoint_steps", "all",
          "--cluster", servers.spec, "--devices_per_task", "1"]
  assert _one_line(frozen.stderr) == (
      "mtf_th eval: error: lost task 1 (%s) of the cluster (%s); not "
      "retried; eval_results.csv of %s holds checkpoint 0; restart the "
      "server and rerun with: %s" % (servers.addresses[1], FROZEN,
                                     model_dir,
                                     cluster.command_line("mtf_th eval",
                                                          argv)))
  kept = _scores(model_dir)
  assert list(kept) == [0]
  assert "[eval] checkpoint 0: ln(PPL) %.4f over" % kept[0] in frozen.stderr
  # rerun after SIGCONT: checkpoint 0 scores the same; Ctrl-C with task 1
  # frozen (the run waits inside TensorFlow) ends it within 10 s
  os.remove(results)
  proc = _eval(faults, servers)
  _cli_util.wait_until(lambda: os.path.exists(results), proc, timeout=900,
                       poll_secs=0.05)
  stopped = _freeze(servers, 1, proc, then_signal=signal.SIGINT)
  assert stopped.code == 130, stopped.stderr[-3000:]
  assert stopped.seconds <= 10, stopped.seconds
  assert _one_line(stopped.stderr) == "mtf_th eval: interrupted"
  assert _scores(model_dir) == kept


def test_eval_whose_only_server_is_killed(faults):
  """One server with both devices (task 0: it holds the session); SIGKILL
  once checkpoint 0 is scored: one line within 60 s naming task 0, the
  score kept (this hung before, deaf to SIGTERM)."""
  model_dir = faults["model_dir"]
  results = os.path.join(model_dir, run_files.EVAL_RESULTS)
  os.remove(results)
  with cluster.LocalServers(1, devices_per_task=2, mtf_th=[MTF_TH]) as one:
    argv = ["--model_dir", model_dir, "--checkpoint_steps", "all",
            "--cluster", one.spec, "--devices_per_task", "2"]
    proc = _start(["eval"] + argv)
    _cli_util.wait_until(lambda: os.path.exists(results), proc, timeout=900,
                         poll_secs=0.05)
    one.kill(0)
    ended = _until_end(proc, time.time())
  assert ended.code == 1, ended.stderr[-3000:]
  assert ended.seconds <= 60, ended.seconds
  line = _one_line(ended.stderr)
  assert line.startswith("mtf_th eval: error: lost task 0 (%s) of the "
                         "cluster (" % one.addresses[0]), line
  assert line.endswith(
      "; not retried; eval_results.csv of %s holds checkpoint 0; restart the "
      "server and rerun with: %s" % (model_dir, cluster.command_line(
          "mtf_th eval", argv))), line
  assert list(_scores(model_dir)) == [0]


def test_decode_ends_in_one_line_when_a_task_freezes_then_decodes(
    faults, servers):
  """Task 1 frozen 1 s into decode's watched run (past the cluster's
  pre-flight: tests/_freeze_at_save.py): one line within 60 s naming task
  1 and the rerun command; after SIGCONT the rerun decodes every input."""
  model_dir = faults["model_dir"]
  argv = ["--model_dir", model_dir, "--checkpoint_step", "4",
          "--input", "The module defines", "--input", "A cluster of two",
          "--cluster", servers.spec, "--devices_per_task", "1"]
  task_1 = servers.processes[1]
  proc = _start(["decode"] + argv + ["--module_import", "_freeze_at_save"], {
      "MTF_TH_TEST_FREEZE": "%d:watch:1" % task_1.pid,
      "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "tests")])})
  try:
    _cli_util.wait_until(lambda: _stopped(task_1.pid), proc, timeout=900,
                         poll_secs=0.05)
    frozen = _until_end(proc, time.time())
  finally:
    task_1.send_signal(signal.SIGCONT)
  assert frozen.code == 1, frozen.stderr[-3000:]
  assert frozen.seconds <= 60, frozen.seconds
  line = _one_line(frozen.stderr)
  assert line.startswith("mtf_th decode: error: lost task 1 (%s) of the "
                         "cluster (" % servers.addresses[1]), line
  assert line.endswith("; not retried; restart the server and rerun with: "
                       + cluster.command_line("mtf_th decode", argv + [
                           "--module_import", "_freeze_at_save"])), line
  rerun = subprocess.run([MTF_TH, "decode"] + argv, cwd=REPO,
                         env=_cli_util.env(), capture_output=True, text=True,
                         timeout=900)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  inputs = [l.split("\t")[0] for l in rerun.stdout.splitlines()]
  assert inputs == ["The module defines", "A cluster of two"]


def test_servers_end_on_their_first_sigterm_after_sigstop(servers):
  """The last test with the servers: each, stopped and continued once more,
  ends on one SIGTERM with its line and status 0 within 10 s."""
  for task, process in enumerate(servers.processes):
    process.send_signal(signal.SIGSTOP)
    time.sleep(0.2)
    process.send_signal(signal.SIGCONT)
    process.send_signal(signal.SIGTERM)
    start = time.time()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass
    seconds = time.time() - start
    assert process.returncode == 0 and seconds <= 10, (task, seconds)
    servers.logs[task].seek(0)
    assert servers.logs[task].read().endswith(
        "[server] task %d stopped\n" % task)


def test_probe_bound_follows_the_median_step():
  """15 s, or 3 x the median of the recent training steps if longer (the
  first step, which sets the graph up on the servers, does not count)."""
  from mtf_talking_heads.training import liveness  # pylint: disable=g-import-not-at-top
  watchdog = liveness.Watchdog(cluster.Cluster(["h0:1", "h1:1"]), None)
  assert watchdog.bound_secs() == 15
  for seconds in [300, 2, 2, 2]:  # a slow first step
    watchdog.note_step(seconds)
  assert watchdog.bound_secs() == 15
  for seconds in [8] * 5:
    watchdog.note_step(seconds)
  assert watchdog.bound_secs() == 24
