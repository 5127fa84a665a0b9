"""The mesh on localhost `mtf_th server` processes (issue 16, docs/cluster.md).

Two servers with 2 CPU devices each are started once for the module (free
ports) and killed by PID at the end; every test reuses them, which isolated
session state makes safe.  (a) a talking-heads layer split over the servers
by heads, heads_k, heads_v and batch (and batch x heads over all 4
devices): loss and every gradient equal one in-process device's (1e-5
relative), a trace has ops on both tasks, and a second graph with other
shapes and the same variable names runs on the same servers.  (b) `mtf_th
train --cluster` on model:2 reproduces the local run's losses and its trace
has ops on both tasks; (d) when its task 1 is killed it ends with one line
(the task, the checkpoint, the resume command) within 60 s, and after the
restart the resumed run equals the uninterrupted one; (e) an unreachable
task (before TensorFlow is imported) and a mesh of the wrong size (in the
pre-flight) are refused before any graph.  The device naming for GPU hosts is checked
without GPUs.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import _equiv_util as eu
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
from mtf_talking_heads.runtime import cluster
from mtf_talking_heads.training import cluster as training_cluster
from _cli_util import MTF_TH, REPO

T5 = ["--gin_file=experiments/t5_heads/06_talking_heads_12_64.gin",
      "--gin_file=models/t5_tiny.gin",
      "--gin_param=mesh_shape = 'model:2'",
      "--gin_param=layout = 'heads:model,d_ff:model,vocab:model'"]
HEADS = ["--gin_param=heads_k = 4", "--gin_param=heads = 4",
         "--gin_param=heads_v = 4", "--gin_param=d_k = 16",
         "--gin_param=d_v = 16"]
OTHER_HEADS = ["--gin_param=heads_k = 2", "--gin_param=heads = 4",
               "--gin_param=heads_v = 2", "--gin_param=d_k = 8",
               "--gin_param=d_v = 8"]
RTOL = 1e-5


@pytest.fixture(scope="module")
def servers():
  with cluster.LocalServers(2, devices_per_task=2, mtf_th=[MTF_TH]) as s:
    yield s
  # SIGTERM (by PID) ends every server with status 0
  assert [p.returncode for p in s.processes] == [0, 0]


def _layer():
  layer = layers.TalkingHeadsAttention(heads_k=4, heads=8, heads_v=4, d_k=2,
                                       d_v=3)
  layer.set_name("attention")
  return layer


def _harness(mesh_shape="", layout="", devices=None, servers=None,
             d_model=16):
  kwargs = {}
  if servers is not None:
    kwargs = dict(devices=devices, target="grpc://" + servers.addresses[0],
                  config=training_cluster.session_config())
  return harness.Harness([_layer()], d_model=d_model, batch=4, length=8,
                         mesh_shape=mesh_shape, layout=layout, **kwargs)


def _outputs(h):
  out = h.fetch(["loss"] + ["grad:" + n for n in sorted(h.grads)])
  return {k: np.asarray(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def one_device():
  h = _harness()
  try:
    return _outputs(h)
  finally:
    h.close()


TWO_TASKS = cluster.device_names(2, 1)  # CPU:0 of task 0 and of task 1


@pytest.mark.parametrize("mesh_shape,layout,devices", [
    ("model:2", "heads:model", TWO_TASKS),
    ("model:2", "heads_k:model", TWO_TASKS),
    ("model:2", "heads_v:model", TWO_TASKS),
    ("batch:2", "batch:batch", TWO_TASKS),
    ("batch:2;model:2", "batch:batch,heads:model",
     cluster.device_names(2, 2)),
], ids=["heads", "heads_k", "heads_v", "batch", "batch2xheads2_4devices"])
def test_layer_over_servers_equals_one_device(servers, one_device, mesh_shape,
                                              layout, devices):
  h = _harness(mesh_shape, layout, devices, servers)
  try:
    got = _outputs(h)
    metadata = tf.RunMetadata()
    h.session.run(h.outputs["loss"], options=tf.RunOptions(
        trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
  finally:
    h.close()
  assert sorted(got) == sorted(one_device)
  for name, value in got.items():
    assert eu.max_rel_err(value, one_device[name]) < RTOL, name
  traced = {d.device for d in metadata.step_stats.dev_stats
            if d.node_stats}
  assert set(devices) <= traced  # every slot's device ran ops


def test_second_graph_with_other_shapes_on_the_same_servers(servers):
  """Same variable names, other shapes: isolated sessions do not clash."""
  local = _harness(d_model=24)
  remote = _harness("model:2", "heads:model", TWO_TASKS, servers, d_model=24)
  try:
    expected, got = _outputs(local), _outputs(remote)
  finally:
    local.close()
    remote.close()
  for name, value in got.items():
    assert eu.max_rel_err(value, expected[name]) < RTOL, name


def test_gpu_device_names():
  assert cluster.device_names(2, 2, "GPU") == [
      "/job:worker/replica:0/task:0/device:GPU:0",
      "/job:worker/replica:0/task:0/device:GPU:1",
      "/job:worker/replica:0/task:1/device:GPU:0",
      "/job:worker/replica:0/task:1/device:GPU:1"]
  assert [cluster.slot_task(s, 2) for s in range(6)] == [0, 0, 1, 1, 2, 2]
  active = cluster.Cluster(["h0:1", "h1:1"], 2)
  names = ["/job:worker/replica:0/task:%d/device:%s:%d" % (t, d, i)
           for t in range(2) for d, n in (("CPU", 2), ("GPU", 2))
           for i in range(n)]
  device_type = training_cluster._device_type  # pylint: disable=protected-access
  assert device_type(active, names) == "GPU"
  assert device_type(active, [n for n in names if "GPU" not in n]) == "CPU"
  with pytest.raises(ValueError, match=r"task 1 \(h1:1\) has 1 CPU device "
                     "but --devices_per_task is 2"):
    device_type(active, [n for n in names if "GPU" not in n][:-1])


def _train(model_dir, servers, extra, steps):
  cmd = [MTF_TH, "train", "--model_dir", model_dir, "--train_steps",
         str(steps)] + T5 + extra
  if servers is not None:
    cmd += ["--cluster", servers.spec, "--devices_per_task", "1"]
  return cmd


def _losses(model_dir):
  with open(os.path.join(model_dir, "train_log.csv")) as f:
    rows = [l.split(",") for l in f.read().splitlines()[1:]]
  return {int(r[0]): float(r[1]) for r in rows}


def _error_lines(stderr):
  return [l for l in stderr.splitlines() if l.startswith("mtf_th ")]


def _check_trace(model_dir):
  """The run's Chrome traces show ops on both tasks."""
  timelines = glob.glob(os.path.join(model_dir, "trace", "timeline-*.json"))
  assert timelines
  with open(sorted(timelines)[-1]) as f:
    events = json.load(f)["traceEvents"]
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  busy = {names[e["pid"]] for e in events if e.get("ph") == "X"}
  for task in (0, 1):
    assert any("/job:worker/replica:0/task:%d/" % task in n for n in busy), (
        task, busy)


