"""The `mtf_th` subcommands (see cli.py); shared argument-parsing pieces."""
import argparse
import csv
import importlib
import io
import sys


class UsageError(Exception):
  """A bad command line: the subcommand prints it and exits with status 2."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse that raises UsageError instead of exiting, so a command's
  main() returns 2 with one clear message (and tests can call main())."""

  def error(self, message):
    raise UsageError(message)


class ModuleImportAction(argparse.Action):
  """--module_import MODULE (repeatable, like t5_mesh_transformer's): imports
  MODULE while the command line is parsed, so the tasks and gin
  configurables it registers exist before any gin file is read."""

  def __call__(self, parser, namespace, values, option_string=None):
    try:
      importlib.import_module(values)
    except ImportError as e:
      raise argparse.ArgumentError(
          self, "cannot import %r (%s): give an importable module, e.g. "
          "--module_import=my_package.tasks" % (values, e)) from e
    modules = list(getattr(namespace, self.dest, None) or [])
    setattr(namespace, self.dest, modules + [values])


class VerboseAction(argparse.Action):
  """--verbose: a flag that also tells compat to keep TensorFlow's start-up
  messages, Python warnings and mtf's per-step tf.Print (set before
  TensorFlow is imported)."""

  def __init__(self, option_strings, dest, default=False, **kwargs):
    super().__init__(option_strings, dest, nargs=0, default=default, **kwargs)

  def __call__(self, parser, namespace, values, option_string=None):
    from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
    compat.set_verbose(True)
    setattr(namespace, self.dest, True)


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


def run_text_command(parser, run, argv):
  """Parses argv, prints run(args)'s text; bad input is one line, exit 2.

  Args:
    parser: the subcommand's ArgumentParser (its prog names the command).
    run: args -> text to print; raises UsageError or ValueError on bad input.
    argv: the arguments after the subcommand (None: sys.argv[1:]).
  Returns:
    the exit status.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse(parser, argv)
  if isinstance(args, int):
    return args
  try:
    text = run(args)
  except (UsageError, ValueError) as e:
    print("%s: error: %s" % (parser.prog, e), file=sys.stderr)
    return 2
  sys.stdout.write(text)
  return 0


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


def add_gin_arguments(parser, param_example=""):
  """--gin_file and --gin_param of the commands that read a model's gin files.

  param_example: text after the --gin_param help, e.g. ', e.g. "x = 1"'.
  """
  parser.add_argument("--gin_file", action="append", default=[],
                      metavar="FILE", help="a gin file of the model (under "
                      "gin/ or a path; repeatable, read in order)")
  parser.add_argument("--gin_param", action="append", default=[],
                      metavar="BINDING", help="a gin binding applied after "
                      "the files" + param_example)
