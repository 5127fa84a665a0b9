"""Predicted (memory.py) vs measured memory of one training step, on CPU.

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/memory.py

For each configuration of memory_measure.CONFIGS (variants, heads,
lengths, meshes, strategies, optimizers): a decoder-only LM (memory_measure.StepGraph)
takes one training step on logical CPU devices; the measured figure is the
largest device's slice variables + its allocator peak during the step
(memory_measure's docstring says how and why), the predicted one
memory.predict(..., impl="mtf_th_float32") for the same model and mesh.
Columns: measured and predicted bytes per device, ratio = predicted /
measured, and mesh-tensorflow's auto_mtf MemoryEstimator on the same mtf
graph (the peak of its per-device tensor sizes under auto_mtf's own
scheduler, memory_measure.auto_mtf_peak) with its ratio to the measurement (einsum rows only: auto_mtf's estimator
does not read the fused core's graph).
The last line gives the worst |ratio - 1| of each.  docs/costs.md records
a run.  --format csv for a CSV table.  --processes N: each config in N
fresh processes, the median reported (measured_range: all N; the peak is
the same on every step of one session but moves between processes).
--forward: an eval's forward pass (the loss only: no gradients, no
optimizer) against memory.predict_forward, the figure `mtf_th eval` and
`decode` check before they start.
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys

from mtf_talking_heads.core import compat

COLUMNS = ("config", "measured", "predicted", "ratio", "auto_mtf",
           "auto_mtf_ratio")


def in_processes(args, count):
  """Every config measured in `count` fresh processes.

  A process's peak is the same on every step of its session but moves
  between processes, so each config's figure is the lower median of
  `count` processes.

  Args:
    args: main's parsed arguments (--forward, --config are passed on).
    count: the number of processes.
  Returns:
    [(name, median measured, [each process' measured], predicted,
    auto_mtf)], bytes per device.
  """
  runs = []
  for _ in range(count):
    argv = [sys.executable, os.path.abspath(__file__), "--format", "csv"]
    argv += ["--forward"] if args.forward else []
    for name in args.config or []:
      argv += ["--config", name]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
      raise SystemExit("benchmarks/memory.py: a measuring process failed: %s"
                       % proc.stderr.strip().splitlines()[-1:])
    lines = proc.stdout.splitlines()
    table = lines[lines.index(",".join(COLUMNS)):]
    runs.append(list(csv.DictReader(table[:table.index("")])))
  out = []
  for rows in zip(*runs):
    names = {r["config"] for r in rows}
    assert len(names) == 1 and len(set(map(len, runs))) == 1, names
    each = [int(r["measured"]) for r in rows]
    auto = rows[0]["auto_mtf"]
    out.append((rows[0]["config"], statistics.median_low(each), each,
                int(rows[0]["predicted"]), int(auto) if auto else None))
  return out


def _or_blank(value):
  """A cell: "" for no auto_mtf estimate (the fused core's rows)."""
  return "" if value is None else value


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--format", choices=("md", "csv"), default="md")
  parser.add_argument("--config", action="append",
                      help="only these CONFIGS names (repeatable)")
  parser.add_argument("--forward", action="store_true",
                      help="an eval's forward pass against "
                      "memory.predict_forward, not a training step")
  parser.add_argument("--processes", type=int, default=1, metavar="N",
                      help="measure each config in N fresh processes and "
                      "report the median (the range in its own column)")
  args = parser.parse_args(argv)
  if args.processes < 1:
    parser.error("--processes must be a positive integer, got %d"
                 % args.processes)
  from mtf_talking_heads import commands  # pylint: disable=g-import-not-at-top
  if args.processes > 1:
    table = in_processes(args, args.processes)
    columns = COLUMNS[:2] + ("measured_range",) + COLUMNS[2:]
    cells = [(n, m, "%d-%d" % (min(e), max(e)), p, "%.3f" % (p / m),
              _or_blank(a), _or_blank(a and "%.3f" % (a / m)))
             for n, m, e, p, a in table]
    table = [(n, m, p, a) for n, m, _, p, a in table]
  else:
    compat.split_cpu(4)
    from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
    try:
      table = memory_measure.compare(args.config, forward=args.forward)
    except ValueError as e:
      parser.error("--config: %s" % e)
    columns = COLUMNS
    cells = [(n, m, int(p), "%.3f" % (p / m), _or_blank(a and int(a)),
              _or_blank(a and "%.3f" % (a / m))) for n, m, p, a in table]
  sys.stdout.write(commands.format_table(columns, cells, args.format,
                                         text_columns=("config",)))
  worst = max(table, key=lambda r: abs(r[2] / r[1] - 1))
  line = ("\nworst memory.py: %s, predicted / measured = %.3f"
          % (worst[0], worst[2] / worst[1]))
  estimated = [r for r in table if r[3]]
  if estimated:
    worst_a = max(estimated, key=lambda r: abs(r[3] / r[1] - 1))
    line += "; worst auto_mtf: %s, %.3f" % (worst_a[0],
                                            worst_a[3] / worst_a[1])
  print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