@pytest.mark.slow
def _wait_until_task_0_lists_every_device(servers, timeout=120):
  """After a restart, task 0's channel to the restarted task may still be
  in gRPC's reconnect backoff, and the resumed run's pre-flight (a 20 s
  deadline) once timed out there; the test waits the restart out."""
  deadline = time.time() + timeout
  config = tf.ConfigProto(operation_timeout_in_ms=5000)
  while True:
    try:
      with tf.Graph().as_default(), tf.Session(
          "grpc://" + servers.addresses[0], config=config) as session:
        if len(session.list_devices()) >= 2 * 2:  # 2 tasks x 2 CPUs
          return
    except tf.errors.OpError:
      pass
    assert time.time() < deadline, "task 0 did not list the restarted task"
    time.sleep(1)


def _checkpoint_step(model_dir):
  """The step of model_dir's latest checkpoint (0: none yet)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  return int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0


def test_train_equals_local_then_lost_worker_then_resume(servers, tmp_path):
  """(b) `mtf_th train --cluster` == the local run, trace on both tasks;
  (d) task 1 killed mid-run: one line within 60 s; resumed after the
  restart == the uninterrupted run.  After the layer tests' graphs, so the
  servers have run other shapes before ((c), isolated sessions)."""
  model_dir, local_dir = str(tmp_path / "remote"), str(tmp_path / "local")
  extra = HEADS + ["--gin_param=save_checkpoints_steps = 2",
                   "--gin_param=num_layers = 1"]  # one block per stack
  trace = ["--gin_param=mtf_th.train_model.trace_every_steps = 1"]
  proc = subprocess.Popen(_train(model_dir, servers, extra + trace, 400),
                          cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  log = os.path.join(model_dir, "train_log.csv")
  deadline = time.time() + 900
  while time.time() < deadline and proc.poll() is None:
    # killed once a logged step lies past the last checkpoint, so that the
    # resume below has steps of the uninterrupted run to compare (under
    # load the kill once landed right on a checkpoint: nothing to compare)
    if os.path.exists(log) and len(_losses(model_dir)) >= 5 and max(
        _losses(model_dir)) > _checkpoint_step(model_dir):
      break
    time.sleep(0.1)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  servers.kill(1)
  killed_at = time.time()
  _, err = proc.communicate(timeout=120)
  seconds = time.time() - killed_at
  # (b) the same losses as one process (this one: training.train, what
  # `mtf_th train` runs, on this process's logical CPU devices)
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  flags = T5 + extra
  training.train(local_dir, [f.split("=", 1)[1] for f in flags
                             if f.startswith("--gin_file=")],
                 [f.split("=", 1)[1] for f in flags
                  if f.startswith("--gin_param=")], train_steps=3)
  remote, expected = _losses(model_dir), _losses(local_dir)
  assert sorted(expected) == [1, 2, 3]
  for step in expected:
    assert abs(remote[step] - expected[step]) <= RTOL * abs(expected[step])
  _check_trace(model_dir)
  # (d) one line, status 1, under 60 s, no retry
  assert proc.returncode == 1, err[-3000:]
  assert seconds < 60, seconds
  assert "Traceback" not in err and err.count("starting at step") == 1
  line, = _error_lines(err)
  step = _checkpoint_step(model_dir)
  assert step >= 2
  for word in ("mtf_th train: error: lost task 1 (%s)" % servers.addresses[1],
               "not retried", "the last checkpoint of %s is step %d"
               % (model_dir, step),
               "resume with: mtf_th train --model_dir %s" % model_dir):
    assert word in line, (word, line)
  # resume: the uninterrupted run's losses of the steps after the checkpoint
  uninterrupted = _losses(model_dir)
  last = max(uninterrupted)
  assert last > step
  with open(log) as f:  # forget them, so the resumed run logs them again
    kept = [l for l in f.read().splitlines()
            if not l[:1].isdigit() or int(l.split(",")[0]) <= step]
  with open(log, "w") as f:
    f.write("\n".join(kept) + "\n")
  servers.start(1)
  _wait_until_task_0_lists_every_device(servers)
  resumed = subprocess.run(_train(model_dir, servers, extra, last), cwd=REPO,
                           capture_output=True, text=True, timeout=900)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "starting at step %d" % step in resumed.stderr
  again = _losses(model_dir)
  for s in range(step + 1, last + 1):
    assert abs(again[s] - uninterrupted[s]) <= RTOL * abs(uninterrupted[s]), (
        s, again[s], uninterrupted[s])


def test_unreachable_task_refused_before_tensorflow(tmp_path):
  port, = cluster.free_ports(1)
  start = time.time()
  proc = subprocess.run(
      [MTF_TH, "train", "--model_dir", str(tmp_path / "m"), "--cluster",
       "localhost:%d,localhost:%d" % (port, port + 1)] + T5,
      cwd=REPO, capture_output=True, text=True, timeout=60)
  assert time.time() - start < 30
  assert proc.returncode == 2
  line, = _error_lines(proc.stderr)
  assert line.startswith("mtf_th train: error: task 0 of --cluster "
                         "(localhost:%d) does not answer" % port), line
  assert "loading TensorFlow" not in proc.stderr
  assert not os.path.exists(str(tmp_path / "m"))


@pytest.mark.parametrize("command,flags,words", [
    ("evaluate", ["--cluster", "localhost"],
     "mtf_th eval: error: --cluster entry 0 ('localhost') is not HOST:PORT"),
    ("evaluate", ["--cluster", "a:1,a:1"],
     "mtf_th eval: error: --cluster lists a:1 twice"),
    ("evaluate", ["--devices_per_task", "2"],
     "mtf_th eval: error: --devices_per_task goes with --cluster"),
    ("evaluate", ["--cluster", "a:1", "--devices_per_task", "0"],
     "mtf_th eval: error: argument --devices_per_task: the value must be a "
     "positive integer, got 0"),
    ("sweep", ["--paper_table", "t5_heads", "--output_dir", "/nonexistent",
               "--cluster", "a:1", "--devices_per_task", "0"],
     "mtf_th sweep: error: argument --devices_per_task: the value must be a "
     "positive integer, got 0"),
    ("evaluate", ["--cluster", "a:1", "--tpu", "grpc://10.0.0.2:8470"],
     "mtf_th eval: error: --cluster and --tpu both say where to run: give "
     "one of them"),
], ids=["not_host_port", "duplicate", "k_without_cluster", "k_0",
        "sweep_k_0", "with_tpu"])
def test_bad_cluster_flags_refused(command, flags, words, capsys):
  """Refused in one line, status 2, before anything is probed or built."""
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module("mtf_talking_heads.commands." + command)
  argv = (["--model_dir", "/nonexistent"] if command == "evaluate" else [])
  assert module.main(argv + flags) == 2
  line, = _error_lines(capsys.readouterr().err)
  assert line.startswith(words), line
  assert cluster.active() is None


def test_no_memory_refusal_about_the_client_on_a_cluster():
  """train's RAM refusal measures this host's memory: on a cluster the mesh
  is on the servers, so it is not applied (tests/estimate/test_plan.py has the same
  arguments refused without --cluster)."""
  import argparse  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.commands import common  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(gin_file=["models/t5_base.gin"],
                            gin_param=["batch_size = 65536"], tpu=None,
                            cluster="h0:2222,h1:2222")
  common.memory_check(args, training)  # no error
  args.cluster = None
  with pytest.raises(training.ConfigError, match="predicted"):
    common.memory_check(args, training)


def test_mesh_size_mismatch_refused_in_the_preflight():
  """training.preflight (before any graph) refuses a mesh of another size."""
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  training.parse_gin([f.split("=", 1)[1] for f in T5 if "gin_file" in f],
                     [p.split("=", 1)[1] for p in T5 + HEADS
                      if "gin_param" in p])
  cluster.activate(cluster.Cluster(["localhost:1", "localhost:2"], 2))
  try:
    with pytest.raises(training.ConfigError) as e:
      training.preflight()
  finally:
    cluster.activate(None)
  assert str(e.value) == (
      "mesh_shape 'model:2' has 2 slots but the cluster has 4 devices (2 "
      "tasks x --devices_per_task 2): they must be equal; change mesh_shape "
      "or --cluster/--devices_per_task")


def test_local_servers_die_with_the_process_that_started_them():
  """LocalServers' children get SIGTERM when their parent is SIGKILLed (a
  test killed by a timeout leaves no server listening): checked on `sleep`,
  started the way LocalServers starts a server."""
  code = ("import subprocess, sys\n"
          "from mtf_talking_heads.runtime import cluster\n"
          "p = subprocess.Popen(['sleep', '600'],"
          " preexec_fn=cluster.die_with_parent)\n"
          "print(p.pid, flush=True)\n"
          "p.wait()\n")
  parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  child = int(parent.stdout.readline())
  os.kill(parent.pid, signal.SIGKILL)
  parent.wait()
  deadline = time.time() + 10
  while time.time() < deadline:
    try:
      with open("/proc/%d/stat" % child) as f:
        if f.read().split(")")[-1].split()[0] == "Z":
          return  # dead, not yet reaped by whoever adopted it
    except FileNotFoundError:
      return
    time.sleep(0.05)
  os.kill(child, signal.SIGKILL)
  raise AssertionError("sleep outlived its killed parent")


@pytest.mark.parametrize("error, words", [
    (tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded"),
     "did not list the cluster's devices (timeout 20 s, or unreachable: "
     "Deadline Exceeded)"),
    (tf.errors.UnavailableError(None, None, "Socket closed"),
     "is down, still starting, or was restarted moments ago"),
    (tf.errors.UnimplementedError(None, None, "unknown service"),
     "answers but is not an `mtf_th server` of this cluster (unknown service)"),
])
def test_preflight_tells_a_timeout_from_a_wrong_server(error, words):
  active = cluster.Cluster(["localhost:1", "localhost:2"])
  message = str(training_cluster._not_listed(active, error))  # pylint: disable=protected-access
  assert words in message and "localhost:1" in message
  assert len(message.splitlines()) == 1
