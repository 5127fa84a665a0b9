"""Fine-tune a pre-trained checkpoint (paper section 7.1: gin/experiments/finetune.gin).

  mtf_th finetune --pretrained_model_dir=runs/th24 --model_dir=runs/th24_ft \\
      --gin_file=experiments/t5_heads/07_talking_heads_24_32.gin \\
      --gin_file=experiments/finetune.gin [--finetune_steps=N]

Starts from the pre-trained checkpoint at step P (latest, or
--checkpoint_step) and trains to step P + finetune_steps (131072 in
finetune.gin) on MIXTURE_NAME (th_finetune_squad_glue_superglue) with a
constant learning rate of 1e-3, dropout 0.1 and the embedding frozen.
Resumes like `mtf_th train`; never writes to the pre-trained directory.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import train as train_command

PROG = "mtf_th finetune"


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  train_command.add_common_flags(parser, "the fine-tuned model")
  parser.add_argument("--pretrained_model_dir", required=True)
  parser.add_argument("--checkpoint_step", type=int, default=None)
  parser.add_argument("--finetune_steps", type=train_command.positive_int,
                      default=None)
  train_command.add_checkpoint_flags(parser)
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    rows = training.finetune(args.model_dir, args.pretrained_model_dir,
                             args.gin_file, args.gin_param +
                             train_command.checkpoint_params(args),
                             finetune_steps=args.finetune_steps,
                             checkpoint_step=args.checkpoint_step,
                             tpu=args.tpu, tpu_zone=args.tpu_zone,
                             gcp_project=args.gcp_project)
    if rows:
      print("step %d loss %.4f (%s)" % (rows[-1]["step"], rows[-1]["loss"],
                                        args.model_dir))
    return 0

  return train_command.run_command(PROG, parser, argv, body)


if __name__ == "__main__":
  sys.exit(main())
