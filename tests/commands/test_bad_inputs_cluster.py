"""A client and servers that do not agree on one cluster are refused before
training (issue 34): one line, status 2.

Servers A and B are started as tasks 0 and 1 of `--cluster A,B`, and C as
task 1 of `--cluster A,C` (another cluster spec naming A), once for the
module, stopped by PID at the end.  Refused: `mtf_th train --cluster B,A`
(another order: the command, nothing trained), `--cluster A` (only some of
the tasks) and `--cluster A,C` (a server started with another spec: task
0 runs its task 1 on B, not C), the last two by the pre-flight itself
(training.cluster.preflight, what every command runs before its graph).
Each server answers for itself (its task index and its devices'
incarnations, which every server start draws anew) and task 0 lists its
cluster's devices: check_same_cluster's three refusals are also checked
on device lists written by hand.
"""
import os
import subprocess

import pytest

import _cli_util
from _cli_util import MTF_TH
from mtf_talking_heads.runtime import cluster
from mtf_talking_heads.training import cluster as training_cluster
from mtf_talking_heads.training import errors

T5 = ["--gin_file=experiments/t5_heads/06_talking_heads_12_64.gin",
      "--gin_file=models/t5_tiny.gin", "--gin_param=mesh_shape = 'model:2'",
      "--gin_param=layout = 'heads:model'", "--gin_param=num_layers = 1"]


@pytest.fixture(scope="module")
def servers():
  """(A, B, C) addresses; A and B one cluster, C task 1 of `A,C`."""
  with cluster.LocalServers(2, mtf_th=[MTF_TH]) as ab:
    port, = cluster.free_ports(1)
    c = "localhost:%d" % port
    other = subprocess.Popen(
        [MTF_TH, "server", "--cluster", "%s,%s" % (ab.addresses[0], c),
         "--task", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=_cli_util.env(), preexec_fn=cluster.die_with_parent)
    try:
      assert "listening" in other.stdout.readline()
      yield ab.addresses + [c]
    finally:
      other.terminate()
      other.wait(timeout=30)


def test_servers_in_another_order_refused_before_training(servers, tmp_path):
  a, b, _ = servers
  model_dir = str(tmp_path / "run")
  result = _cli_util.run(["train", "--model_dir", model_dir, "--train_steps",
                          "2", "--cluster", "%s,%s" % (b, a)] + T5)
  assert result.code == 2, result.stderr[-3000:]
  line, = [l for l in result.stderr.splitlines() if l.startswith("mtf_th ")]
  assert line == (
      "mtf_th train: error: --cluster lists %s as task 0, but that server "
      "is task 1 of its cluster (started with --task 1): give the client "
      "the --cluster its servers were started with, in the same order" % b)
  assert "starting at step" not in result.stderr
  left = os.listdir(model_dir) if os.path.exists(model_dir) else []
  assert not [f for f in left if f.startswith(
      ("model.ckpt", "mtf_th.lock", "train_log"))], left


def _preflight(addresses, devices_per_task, tmp_path):
  cluster.activate(cluster.Cluster(addresses, devices_per_task))
  try:
    with pytest.raises(errors.ConfigError) as e:
      training_cluster.preflight(str(tmp_path))
  finally:
    cluster.activate(None)
  return str(e.value)


def test_only_some_of_the_tasks_refused(servers, tmp_path):
  a, _, _ = servers
  assert _preflight([a], 2, tmp_path) == (
      "task 0 (%s) is in a cluster of 2 tasks (task 0, task 1) but "
      "--cluster %s names 1: give the client the --cluster its servers "
      "were started with, every task in the same order" % (a, a))


def test_a_server_of_another_cluster_spec_refused(servers, tmp_path):
  a, _, c = servers
  assert _preflight([a, c], 1, tmp_path) == (
      "task 0 (%s) runs its task 1 on another server than %s (the servers "
      "were started with other --cluster lists): start every server with "
      "the client's --cluster %s,%s" % (a, c, a, c))


def _devices(task, incarnation, k=1):
  return {"/job:worker/replica:0/task:%d/device:CPU:%d" % (task, i):
          incarnation + i for i in range(k)}


@pytest.mark.parametrize("own, listed, words", [
    ([_devices(0, 10), _devices(1, 20)],
     dict(_devices(0, 10), **_devices(1, 20)), None),
    ([_devices(1, 20), _devices(0, 10)],
     dict(_devices(0, 10), **_devices(1, 20)),
     "--cluster lists h0:1 as task 0, but that server is task 1"),
    ([_devices(0, 10), _devices(1, 20)],
     dict(_devices(0, 10), **_devices(1, 20), **_devices(2, 30)),
     "task 0 (h0:1) is in a cluster of 3 tasks (task 0, task 1, task 2) but "
     "--cluster h0:1,h1:1 names 2"),
    ([_devices(0, 10), _devices(1, 21)],
     dict(_devices(0, 10), **_devices(1, 20)),
     "task 0 (h0:1) runs its task 1 on another server than h1:1"),
], ids=["same", "order", "subset", "other_spec"])
def test_check_same_cluster(own, listed, words):
  active = cluster.Cluster(["h0:1", "h1:1"])
  if words is None:
    training_cluster.check_same_cluster(active, own, listed)
    return
  with pytest.raises(errors.ConfigError, match=words.replace(
      "(", r"\(").replace(")", r"\)")):
    training_cluster.check_same_cluster(active, own, listed)
