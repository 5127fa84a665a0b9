"""The flags and the run sequence shared by the commands that build a graph.

`mtf_th train`, `eval`, `decode` and `finetune` read the same flags
(add_common_flags: --model_dir, gin, TPU, --cluster, --module_import,
--verbose; add_checkpoint_flags), check them before TensorFlow loads
(check_common, memory_check) and run through run_command: parse, probe the
cluster, pre-check, announce, quiet TensorFlow (setup_logging), run the body
and turn its ConfigError / TrainingError / Ctrl-C into one line and an exit
status.  positive_int is the argparse type of every positive count flag
(demo, sweep, server too).  The parsing pieces of every command (the
parser, UsageError, tables) are commands/__init__.py's.
"""
import argparse
import functools
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import file_checks
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.core import spec


def add_common_flags(parser, model_dir_help="checkpoints and logs"):
  """--model_dir, --gin_file, --gin_param and the t5 TPU flags."""
  parser.add_argument("--model_dir", required=True, help=model_dir_help)
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin file (repeatable; relative to the package's "
                           "gin/ directory or a path)")
  parser.add_argument("--gin_param", action="append", default=[],
                      help="gin binding, e.g. \"mesh_shape = 'model:4'\" "
                           "(repeatable, applied after the files)")
  parser.add_argument("--tpu", default=None,
                      help="Cloud TPU name or grpc:// address (None: CPU)")
  parser.add_argument("--tpu_zone", default=None)
  parser.add_argument("--gcp_project", default=None)
  parser.add_argument("--module_import", action=commands.ModuleImportAction,
                      default=[], metavar="MODULE",
                      help="import MODULE first, e.g. one that registers "
                           "tasks or gin configurables (repeatable)")
  parser.add_argument("--verbose", action=commands.VerboseAction,
                      help="show TensorFlow's INFO log and start-up "
                           "messages, and mtf's per-step tf.Print")
  add_cluster_flags(parser)


def add_cluster_flags(parser):
  """--cluster and --devices_per_task (docs/cluster.md)."""
  parser.add_argument("--cluster", default=None, metavar="HOST:PORT,...",
                      help="run the mesh on these `mtf_th server` tasks, "
                           "task 0 first (docs/cluster.md)")
  parser.add_argument("--devices_per_task", type=positive_int, default=None,
                      metavar="K", help="with --cluster: devices per task "
                      "(default 1); mesh slot s runs on task s // K")


def use_cluster(prog, args, argv):
  """--cluster: checked and every task probed before TensorFlow loads.

  Returns:
    0, or 2 after one line naming the bad flag or the unreachable task.
  """
  from mtf_talking_heads.runtime import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  try:
    active = cluster_lib.from_args(args, prog, argv)
    if active is not None:
      active.check_reachable()
  except cluster_lib.ClusterError as e:
    print("%s: error: %s" % (prog, e), file=sys.stderr)
    return 2
  cluster_lib.activate(active)
  return 0


def setup_logging(verbose):
  """Quiet TensorFlow unless --verbose (progress lines are ours).

  Args:
    verbose: --verbose; also true when a parent command's --verbose set
      compat's environment variable (e.g. `mtf_th demo --verbose` running
      `mtf_th train` through the sweep).
  """
  import os  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
  verbose = verbose or compat.verbose()
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import mtf_talking_heads  # noqa: F401  registers  pylint: disable=g-import-not-at-top,unused-import
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  # verbosity first: disable_v2_behavior logs a deprecation WARNING
  tf.logging.set_verbosity(tf.logging.INFO if verbose else tf.logging.ERROR)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity("info" if verbose else "error")
  tf.disable_v2_behavior()


def announce(prog, args):
  """The first line, before the slow imports and the graph build."""
  what = " + ".join(args.gin_file) or "the model's operative_config.gin"
  print("[%s] %s in %s: loading TensorFlow and building the graph ..."
        % (prog.split()[-1], what, args.model_dir), file=sys.stderr,
        flush=True)


