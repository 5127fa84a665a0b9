"""Exact communication of an attention layer under each sharding strategy.

  mtf_th comm --variant talking_heads --heads_k 24 --heads 24 --heads_v 24 \\
      --d_k 32 --d_v 32 --d_model 768 --length 512 --batch 8 \\
      --mesh_shape model:8 [--strategy NAME|all] [--layout RULES] [--format md]
  mtf_th comm --variant grouped_talking_heads --groups 8 --heads 24 \\
      --d_k 32 --d_v 32 --d_model 768 --length 512 --batch 8 \\
      --mesh_shape model:8 --layout groups:model --strategy heads_parallel

One header line and one row per strategy (--strategy all, the default: every
strategy in strategies.STRATEGIES that can apply; one that cannot is reported
on stderr; --strategy auto: the row of what mtf_th.Auto picks, its strategy
column "auto:<name>", and on stderr the predicted bytes per device of every
candidate, or why it does not apply) with the columns variant,strategy,mesh_shape,layout,allreduce,
alltoall,allconcat,einsum_replication,max_slice_elements,
ring_bytes_per_device.  allreduce/alltoall/allconcat are mtf's Lowering
counters (elements, summed over devices); ring_bytes_per_device prices them
under ring costs in float32 bytes (comm.py and docs/sharding.md derive it).
The benchmark unit is one layer of a Unitransformer (RMS norm, attention,
residual; vocab 128), forward + backward + one SGD step, lowered and never
run.  --layout gives the rules for the layer's dims (default: heads-parallel,
see comm.default_layout); each strategy's own rules are appended.  Bad
arguments, or a named strategy that cannot apply to the layout, exit with
status 2 and one message on stderr.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import strategy_table

PROG = "mtf_th comm"

# The strategy names (estimate/strategy_table.py, what strategies.STRATEGIES
# is built from) and the variants comm measures (spec.SHARDED_VARIANTS, as
# measure/comm.py's VARIANTS), from the TensorFlow-free modules: --help and
# bad arguments need no TensorFlow.
STRATEGY_NAMES = strategy_table.NAMES
VARIANTS = spec.SHARDED_VARIANTS


def _build_parser(strategies, variants):
  parser = commands.ArgumentParser(
      prog=PROG,
      description="mtf Lowering counters (all-reduce, all-to-all, "
      "all-gather elements), einsum replication, largest per-device "
      "n x m x heads slice and ring bytes per device of one attention layer "
      "(forward + backward + SGD step) per sharding strategy.  See "
      "docs/sharding.md.")
  parser.add_argument("--variant", choices=variants, required=True)
  parser.add_argument("--dynamic", metavar="TERMS",
                      help="comma-separated dynamic projections "
                      "(x2l,m2l,x2w,m2w) for talking_heads")
  parser.add_argument("--heads_k", type=int, metavar="N",
                      help="h_k (default: --heads)")
  parser.add_argument("--heads", type=int, metavar="N", required=True)
  parser.add_argument("--groups", type=int, metavar="G",
                      help="head groups of grouped_talking_heads (required "
                      "there; heads are the totals; default layout "
                      "groups:model)")
  parser.add_argument("--heads_v", type=int, metavar="N",
                      help="h_v (default: --heads)")
  parser.add_argument("--d_k", type=int, metavar="N", required=True)
  parser.add_argument("--d_v", type=int, metavar="N", required=True)
  parser.add_argument("--d_model", type=int, metavar="N", required=True)
  parser.add_argument("--length", type=int, metavar="N", required=True)
  parser.add_argument("--batch", type=int, metavar="N", required=True)
  parser.add_argument("--vocab", type=int, metavar="N", default=128)
  parser.add_argument("--mesh_shape", required=True,
                      help="e.g. model:8 or batch:2,model:4")
  parser.add_argument("--strategy", default="all",
                      choices=("all",) + tuple(strategies) + ("auto",),
                      help="one strategy, all of them, or auto: the one "
                      "mtf_th.Auto picks (its choice and the predicted bytes "
                      "of every candidate go to stderr)")
  parser.add_argument("--layout", metavar="RULES",
                      help="layout rules for the layer's dims, e.g. "
                      "heads_k:model;heads_v:model (default: heads-parallel)")
  parser.add_argument("--format", choices=("csv", "md"), default="csv")
  return parser


def _format(columns, rows, fmt):
  return commands.format_table(columns, rows, fmt, text_columns=("variant", "strategy", "mesh_shape", "layout"))


def _check_arguments(args):
  """The refusals that need no TensorFlow, in comm's order: the unit's dims
  (comm.make_config), --vocab, then the names of --layout's rules
  (comm.check_config repeats that check for its library callers).

  Raises:
    ValueError: naming the argument.
  """
  cfg = costs.resolve_config(
      args.variant, args.heads_k, args.heads, args.heads_v, args.d_k,
      args.d_v, args.d_model, args.length, dynamic=args.dynamic or (),
      groups=args.groups)
  spec.positive_int("batch", args.batch)
  spec.positive_int("--vocab", args.vocab)
  if args.layout is not None:
    attention = spec.AttentionSpec(
        *[cfg[field] for field in spec.AttentionSpec._fields])
    spec.check_layout_names(
        args.layout, [name for name, _ in spec.parse_mesh_shape(
            args.mesh_shape)], spec.unit_dim_names(attention), what="--layout")


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = commands.parse(_build_parser(STRATEGY_NAMES, VARIANTS), argv)
  if isinstance(args, int):
    return args
  try:
    _check_arguments(args)
  except ValueError as e:
    print("%s: error: %s" % (PROG, str(e).splitlines()[0]), file=sys.stderr)
    return 2
  # TensorFlow is imported only now (--help and bad arguments stay fast);
  # the CPU is split into logical devices before any graph is built.
  from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.measure import comm  # pylint: disable=g-import-not-at-top
  try:
    config = comm.make_config(
        args.variant, args.heads, args.d_k, args.d_v, args.d_model,
        args.length, args.batch, heads_k=args.heads_k, heads_v=args.heads_v,
        dynamic=args.dynamic or (), groups=args.groups)
    names = (list(STRATEGY_NAMES) if args.strategy == "all"
             else [args.strategy])
    comm.check_config(config, args.mesh_shape, args.layout)
    compat.split_cpu(comm.num_devices([args.mesh_shape]))
    rows = []
    if args.strategy == "auto":
      for line in comm.explain_auto(config, args.mesh_shape, args.layout):
        print("%s: %s" % (PROG, line), file=sys.stderr)
    for name in names:
      try:
        result = comm.measure(config, name, args.mesh_shape, args.layout,
                              vocab=args.vocab)
      except ValueError as e:
        if args.strategy != "all":
          raise
        print("%s: %s does not apply: %s" % (PROG, name, e), file=sys.stderr)
        continue
      rows.append(comm.row_cells(result))
    if not rows:
      raise ValueError("no strategy applies to this configuration")
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, str(e).splitlines()[0]), file=sys.stderr)
    return 2
  sys.stdout.write(_format(comm.COLUMNS, rows, args.format))
  return 0


if __name__ == "__main__":
  sys.exit(main())
