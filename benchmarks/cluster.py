"""Step time and bytes between tasks: one process vs local `mtf_th server`s.

  .venv/bin/python benchmarks/cluster.py [--steps 20] [--format md]

The unit is `mtf_th comm`'s: one talking-heads layer in a Unitransformer
(RMS norm, attention, residual; vocab 128), forward + backward + one SGD
step, heads-parallel (`mtf_th comm`'s default layout), at tiny dims
(d_model 64, 4 heads of d_k = d_v = 16, batch 8, length 32).  Each mesh runs
in one process on logical CPU devices and on local servers with the same
total device count (2 servers x 1, 4 servers x 1, 2 servers x 2); the
servers are started here on free ports and stopped by PID.

Columns: median step time (one session.run of the SGD step) and its ratio to
the one-process time; bytes sent from one task to another per step (every
_Send of the step's partition graphs between devices of different tasks,
with the size of the tensor it sends from the full trace's step_stats); `mtf_th
comm`'s ring_bytes_per_device for the same layout times the devices (its
prediction of all traffic between devices) and measured / predicted.
Times depend on the machine and its load: compare ratios within one run.
"""
import argparse
import csv
import io
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mtf_talking_heads.core import compat  # noqa: E402  (before mesh_tensorflow)

compat.split_cpu(4)

import tensorflow.compat.v1 as tf  # noqa: E402

from mtf_talking_heads import commands  # noqa: E402
from mtf_talking_heads.measure import harness  # noqa: E402
from mtf_talking_heads.nn import layers  # noqa: E402
from mtf_talking_heads.runtime import cluster  # noqa: E402
from mtf_talking_heads.training import cluster as training_cluster  # noqa: E402

DIMS = dict(heads=4, d_k=16, d_v=16, d_model=64, length=32, batch=8)
# (mesh shape, tasks, devices per task)
CASES = [("model:2", 2, 1), ("model:4", 4, 1), ("model:4", 2, 2)]
MTF_TH = os.path.join(os.path.dirname(sys.executable), "mtf_th")


def comm_prediction(mesh_shape):
  """(layout, ring_bytes_per_device) of `mtf_th comm` for this mesh."""
  out = subprocess.run(
      [MTF_TH, "comm", "--variant", "talking_heads", "--heads",
       str(DIMS["heads"]), "--d_k", str(DIMS["d_k"]), "--d_v",
       str(DIMS["d_v"]), "--d_model", str(DIMS["d_model"]), "--length",
       str(DIMS["length"]), "--batch", str(DIMS["batch"]), "--mesh_shape",
       mesh_shape, "--strategy", "heads_parallel", "--format", "csv"],
      capture_output=True, text=True, check=True).stdout
  row = next(csv.DictReader(io.StringIO(out)))
  return row["layout"], int(row["ring_bytes_per_device"])


def build(mesh_shape, layout, devices=None, target=""):
  layer = layers.TalkingHeadsAttention(
      heads_k=DIMS["heads"], heads=DIMS["heads"], heads_v=DIMS["heads"],
      d_k=DIMS["d_k"], d_v=DIMS["d_v"])
  layer.set_name("attention")
  config = training_cluster.session_config() if target else None
  return harness.Harness([layer], d_model=DIMS["d_model"], vocab=128,
                         batch=DIMS["batch"], length=DIMS["length"],
                         mesh_shape=mesh_shape, layout=layout,
                         optimizer_step=True, devices=devices, target=target,
                         config=config)


def step_time(h, steps):
  for _ in range(3):  # warm-up
    h.session.run(h.train_op)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    h.session.run(h.train_op)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


_TASK = re.compile(r"task:(\d+)")


def bytes_sent(h, between=lambda a, b: _TASK.search(a).group(1) !=
               _TASK.search(b).group(1)):
  """Bytes one step sends between tasks (a full trace).

  Every _Send of the step's partition graphs whose send and recv devices
  are on different tasks (`between`) counts the bytes of the tensor it
  sends: its input's output in the trace's step_stats.
  """
  metadata = tf.RunMetadata()
  h.session.run(h.train_op, options=tf.RunOptions(
      trace_level=tf.RunOptions.FULL_TRACE, output_partition_graphs=True),
                run_metadata=metadata)
  produced = {}
  for dev in metadata.step_stats.dev_stats:
    for node in dev.node_stats:
      for out in node.output:
        produced[(node.node_name, out.slot)] = (
            out.tensor_description.allocation_description.requested_bytes)
  total = 0
  for graph in metadata.partition_graphs:
    for node in graph.node:
      if node.op not in ("_Send", "_HostSend"):
        continue
      if not between(node.attr["send_device"].s.decode(),
                     node.attr["recv_device"].s.decode()):
        continue
      name, _, slot = node.input[0].partition(":")
      total += produced.get((name, int(slot or 0)), 0)
  return total


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--format", choices=("md", "csv"), default="md")
  args = parser.parse_args(argv)
  rows = []
  local_times = {}
  for mesh_shape, tasks, k in CASES:
    layout, ring_bytes = comm_prediction(mesh_shape)
    if mesh_shape not in local_times:
      h = build(mesh_shape, layout)
      local_times[mesh_shape] = step_time(h, args.steps)
      h.close()
      rows.append([mesh_shape, "1 process", "%.4f" % local_times[mesh_shape],
                   "1.00", 0, "", ""])
    with cluster.LocalServers(tasks, devices_per_task=k,
                              mtf_th=[MTF_TH]) as servers:
      h = build(mesh_shape, layout, cluster.device_names(tasks, k),
                "grpc://" + servers.addresses[0])
      seconds = step_time(h, args.steps)
      sent = bytes_sent(h)
      h.close()
    predicted = ring_bytes * tasks * k
    rows.append([mesh_shape, "%d servers x %d" % (tasks, k), "%.4f" % seconds,
                 "%.2f" % (seconds / local_times[mesh_shape]), sent,
                 predicted, "%.2f" % (sent / predicted)])
  columns = ["mesh_shape", "where", "step_sec", "vs_1_process",
             "bytes_between_tasks", "comm_ring_bytes_x_devices",
             "measured_vs_comm"]
  sys.stdout.write(commands.format_table(columns, rows, args.format,
                                         ("mesh_shape", "where")))


if __name__ == "__main__":
  main()
