"""Run one TensorFlow server (task I of --cluster) for `mtf_th train --cluster`.

  mtf_th server --cluster host0:2222,host1:2222 --task 1 [--devices_per_task K]
      [--module_import my_package.tasks]

One task of the job "worker": K logical CPU devices (or the host's first K
GPUs when it has K or more; see docs/cluster.md), tensorflow_text's ops, the
package's modules and every --module_import loaded, so the client's graphs
(input pipeline included, which runs on task 0) find every op.  Prints one
line when it listens; SIGINT or SIGTERM ends it with status 0.  Bad input
exits with status 2 and one line, before TensorFlow is imported.
"""
import os
import signal
import sys
import threading

from mtf_talking_heads import commands
from mtf_talking_heads.runtime import cluster as cluster_lib

PROG = "mtf_th server"


def thread_counts(devices_per_task, cpus=None):
  """(intra_op, inter_op) threads: the host's cores shared by its K devices.

  Each device's ops get cpus // K intra-op threads (at least 1); inter-op
  threads (ops run at once) are the core count, at least 2 (a Recv must
  not wait for a thread held by a blocked op).
  """
  cpus = cpus or os.cpu_count() or 1
  return max(1, cpus // devices_per_task), max(2, cpus)


def _build_parser():
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  parser.add_argument("--cluster", required=True, metavar="HOST:PORT,...",
                      help="every task's address, task 0 first (the same "
                           "list for every server and the client)")
  parser.add_argument("--task", required=True, type=int, metavar="I",
                      help="this server's index in --cluster")
  parser.add_argument("--devices_per_task", type=_positive_int, default=1,
                      metavar="K", help="devices this task gives the mesh "
                                        "(default 1)")
  parser.add_argument("--module_import", action="append", default=[],
                      metavar="MODULE",
                      help="import MODULE too, e.g. one registering ops or "
                           "tasks (repeatable)")
  parser.add_argument("--verbose", action=commands.VerboseAction,
                      help="show TensorFlow's log")
  return parser


def _positive_int(text):
  from mtf_talking_heads.commands import common  # pylint: disable=g-import-not-at-top
  return common.positive_int(text)


def server_config(devices_per_task, num_gpus):
  """The server's ConfigProto: K CPU devices, or the GPUs; thread counts."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  intra, inter = thread_counts(devices_per_task)
  config = tf.ConfigProto(intra_op_parallelism_threads=intra,
                          inter_op_parallelism_threads=inter)
  config.device_count["CPU"] = 1 if num_gpus >= devices_per_task else (
      devices_per_task)
  config.isolate_session_state = True
  return config


def _load_modules(modules):
  """tensorflow_text's ops, the package and --module_import modules."""
  import importlib  # pylint: disable=g-import-not-at-top
  import mtf_talking_heads  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads import data  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads import training  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  for name in modules:
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise commands.UsageError("--module_import %r: cannot import it (%s)"
                                % (name, e)) from e


def _devices_text(task, k, device_type):
  """e.g. "2 CPU devices (/job:worker/replica:0/task:1/device:CPU:0-1)"."""
  first = cluster_lib.device_name(task, 0, device_type)
  return "%d %s device%s (%s%s)" % (k, device_type, "s" if k > 1 else "",
                                    first, "-%d" % (k - 1) if k > 1 else "")


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = commands.parse(_build_parser(), argv)
  if isinstance(args, int):
    return args
  try:
    addresses = cluster_lib.parse_addresses(args.cluster)
    if not 0 <= args.task < len(addresses):
      raise commands.UsageError(
          "--task %d is not a task of --cluster (%d tasks: 0..%d)"
          % (args.task, len(addresses), len(addresses) - 1))
  except (ValueError, commands.UsageError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  from mtf_talking_heads.commands import common  # pylint: disable=g-import-not-at-top
  common.setup_logging(args.verbose)
  try:
    _load_modules(args.module_import)
  except commands.UsageError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  num_gpus = len(tf.config.list_physical_devices("GPU"))
  device_type = "GPU" if num_gpus >= args.devices_per_task else "CPU"
  spec = tf.train.ClusterSpec({cluster_lib.JOB: addresses})
  try:
    tf.distribute.Server(spec, job_name=cluster_lib.JOB,
                         task_index=args.task,
                         config=server_config(args.devices_per_task,
                                              num_gpus),
                         start=True)
  except (tf.errors.OpError, ValueError) as e:
    print("%s: error: cannot listen on %s (task %d): %s"
          % (PROG, addresses[args.task], args.task,
             str(e).strip().splitlines()[0]), file=sys.stderr)
    return 1
  print("[server] task %d of %d listening on %s: %s; pid %d; Ctrl-C or "
        "SIGTERM stops it" % (args.task, len(addresses), addresses[args.task],
                              _devices_text(args.task, args.devices_per_task,
                                            device_type), os.getpid()),
        flush=True)
  while not stop.wait(3600):
    pass
  print("[server] task %d stopped" % args.task, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access  (the server cannot stop)


if __name__ == "__main__":
  sys.exit(main())