def _interrupted(prog, argv, e):
  """One line for a stop: the last checkpoint and the command that resumes."""
  step = getattr(e, "checkpoint_step", None)
  if not hasattr(e, "model_dir"):
    return "%s: interrupted" % prog
  if step is None:
    return ("%s: interrupted before the first checkpoint of %s; rerun to "
            "start again: %s" % (prog, e.model_dir, _command(prog, argv)))
  return ("%s: interrupted; the last checkpoint of %s is step %d; resume "
          "with: %s" % (prog, e.model_dir, step, _command(prog, argv)))


def _command(prog, argv):
  import shlex  # pylint: disable=g-import-not-at-top
  return " ".join([prog, shlex.join(argv)])


def check_common(args, writes=True, purpose=""):
  """The checks of add_common_flags' flags that need no TensorFlow.

  Args:
    args: the parsed arguments.
    writes: the command trains into --model_dir (train, finetune): it may
      be new, must be writable, not in use by another writer and hold no
      other model (prechecks.same_model); else it must exist and hold the
      configured model (eval, decode).
    purpose: what a reader writes into --model_dir anyway (eval: its
      results), which then must be writable too.
  Raises:
    commands.UsageError: one line naming the flag and the fix.
  """
  prechecks.gin_files(args.gin_file)
  prechecks.gin_order(args.gin_file)
  prechecks.gin_params(args.gin_param)
  files = prechecks.run_gin_files(args.model_dir, args.gin_file)
  prechecks.gin_bindings(files, args.gin_param)
  prechecks.corpus(files, args.gin_param)
  prechecks.directory(args.model_dir, "--model_dir",
                      write=writes or bool(purpose), must_exist=not writes,
                      purpose=purpose)
  if writes:
    prechecks.not_in_use(args.model_dir, "--model_dir")
    file_checks.damaged_files(args.model_dir, writes=True)
  prechecks.same_model(args.model_dir, args.gin_file, args.gin_param,
                       role="train" if writes else "read")
  prechecks.mixture(args.model_dir, args.gin_file, args.gin_param,
                    args.module_import)
  prechecks.tpu(args.tpu, args.tpu_zone, args.gcp_project)
  if not args.tpu:
    prechecks.cache()


def run_command(prog, parser, argv, body, precheck=check_common):
  """Parses argv, runs precheck(args) (before TensorFlow), then body(args).

  Exit status: 2 for ConfigError/usage errors, 1 when an op failed
  (training.TrainingError), 130 on Ctrl-C; each with one line on stderr.
  """
  args = commands.parse(parser, argv)
  if isinstance(args, int):
    return args
  if use_cluster(prog, args, argv):
    return 2
  try:
    precheck(args)
  except commands.UsageError as e:
    print("%s: error: %s" % (prog, e), file=sys.stderr)
    return 2
  from mtf_talking_heads.runtime import stops  # pylint: disable=g-import-not-at-top
  stops.force_with(functools.partial(_forced_line, prog, argv, args),
                   prog=prog)
  try:
    announce(prog, args)
    setup_logging(args.verbose)
    from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
    return body(args, training) or 0
  except KeyboardInterrupt as e:
    return _last_line(_interrupted(prog, argv, e), 130)
  except (ValueError, RuntimeError) as e:
    training = sys.modules.get("mtf_talking_heads.training")
    if stops.stop_signal() is not None:  # the stop's error (e.g. TF's
      return _last_line(_interrupted(prog, argv, e), 130)  # variable_scope)
    if training is None or not isinstance(
        e, (training.ConfigError, training.TrainingError)):
      raise
    return _last_line("%s: error: %s" % (prog, without_gin_context(e)),
                      2 if isinstance(e, training.ConfigError) else 1)
  finally:  # the claim and the stop were this command's (runtime/stops.py)
    stops.reset()


