"""The `mtf_th` console script: one subcommand per module in commands/.

Each subcommand module defines ``main(argv)`` (argv without the program and
subcommand names) and a one-line module docstring shown by ``mtf_th --help``.
Modules are imported lazily so `mtf_th costs` does not pay for TensorFlow.
"""
import importlib
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
  sys.exit(main())
