"""Fine-tune a pre-trained checkpoint (paper section 7.1: gin/experiments/finetune.gin).

  mtf_th finetune --pretrained_model_dir=runs/th24 --model_dir=runs/th24_ft \\
      --gin_file=experiments/t5_heads/07_talking_heads_24_32.gin \\
      --gin_file=experiments/finetune.gin [--finetune_steps=N]

Starts from the pre-trained checkpoint at step P (latest, or
--checkpoint_step) and trains to step P + finetune_steps (131072 in
finetune.gin) on MIXTURE_NAME (th_finetune_squad_glue_superglue) with a
constant learning rate of 1e-3, dropout 0.1 and the embedding frozen.
Resumes like `mtf_th train`; never writes to the pre-trained directory.
One line says which weights it loads from the checkpoint and which it
initialises; a checkpoint of another model (another attention variant,
other shapes) is refused unless --allow_partial_load, which loads only
the weights of the same name and shape and initialises the others.

Data: the embedded benchmark (experiments/finetune_embedded.gin) needs
nothing; t5's SQuAD / GLUE / SuperGLUE tasks are read by TFDS from
--data_dir (e.g. gs://BUCKET/tensorflow_datasets, prepared with `tfds
build`; default $TFDS_DATA_DIR or ~/tensorflow_datasets).  A dataset
missing there stops the command with one line (status 2) before any graph
is built.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import file_checks
from mtf_talking_heads.commands import prechecks

PROG = "mtf_th finetune"


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  common.add_common_flags(parser, "the fine-tuned model")
  parser.add_argument("--pretrained_model_dir", required=True)
  parser.add_argument("--checkpoint_step", type=int, default=None)
  parser.add_argument("--finetune_steps", type=common.positive_int,
                      default=None)
  parser.add_argument("--data_dir", default=None, metavar="DIR",
                      help="TFDS data directory of the fine-tuning tasks "
                           "(e.g. gs://BUCKET/tensorflow_datasets)")
  parser.add_argument("--allow_partial_load", action="store_true",
                      help="start although the pre-trained checkpoint holds "
                           "another model (another attention variant, other "
                           "shapes): load only the weights of the same name "
                           "and shape, initialise the others (default: "
                           "refused)")
  common.add_checkpoint_flags(parser)
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    check_tfds_data(args, training)
    common.memory_check(args, training)
    rows = training.finetune(args.model_dir, args.pretrained_model_dir,
                             args.gin_file, args.gin_param +
                             common.checkpoint_params(args),
                             finetune_steps=args.finetune_steps,
                             checkpoint_step=args.checkpoint_step,
                             tpu=args.tpu, tpu_zone=args.tpu_zone,
                             gcp_project=args.gcp_project,
                             allow_partial_load=args.allow_partial_load)
    if rows:
      print("step %d loss %.4f (%s)" % (rows[-1]["step"], rows[-1]["loss"],
                                        args.model_dir))
    return 0

  def precheck(args):
    prechecks.different_dirs(args.model_dir, args.pretrained_model_dir,
                             "--pretrained_model_dir")
    common.check_common(args)
    prechecks.directory(args.pretrained_model_dir, "--pretrained_model_dir",
                        must_exist=True)
    file_checks.damaged_files(args.pretrained_model_dir,
                              "--pretrained_model_dir",
                              steps=args.checkpoint_step,
                              step_flag="--checkpoint_step")
    if not args.allow_partial_load:
      prechecks.same_model(args.pretrained_model_dir, args.gin_file,
                           args.gin_param, "--pretrained_model_dir",
                           "pretrained")

  return common.run_command(PROG, parser, argv, body, precheck)


def check_tfds_data(args, training):
  """--data_dir: every TFDS dataset of the configured mixture is there.

  Parses the gin files for the mixture's name only (the command parses
  them again); a mixture with no TFDS task (the embedded one) passes.
  """
  from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.training import checkpoints  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.training import tfds_data  # pylint: disable=g-import-not-at-top
  training.parse_gin(checkpoints.operative_gin(args.model_dir, args.gin_file),
                     args.gin_param)
  name = (getattr(args, "task", None) or models.query("MIXTURE_NAME") or
          models.query("mesh_train_dataset_fn.mixture_or_task_name"))
  if name:
    tfds_data.check_data(name, args.data_dir, name_flag=(
        "--task" if getattr(args, "task", None) else "MIXTURE_NAME"))
  tfds_data.use_data_dir(args.data_dir)


if __name__ == "__main__":
  sys.exit(main())