def without_gin_context(error):
  """The error's message without the lines gin appends to an exception
  raised inside a configurable (each starts "  In ": "In call to
  configurable 'run' ...", "In bindings string line 1 ..."): one line."""
  return str(error).split("\n  In ", 1)[0]


def _last_line(line, code):
  """Prints the command's one line and returns `code`, unless another
  thread has ended the run with its own line (runtime/stops.py: a forced
  stop, a lost --cluster task): then waits for it to end the process."""
  import signal  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.runtime import stops  # pylint: disable=g-import-not-at-top
  sigterm = code == 130 and stops.stop_signal() == signal.SIGTERM
  if not stops.claim(128 + signal.SIGTERM if sigterm else code, line):
    stops.hold()  # (the console script turns this 130 into 143 too)
  return code


def _forced_line(prog, argv, args, signum):
  """The line of a stop that the main thread could not make in time (it
  waits inside TensorFlow): as _interrupted's, with model_dir's last
  checkpoint when this process trains into it (holds its lock)."""
  del signum
  import types  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.runtime import dir_lock  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.runtime import run_files  # pylint: disable=g-import-not-at-top
  model_dir = getattr(args, "model_dir", None)
  if not model_dir or not dir_lock.holds(model_dir):
    return _interrupted(prog, argv, None)
  return _interrupted(prog, argv, types.SimpleNamespace(
      model_dir=model_dir, checkpoint_step=run_files.latest_step(model_dir)))


def positive_int(text):
  """argparse type: spec.positive_int of the flag's text (argparse prefixes
  the message with the flag: "argument --train_steps: the value must be a
  positive integer, got 0")."""
  try:
    value = int(text)
  except ValueError:
    value = text
  try:
    return spec.positive_int("the value", value)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def _steps_list(text):
  """argparse type: prechecks.step_list (no repeats, none negative)."""
  try:
    return prechecks.step_list(text, "")
  except commands.UsageError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def add_checkpoint_flags(parser):
  """--keep_checkpoint_max, --keep_checkpoint_steps, --write_graph."""
  parser.add_argument("--keep_checkpoint_max", type=positive_int,
                      default=None,
                      help="keep the last N checkpoints (default: gin macro "
                           "keep_checkpoint_max, 5)")
  parser.add_argument("--keep_checkpoint_steps", type=_steps_list,
                      default=None,
                      help="never delete the checkpoints of these steps, "
                           "e.g. the steps you will evaluate: 250,2000")
  parser.add_argument("--write_graph", action="store_true",
                      help="also write graph.pbtxt, *.meta and the graph "
                           "for TensorBoard (each about the graph's size)")


def checkpoint_params(args):
  """Gin bindings of add_checkpoint_flags' flags."""
  params = []
  if args.keep_checkpoint_max is not None:
    params.append("utils.run.keep_checkpoint_max = %d"
                  % args.keep_checkpoint_max)
  if args.keep_checkpoint_steps is not None:
    params.append("mtf_th.train_model.keep_checkpoint_steps = %r"
                  % (args.keep_checkpoint_steps,))
  if args.write_graph:
    params.append("mtf_th.train_model.write_graph = True")
  return params


def memory_check(args, training):
  """Pre-flight: refuses a run on this machine's CPU that is predicted not to
  fit in its RAM (fit_check.cpu_refusal, with the task's vocabulary as
  `mtf_th plan` prices it: vocabulary.priced_vocab), before any graph is built.  A
  --tpu run is checked against its slice by launch/tpu.py; a --cluster run
  not at all (the devices are the servers', whose memory this host cannot
  see: docs/cluster.md).

  Raises:
    training.ConfigError: the one line (exit status 2).
  """
  if args.tpu or getattr(args, "cluster", None):
    return
  from mtf_talking_heads.commands import vocabulary  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  reason = fit_check.cpu_refusal(
      args.gin_file, args.gin_param,
      vocab=vocabulary.priced_vocab(args.gin_file, args.gin_param))
  if reason:
    raise training.ConfigError(reason)
