"""Train a model from gin files, resuming from the latest checkpoint.

  mtf_th train --model_dir=runs/th24 \\
      --gin_file=experiments/t5_heads/07_talking_heads_24_32.gin \\
      --gin_file=models/t5_tiny.gin --gin_param="mesh_shape = 'model:4'" \\
      [--train_steps=N] [--tpu=NAME --tpu_zone=ZONE --gcp_project=PROJECT]

Everything about the model, data, mesh (mesh_shape / layout macros or
utils.run.mesh_shape / utils.run.layout_rules) and schedule comes from gin.
--train_steps N trains up to global step N (default utils.run.train_steps).
Writes checkpoints, operative_config.gin, TensorBoard events and
<model_dir>/train_log.csv (step,loss,steps_per_sec,elapsed_sec); progress
lines (steps/s, ETA, loss) go to stderr.  Configuration errors exit with
status 2 and one message, before any graph is built.
"""
import argparse
import sys

from mtf_talking_heads import commands

PROG = "mtf_th train"



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


def setup_logging(verbose):
  """Quiet TensorFlow unless --verbose (progress lines are ours)."""
  import os  # pylint: disable=g-import-not-at-top
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import mtf_talking_heads  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.disable_v2_behavior()
  tf.logging.set_verbosity(tf.logging.INFO if verbose else tf.logging.ERROR)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity("info" if verbose else "error")


def run_command(prog, parser, argv, body):
  """Parses argv, runs body(args); ConfigError/usage errors -> status 2."""
  args = commands.parse(parser, argv)
  if isinstance(args, int):
    return args
  setup_logging(args.verbose)
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  try:
    return body(args, training) or 0
  except training.ConfigError as e:
    print("%s: error: %s" % (prog, e), file=sys.stderr)
    return 2


def _positive_int(text):
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError("must be a positive integer, got %r"
                                     % text)
  if value < 1:
    raise argparse.ArgumentTypeError("must be a positive integer, got %r"
                                     % text)
  return value


positive_int = _positive_int


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  add_common_flags(parser)
  parser.add_argument("--train_steps", type=positive_int, default=None,
                      help="train up to this global step")

  def body(args, training):
    rows = training.train(args.model_dir, args.gin_file, args.gin_param,
                          train_steps=args.train_steps, tpu=args.tpu,
                          tpu_zone=args.tpu_zone, gcp_project=args.gcp_project)
    if rows:
      last = rows[-1]
      print("step %d loss %.4f (%s)" % (last["step"], last["loss"],
                                        args.model_dir))
    return 0

  return run_command(PROG, parser, sys.argv[1:] if argv is None else argv,
                     body)


if __name__ == "__main__":
  sys.exit(main())
