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
status 2 and one message, before any graph is built; a failing op stops the
run at once with one message and status 1; Ctrl-C prints the last
checkpoint and the command that resumes, status 130 (SIGTERM: the same,
status 143).  Keeps the last --keep_checkpoint_max checkpoints (5) plus
--keep_checkpoint_steps; no graph.pbtxt unless --write_graph.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common

PROG = "mtf_th train"


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  common.add_common_flags(parser)
  parser.add_argument("--train_steps", type=common.positive_int,
                      default=None, help="train up to this global step")
  common.add_checkpoint_flags(parser)

  def body(args, training):
    common.memory_check(args, training)
    rows = training.train(args.model_dir, args.gin_file,
                          args.gin_param + common.checkpoint_params(args),
                          train_steps=args.train_steps, tpu=args.tpu,
                          tpu_zone=args.tpu_zone, gcp_project=args.gcp_project)
    if rows:
      last = rows[-1]
      print("step %d loss %.4f (%s)" % (last["step"], last["loss"],
                                        args.model_dir))
    return 0

  return common.run_command(PROG, parser,
                            sys.argv[1:] if argv is None else argv, body)


if __name__ == "__main__":
  sys.exit(main())
