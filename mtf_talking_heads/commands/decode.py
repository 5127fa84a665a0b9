"""Decode text with a text-to-text checkpoint (T5, or a delimited_lm LM).

  mtf_th decode --model_dir=runs/th24 [--input="some text" ...]
      [--input_file=lines.txt] [--num_examples=8] [--checkpoint_step=N]

Without inputs, decodes held-out inputs of the model's task (e.g. span
corruption).  A delimited_lm model (experiments/finetune_embedded_lm.gin)
continues "<input> EOS" and prints what follows, up to its EOS.
Prints "input<TAB>output" lines (text decoded with the model's vocabulary);
--output_file writes them there instead.  Configuration errors exit with
status 2, a failing op with status 1, each with one line.
"""
import os
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import file_checks
from mtf_talking_heads.commands import prechecks

PROG = "mtf_th decode"


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  common.add_common_flags(parser, "the trained model")
  parser.add_argument("--input", action="append", default=None,
                      help="a text to decode (repeatable)")
  parser.add_argument("--input_file", default=None,
                      help="a file with one text per line")
  parser.add_argument("--output_file", default=None)
  parser.add_argument("--num_examples", type=common.positive_int,
                      default=8, help="held-out inputs when none are given")
  parser.add_argument("--checkpoint_step", type=int, default=None)
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    inputs = list(args.input or [])
    if args.input_file:
      try:
        with open(args.input_file) as f:
          inputs += [line.rstrip("\n") for line in f if line.strip()]
      except OSError as e:
        raise training.ConfigError("--input_file %r: %s" % (args.input_file,
                                                            e)) from e
      if not inputs:
        raise training.ConfigError("--input_file %r has no non-empty line"
                                   % args.input_file)
    results = training.decode(args.model_dir, args.gin_file, args.gin_param,
                              inputs=inputs or None,
                              checkpoint_step=args.checkpoint_step,
                              num_examples=args.num_examples, tpu=args.tpu,
                              tpu_zone=args.tpu_zone,
                              gcp_project=args.gcp_project)
    lines = ["%s\t%s" % (r["input"].replace("\t", " "),
                         r["output"].replace("\t", " ")) for r in results]
    if args.output_file:
      with open(args.output_file, "w") as f:
        f.write("\n".join(lines) + "\n")
    else:
      print("\n".join(lines))
    return 0

  def precheck(args):
    common.check_common(args, writes=False)
    prechecks.text_to_text(args.model_dir, args.gin_file, args.gin_param,
                           "decode", ": score it with mtf_th eval")
    file_checks.damaged_files(args.model_dir, steps=args.checkpoint_step,
                              step_flag="--checkpoint_step")
    if not args.tpu and not args.cluster:  # as common.memory_check
      prechecks.forward_memory(args.model_dir, args.gin_file, args.gin_param,
                               "decode")
    if args.input_file:
      prechecks.no_newline(args.input_file, "--input_file")
    if args.input_file and not os.path.isfile(args.input_file):
      raise commands.UsageError("--input_file %s: no such file"
                                % args.input_file)
    if args.output_file:
      file_checks.output_file(args.output_file, "--output_file")

  return common.run_command(PROG, parser, argv, body, precheck)


if __name__ == "__main__":
  sys.exit(main())
