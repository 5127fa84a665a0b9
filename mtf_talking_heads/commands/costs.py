"""Parameters and multiplies per attention layer (paper section 5).

  mtf_th costs --variant talking_heads --heads_k 24 --heads 24 --heads_v 24 \\
      --d_k 32 --d_v 32 --d_model 768 --length 512
  mtf_th costs --variant grouped_talking_heads --groups 8 --heads 24 \\
      --d_k 32 --d_v 32 --d_model 768 --length 512
  mtf_th costs --paper_table t5_heads --format md

One header line and one row (csv by default, --format md for a markdown
table) with the columns variant,heads_k,heads,heads_v,d_k,d_v,params,
multiplies.  With --dynamic the variant cell reads e.g. talking_heads+x2l;
its multiplies are those the layers compute (R_Xl / R_Xw folded into the
static projection's einsum, see docs/costs.md), --fold_dynamic counts every
dynamic term folded as the paper's tables print them, --unfolded one einsum
per term as the pseudocode writes them.  For grouped_talking_heads (--groups
G, heads_k, heads, heads_v the totals) the variant cell reads
grouped_talking_heads(groups=G).
--paper_table NAME prints every row of one of the paper's tables with the
extra columns paper_params,paper_multiplies,match; those rows are counted the
paper's way (dynamic terms folded, see docs/costs.md).  Bad arguments exit
with status 2 and one message on stderr.
"""
import sys

from mtf_talking_heads import commands

from mtf_talking_heads.estimate import costs

PROG = "mtf_th costs"
_CONFIG_FLAGS = ("variant", "dynamic", "heads_k", "heads", "heads_v", "d_k",
                 "d_v", "d_model", "length", "groups")
_PAPER_COLUMNS = ("paper_params", "paper_multiplies", "match")




def _build_parser():
  parser = commands.ArgumentParser(
      prog=PROG,
      description="Parameters and multiplies per attention layer, by the "
      "formulas of the Talking-Heads Attention paper (n = m = length, "
      "d_X = d_M = d_Y = d_model).  See docs/costs.md.")
  parser.add_argument("--variant", choices=costs.VARIANTS)
  parser.add_argument(
      "--dynamic", metavar="TERMS",
      help="comma-separated dynamic projections, a subset of %s "
      "(talking_heads; x2l/m2l also with project_logits, x2w/m2w with "
      "project_weights)" % ",".join(costs.DYNAMIC_TERMS))
  folding = parser.add_mutually_exclusive_group()
  folding.add_argument(
      "--fold_dynamic", action="store_const", dest="folding", const="paper",
      default="code",
      help="count every dynamic term as folded into the static projection's "
      "einsum, as the paper's tables print them (default: as the layers "
      "compute them: only the X-dependent terms, or the one M term, folded)")
  folding.add_argument(
      "--unfolded", action="store_const", dest="folding", const="none",
      help="count one n*m einsum per dynamic term, as appendix A's "
      "pseudocode writes them")
  parser.add_argument("--heads_k", type=int, metavar="N",
                      help="h_k (default: --heads)")
  parser.add_argument("--heads", type=int, metavar="N", help="h")
  parser.add_argument("--heads_v", type=int, metavar="N",
                      help="h_v (default: --heads)")
  parser.add_argument("--d_k", type=int, metavar="N",
                      help="key size per head (general_bilinear: d_model)")
  parser.add_argument("--d_v", type=int, metavar="N",
                      help="value size per head (general_bilinear: d_model)")
  parser.add_argument("--d_model", type=int, metavar="N")
  parser.add_argument("--length", type=int, metavar="N", help="n = m")
  parser.add_argument("--groups", type=int, metavar="G",
                      help="head groups of grouped_talking_heads (required "
                      "there; --heads_k/--heads/--heads_v are the totals)")
  parser.add_argument("--format", choices=("csv", "md"), default="csv")
  parser.add_argument(
      "--paper_table", choices=tuple(costs.PAPER_TABLES), metavar="NAME",
      help="print every row of a paper table next to the printed figures: "
      + ", ".join("%s (%s)" % (k, t.tex_label)
                  for k, t in costs.PAPER_TABLES.items()))
  return parser


def _format(columns, rows, fmt):
  return commands.format_table(columns, rows, fmt, text_columns=("variant",))


def _match_cell(result):
  if result["params_match"] and result["multiplies_match"]:
    return "yes"
  return "no:" + "+".join(
      k for k in ("params", "multiplies") if not result[k + "_match"])


def _paper_rows(name):
  rows = []
  for row in costs.PAPER_TABLES[name].rows:
    result = costs.paper_row_costs(row)
    cells = [result[c] for c in costs.COLUMNS]
    cells[0] = costs.variant_label(row.variant, row.dynamic)
    cells += [row.params, "%.3e" % row.multiplies, _match_cell(result)]
    rows.append(cells)
  return rows


def _run(args):
  """Returns the text to print; raises commands.UsageError or ValueError."""
  if args.paper_table:
    given = ["--" + f for f in _CONFIG_FLAGS if getattr(args, f) is not None]
    if args.folding != "code":
      given.append({"paper": "--fold_dynamic", "none": "--unfolded"}[
          args.folding])
    if given:
      raise commands.UsageError(
          "--paper_table prints the paper's own rows; drop %s"
          % " ".join(given))
    return _format(costs.COLUMNS + _PAPER_COLUMNS,
                   _paper_rows(args.paper_table), args.format)
  missing = ["--" + f for f in ("variant", "heads", "d_model", "length")
             if getattr(args, f) is None]
  if missing:
    raise commands.UsageError(
        "missing %s (or use --paper_table NAME)" % ", ".join(missing))
  terms = costs.attention_terms(
      args.variant, args.heads_k, args.heads, args.heads_v, args.d_k,
      args.d_v, args.d_model, args.length,
      dynamic=args.dynamic or (), fold_dynamic=args.folding,
      groups=args.groups)
  result = costs.total_costs(terms)
  cells = [result[c] for c in costs.COLUMNS]
  cells[0] = costs.variant_label(terms["variant"], terms["dynamic"],
                           terms["groups"])
  return _format(costs.COLUMNS, [cells], args.format)


def main(argv=None):
  return commands.run_text_command(_build_parser(), _run, argv)


if __name__ == "__main__":
  sys.exit(main())
