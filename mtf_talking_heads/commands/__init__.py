"""The `mtf_th` subcommands (see cli.py); shared argument-parsing pieces."""
import argparse


class UsageError(Exception):
  """A bad command line: the subcommand prints it and exits with status 2."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse that raises UsageError instead of exiting, so a command's
  main() returns 2 with one clear message (and tests can call main())."""

  def error(self, message):
    raise UsageError(message)
