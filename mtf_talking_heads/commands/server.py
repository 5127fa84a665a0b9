"""Run one TensorFlow server (task I of --cluster) for `mtf_th train --cluster`.

  mtf_th server --cluster host0:2222,host1:2222 --task 1 [--devices_per_task K]
      [--module_import my_package.tasks]

One task of the job "worker": K logical CPU devices (or the host's first K
GPUs when it has K or more; see docs/cluster.md), tensorflow_text's ops, the
package's modules and every --module_import loaded, so the client's graphs
(input pipeline included, which runs on task 0) find every op.  Prints one
line when it listens; SIGINT or SIGTERM ends it with status 0 within a
second, whatever its main thread does.  Bad input
exits with status 2 and one line, before TensorFlow is imported.
"""
import os
import signal
import sys
import time

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


def check_before_tensorflow(addresses, task, modules):
  """What would fail only after TensorFlow's import: a --module_import
  that cannot be found, this task's port in use (an entry that is a URL,
  which the server's ClusterSpec aborts on, is refused by
  cluster_lib.parse_addresses, the client's parser too).

  Raises:
    commands.UsageError: one line naming the flag and the fix.
  """
  for name in modules:
    if not findable(name):
      raise commands.UsageError(
          "--module_import %r: no such module on this Python's path; give "
          "an importable module, e.g. --module_import my_package.tasks"
          % name)
  port_free(addresses[task], task)


def findable(name):
  """Whether module `name` can be found, without importing it (nor its
  packages: their __init__ may import TensorFlow); True when unsure."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  parts = name.split(".")
  try:
    spec = importlib.util.find_spec(parts[0])
    for i in range(1, len(parts)):
      if spec is None or not spec.submodule_search_locations:
        return spec is not None and name in sys.modules
      path = list(spec.submodule_search_locations)
      spec = next((s for s in (
          f.find_spec(".".join(parts[:i + 1]), path) for f in sys.meta_path
          if hasattr(f, "find_spec")) if s is not None), None)
  except (ImportError, ValueError, AttributeError):
    return True
  return spec is not None


def port_free(address, task):
  """Refuses this task's address when another process listens on its port
  (gRPC's server sets SO_REUSEADDR too: a port in TIME_WAIT is free)."""
  import errno  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top
  port = int(address.rpartition(":")[2])
  probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("", port))
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise commands.UsageError(
          "cannot listen on %s (task %d): address in use (another process "
          "listens on port %d: stop it, or give this task another port in "
          "--cluster, the same list for every server and the client)"
          % (address, task, port)) from None
    if e.errno == errno.EACCES:
      raise commands.UsageError(
          "cannot listen on %s (task %d): permission denied for port %d; "
          "give a port above 1023" % (address, task, port)) from None
  finally:
    probe.close()


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
  """tensorflow_text's ops, the package, the fused attention core's op
  (nn/fused: a client's graph places it on the servers' devices) and
  --module_import modules."""
  import importlib  # pylint: disable=g-import-not-at-top
  import mtf_talking_heads  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads import data  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads import training  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from mtf_talking_heads.nn.fused import ops  # pylint: disable=g-import-not-at-top
  module, reason = ops.load()
  if module is None:
    print("[server] the fused attention core is not loaded (%s): clients "
          "need --gin_param=\"mtf_th.core_kernel.kind = 'einsum'\""
          % reason, file=sys.stderr, flush=True)
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
    check_before_tensorflow(addresses, args.task, args.module_import)
  except (ValueError, commands.UsageError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  _stop_on_signals(args.task)
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
  while True:  # the stop watch thread ends the process
    time.sleep(3600)


def _stop_on_signals(task):
  """SIGINT and SIGTERM end the server at once, from runtime/stops.py's
  thread, which reads the signal whichever of TensorFlow's threads got it:
  the main thread takes no part (Python runs handlers only there, and a
  server resumed after SIGSTOP once ignored its first SIGTERM).  A
  tf.distribute.Server cannot be stopped, so the process ends (os._exit)
  with status 0 after its line."""
  from mtf_talking_heads.runtime import stops  # pylint: disable=g-import-not-at-top
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _ignore)  # a Python handler: the wakeup fd is written
  stops.install()
  stops.force_with(lambda signum: "[server] task %d stopped" % task,
                   after_secs=0, code=0)


def _ignore(unused_signum, unused_frame):
  """The stop is runtime/stops.py's (its thread reads the wakeup fd)."""


if __name__ == "__main__":
  sys.exit(main())
