"""Predicted training-step time of a whole model on named hardware.

  mtf_th perf --gin_file experiments/t5_heads/07_talking_heads_24_32.gin \\
      --hardware tpu_v4 --mesh_shape batch:16
  mtf_th perf --paper_table t5_heads --hardware tpu_v3 --compare_paper

One header line and one row per model (csv by default, --format md for a
markdown table): row, label, step_s (forward + backward + optimizer update,
per device), compute_s, memory_s, network_s (its three parts: ops bound by
FLOPs, ops bound by memory traffic, ring bytes of the collectives), ratio
(step_s / the reference row's: the first row, or --reference ROW).
--gin_file (repeatable) gives one model, as `mtf_th train` reads it;
--paper_table NAME every row of gin/experiments/NAME.  --compare_paper replaces
ratio with the paper's printed step time, both ratios to Table 1's 12-head
multi-head row (paper_ratio, predicted_ratio) and error = predicted_ratio /
paper_ratio - 1; it defaults to the paper's assumed setup
(--hardware tpu_v3, --mesh_shape batch:32, --implementation mtf).  The
model is estimate/step_time.py's; docs/costs.md ("Step time model")
explains it.  Bad
arguments exit with status 2 and one message on stderr.
"""
import sys

from mtf_talking_heads import commands

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import paper
from mtf_talking_heads.estimate import step_time

PROG = "mtf_th perf"
COLUMNS = ("row", "label", "step_s", "compute_s", "memory_s", "network_s",
           "ratio")
PAPER_COLUMNS = ("paper_s", "paper_ratio", "predicted_ratio", "error")


def _build_parser():
  parser = commands.ArgumentParser(
      prog=PROG,
      description="Predicted seconds of one training step (forward, "
      "backward, optimizer update) of a whole model, per device, by a "
      "roofline model: FLOPs / peak, bytes / memory bandwidth, ring bytes / "
      "interconnect bandwidth.  See docs/costs.md.")
  commands.add_gin_arguments(parser, ', e.g. "batch_size = 64"')
  parser.add_argument("--paper_table", metavar="NAME",
                      help="every row of gin/experiments/NAME, e.g. t5_heads")
  parser.add_argument("--compare_paper", action="store_true",
                      help="next to the paper's printed step times (tables: "
                      "%s)" % ", ".join(paper.PAPER_STEP_TIMES))
  parser.add_argument("--hardware", metavar="NAME",
                      help="one of %s (default: tpu_v3)"
                      % ", ".join(hardware_lib.hardware_names()))
  parser.add_argument("--mesh_shape", metavar="SHAPE",
                      help="batch:B,model:P (default batch:1; with "
                      "--compare_paper %s)" % paper.PAPER_MESH)
  parser.add_argument("--implementation", metavar="NAME",
                      help="%s (default mtf_th; with --compare_paper mtf)"
                      % ", ".join(hardware_lib.IMPLEMENTATIONS))
  parser.add_argument("--vocab", type=int, default=model_lib.PAPER_T5["vocab"],
                      metavar="N", help="vocabulary size (the task's, "
                      "padded to a multiple of 128 as mtf pads it; default "
                      "T5's 32128)")
  parser.add_argument("--reference", metavar="ROW",
                      help="row whose step time the ratio column divides by "
                      "(default: the first)")
  for name in hardware_lib.Efficiency._fields:
    parser.add_argument("--%s_efficiency" % name, type=float, metavar="F",
                        help="fraction of peak %s reached (default: the "
                        "hardware's)" % name)
  parser.add_argument("--format", choices=("csv", "md"), default="csv")
  return parser


def _efficiency(args, hardware):
  given = [getattr(args, n + "_efficiency")
           for n in hardware_lib.Efficiency._fields]
  if all(v is None for v in given):
    return None
  base = hardware_lib.get_hardware(hardware).efficiency
  return hardware_lib.Efficiency(*[b if v is None else v
                                   for b, v in zip(base, given)])


