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


_stop_signal = None  # the SIGINT or SIGTERM this process is stopping on


def _stop(signum, unused_frame):
  """Handles the first SIGINT or SIGTERM: the command stops as on Ctrl-C.

  The second is ignored, so the clean stop is not cut short (an impatient
  second Ctrl-C; a sweep's SIGTERM when its run is SIGKILLed); the third
  ends the process at once, for a stop that hangs.

  Raises:
    KeyboardInterrupt: on SIGINT.
    Terminated: on SIGTERM.
  """
  global _stop_signal
  _stop_signal = signum
  from mtf_talking_heads.runtime import stops  # pylint: disable=g-import-not-at-top
  stops.note_signal(signum)
  _handle_both(_second)
  raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _second(unused_signum, unused_frame):
  """Handles the second SIGINT or SIGTERM: nothing; the next one kills."""
  _handle_both(signal.SIG_DFL)


def _handle_both(handler):
  """Sets SIGINT's and SIGTERM's handler where it is _stop or _second.

  Args:
    handler: a handler function, signal.SIG_DFL or signal.SIG_IGN.
  """
  for sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(sig) in (_stop, _second):
      signal.signal(sig, handler)


def _stop_on_signals():
  """Installs _stop for SIGINT and SIGTERM.

  SIGTERM then stops a command the way Ctrl-C does (nothing half-written,
  its lock released, one line), with exit status 143 (128 + SIGTERM)
  instead of 130.  `kill PID` is how a command in the background is
  stopped: a shell without job control starts it with SIGINT ignored, and
  that stays so, as does a SIGTERM the caller ignores.  The `server`
  command sets its own handlers.
  """
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stop)
  if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _stop)


def console(argv=None):
  """`mtf_th` as a program: main() with SIGINT and SIGTERM handled by _stop.

  The entry of the console script and of `python -m` of
  mtf_talking_heads_startup (a sweep's runs) or mtf_talking_heads.cli.  A
  command stopped where it has no line of its own for it says `mtf_th
  <command>: interrupted` instead of a traceback.

  Returns:
    the exit status: main()'s, or 130 on Ctrl-C, 143 on SIGTERM.
  """
  _stop_on_signals()
  from mtf_talking_heads.runtime import stops  # pylint: disable=g-import-not-at-top
  stops.install()  # a long command's stop works even inside TensorFlow
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    code = main(argv)
    if _stop_signal is None:  # a signal from now on ends it quietly
      _handle_both(signal.SIG_DFL)
  except KeyboardInterrupt:
    print("mtf_th%s: interrupted" % (" " + argv[0] if argv else ""),
          file=sys.stderr)
    code = 130
  # Stopping (otherwise both are SIG_DFL by now and this changes nothing):
  # Python's exit puts its handlers back to the default action, and a
  # second signal (which _second ignores) would kill it there.
  _handle_both(signal.SIG_IGN)
  if code == 130 and _stop_signal == signal.SIGTERM:
    code = 128 + signal.SIGTERM
  if stops.hard_exit_wanted():  # a thread still waits inside TensorFlow:
    stops.end(None, code)  # Python's exit would abort ("terminate called")
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
