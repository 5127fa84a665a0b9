"""The `mtf_th` subcommands (see cli.py); shared argument-parsing pieces."""
import argparse
import csv
import io
import sys


class UsageError(Exception):
  """A bad command line: the subcommand prints it and exits with status 2."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse that raises UsageError instead of exiting, so a command's
  main() returns 2 with one clear message (and tests can call main())."""

  def error(self, message):
    raise UsageError(message)


def parse(parser, argv):
  """parser.parse_args(argv), or an int exit status when there is nothing
  to run: 0 after --help, 2 after printing a bad command line's message."""
  try:
    return parser.parse_args(argv)
  except SystemExit as e:  # --help
    return e.code or 0
  except UsageError as e:
    print("%s: error: %s" % (parser.prog, e), file=sys.stderr)
    return 2


def format_table(columns, rows, fmt, text_columns=("variant",)):
  """Rows as CSV (fmt="csv") or a markdown table (fmt="md").

  Markdown right-aligns every column except those in `text_columns`.
  """
  if fmt == "md":
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if c in text_columns else "---:"
                            for c in columns) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(columns)
  writer.writerows(rows)
  return out.getvalue()
