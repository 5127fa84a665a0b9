"""The `mtf_th` console script: one subcommand per module in commands/.

Each subcommand module defines ``main(argv)`` (argv without the program and
subcommand names) and a one-line module docstring shown by ``mtf_th --help``.
Modules are imported lazily so `mtf_th costs` does not pay for TensorFlow.
"""
import importlib
import signal
import sys

COMMANDS = {
    "costs": "mtf_talking_heads.commands.costs",
    "perf": "mtf_talking_heads.commands.perf",
    "plan": "mtf_talking_heads.commands.plan",
    "train": "mtf_talking_heads.commands.train",
    "eval": "mtf_talking_heads.commands.evaluate",
    "decode": "mtf_talking_heads.commands.decode",
    "finetune": "mtf_talking_heads.commands.finetune",
    "comm": "mtf_talking_heads.commands.comm",
    "sweep": "mtf_talking_heads.commands.sweep",
    "visualize": "mtf_talking_heads.commands.visualize",
    "demo": "mtf_talking_heads.commands.demo",
    "server": "mtf_talking_heads.commands.server",
}


def _usage():
  lines = ["usage: mtf_th <command> [options]   (mtf_th <command> --help)", "",
           "commands:"]
  for name, module in COMMANDS.items():
    try:
      doc = (importlib.import_module(module).__doc__ or "").strip()
      doc = doc.splitlines()[0] if doc else ""
    except ImportError:
      continue
    lines.append("  %-10s %s" % (name, doc))
  return "\n".join(lines)


class Terminated(KeyboardInterrupt):
  """SIGTERM (`kill PID`) in a command: it stops as on Ctrl-C."""


_stopped_by = []  # the signal this process is stopping on, once one came


def _stop(signum, unused_frame):
  """The first SIGINT or SIGTERM: both are ignored from now on, so the
  clean stop is not cut short (a terminal's Ctrl-C reaches a sweep's run
  twice: from the terminal and passed on by the sweep), then it raises."""
  _stopped_by.append(signum)
  for sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(sig) is _stop:
      signal.signal(sig, signal.SIG_IGN)
  raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _stop_on_signals():
  """SIGTERM stops a command the way Ctrl-C does: nothing half-written, its
  lock released, one line naming the command that resumes, but exit status
  143 (128 + SIGTERM) instead of 130.  `kill PID` is how a background
  command is stopped: a shell without job control starts it with SIGINT
  ignored, and that stays so.  A SIGTERM the caller ignores stays ignored;
  the `server` command sets its own handlers."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stop)
  if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _stop)


def console(argv=None):
  """`mtf_th` as a program (the console script and `python -m
  mtf_talking_heads.cli`): main() with SIGINT and SIGTERM handled by
  _stop; returns the exit status."""
  _stop_on_signals()
  code = main(argv)
  if code == 130 and _stopped_by[-1:] == [signal.SIGTERM]:
    return 128 + signal.SIGTERM
  return code


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  name = argv[0]
  if name not in COMMANDS:
    print("mtf_th: unknown command %r; choose one of: %s"
          % (name, ", ".join(COMMANDS)), file=sys.stderr)
    return 2
  module = importlib.import_module(COMMANDS[name])
  return module.main(argv[1:]) or 0


if __name__ == "__main__":
  sys.exit(console())