def _rows(args):
  """[(row, label, Model)] from --paper_table or --gin_file; the vocabulary
  padded to a multiple of 128, as mtf pads it."""
  from mtf_talking_heads.commands import prechecks  # pylint: disable=g-import-not-at-top
  vocab = model_lib.padded_vocab(spec.positive_int("--vocab", args.vocab))
  if args.paper_table:
    if args.gin_file or args.gin_param:
      raise commands.UsageError("--paper_table reads its own gin files; drop "
                                "--gin_file / --gin_param")
    return model_lib.experiment_rows(args.paper_table, vocab=vocab)
  if not args.gin_file:
    raise commands.UsageError("give --gin_file FILE (repeatable) or "
                              "--paper_table NAME")
  # the checks `mtf_th train` and `mtf_th plan` run on the gin files
  prechecks.gin_files(args.gin_file)
  prechecks.gin_order(args.gin_file)
  prechecks.gin_params(args.gin_param)
  prechecks.gin_bindings(args.gin_file, args.gin_param)
  model = model_lib.model_from_gin(args.gin_file, args.gin_param,
                                   vocab=vocab)
  model_lib.check_gin_layout(args.gin_file, args.gin_param, model)
  name = args.gin_file[-1].rsplit("/", 1)[-1]
  return [(name[:-4] if name.endswith(".gin") else name,
           model_lib.row_label(args.gin_file, args.gin_param), model)]


def _fmt(x, digits=4):
  return "" if x is None else "%.*f" % (digits, x)


def _settings(args):
  """(hardware, mesh_shape, implementation, efficiency), checked."""
  compare = args.compare_paper
  if compare and not args.paper_table:
    raise commands.UsageError("--compare_paper needs --paper_table NAME (one "
                              "of %s)" % ", ".join(paper.PAPER_STEP_TIMES))
  hardware = args.hardware or paper.PAPER_HARDWARE
  hardware_lib.get_hardware(hardware)  # a bad name fails first
  mesh = args.mesh_shape or (paper.PAPER_MESH if compare else "batch:1")
  model_lib.parse_mesh(mesh)
  impl = args.implementation or (paper.PAPER_IMPLEMENTATION if compare
                                 else "mtf_th")
  hardware_lib.implementation(impl)  # a bad name fails naming the others
  return hardware, mesh, impl, _efficiency(args, hardware)


def _paper_cells(compared):
  return [_fmt(compared["paper_s"], 2), _fmt(compared["paper_ratio"], 3),
          _fmt(compared["predicted_ratio"], 3),
          "" if compared["error"] is None
          else "%+.1f%%" % (100 * compared["error"])]


def _run(args):
  """Returns the text to print; raises commands.UsageError or ValueError."""
  hardware, mesh, impl, eff = _settings(args)
  rows = _rows(args)
  names = [r[0] for r in rows]
  if args.reference and args.reference not in names:
    raise ValueError("--reference %r is not a row; choose one of: %s"
                     % (args.reference, ", ".join(names)))
  results = [step_time.predict(m, hardware, mesh, impl, eff)
             for _, _, m in rows]
  ref = results[names.index(args.reference) if args.reference else 0]
  compared = {}
  if args.compare_paper:
    compared = {c["row"]: c for c in paper.compare_paper(
        args.paper_table, hardware, mesh, impl, eff)}
  cells = []
  for (name, label, _), r in zip(rows, results):
    row = [name, label] + [_fmt(r[k]) for k in (
        "step_s", "compute_s", "memory_s", "network_s")]
    if compared:
      row += _paper_cells(compared[name])
    else:
      row.append(_fmt(r["step_s"] / ref["step_s"], 3))
    cells.append(row)
  columns = COLUMNS[:-1] + PAPER_COLUMNS if compared else COLUMNS
  return commands.format_table(columns, cells, args.format,
                               text_columns=("row", "label"))


def main(argv=None):
  return commands.run_text_command(_build_parser(), _run, argv)


if __name__ == "__main__":
  sys.exit(main())
