"""Heatmaps of every layer's learned P_l, P_w, P_l x P_w, with |det| and smallest singular value.

  mtf_th visualize --model_dir /tmp/th_run [--output_dir /tmp/pictures]
      [--baseline /tmp/th_run/model.ckpt-0]

Reads the latest checkpoint in --model_dir (or a checkpoint prefix such as
/tmp/th_run/model.ckpt-1000), writes projections.png (the paper's figure: one
row per attention layer, columns P_l, P_w and P_l x P_w, each divided by its
largest |entry|) and projections.csv (layer, matrix, rows, cols, max_abs,
abs_det, min_singular, max_singular, diag_to_offdiag, change) to
--output_dir (default: the model dir), and prints the |det| /
smallest-singular-value / diagonal-to-off-diagonal table.  With --baseline
(e.g. the initial checkpoint) `change` is ||P - P_baseline||_F /
||P_baseline||_F, how far training moved each matrix.  A checkpoint
without P_l / P_w (multi-head) is an error (exit status 2).
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import file_checks
from mtf_talking_heads.commands import prechecks

PROG = "mtf_th visualize"




def _build_parser():
  parser = commands.ArgumentParser(
      prog=PROG,
      description="Draw the learned talking-heads projections of a "
      "checkpoint as in the paper's figure, and report their conditioning.")
  parser.add_argument("--model_dir", required=True,
                      help="training directory (latest checkpoint is read) "
                      "or a checkpoint prefix")
  parser.add_argument("--output_dir",
                      help="where projections.png / projections.csv go "
                      "(default: --model_dir)")
  parser.add_argument("--baseline", metavar="CHECKPOINT",
                      help="another checkpoint of the same model, e.g. "
                      "MODEL_DIR/model.ckpt-0 (the initialisation): adds the "
                      "column change = ||P - P_baseline|| / ||P_baseline||")
  return parser


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = commands.parse(_build_parser(), argv)
  if isinstance(args, int):
    return args
  try:
    prechecks.checkpoint(args.model_dir, "--model_dir")
    file_checks.readable_checkpoint(args.model_dir, "--model_dir")
    if args.baseline:
      prechecks.checkpoint(args.baseline, "--baseline")
      file_checks.readable_checkpoint(args.baseline, "--baseline")
    if args.output_dir:
      prechecks.directory(args.output_dir, "--output_dir", write=True)
  except commands.UsageError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  from mtf_talking_heads.experiments import visualize  # pylint: disable=g-import-not-at-top
  try:
    result = visualize.visualize(args.model_dir, args.output_dir,
                                 args.baseline)
  except ValueError as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  print("checkpoint: %s" % result["checkpoint"])
  sys.stdout.write(visualize.format_stats(result["stats"]))
  print("wrote %s\nwrote %s" % (result["png"], result["csv"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
