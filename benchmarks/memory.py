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
scheduler, memory_measure.auto_mtf_peak) with its ratio to the measurement.
The last line gives the worst |ratio - 1| of each.  docs/costs.md records
a run.  --format csv for a CSV table.  --forward: an eval's forward pass
(the loss only: no gradients, no optimizer) against memory.predict_forward,
the figure `mtf_th eval` and `decode` check before they start (the
recomputed-core row is then the same graph as the one without).
"""
import argparse
import sys

from mtf_talking_heads import compat

COLUMNS = ("config", "measured", "predicted", "ratio", "auto_mtf",
           "auto_mtf_ratio")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--format", choices=("md", "csv"), default="md")
  parser.add_argument("--config", action="append",
                      help="only these CONFIGS names (repeatable)")
  parser.add_argument("--forward", action="store_true",
                      help="an eval's forward pass against "
                      "memory.predict_forward, not a training step")
  args = parser.parse_args(argv)
  compat.split_cpu(4)
  from mtf_talking_heads import commands  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import memory_measure  # pylint: disable=g-import-not-at-top
  table = memory_measure.compare(args.config, forward=args.forward)
  cells = [(n, m, int(p), "%.3f" % (p / m), int(a), "%.3f" % (a / m))
           for n, m, p, a in table]
  sys.stdout.write(commands.format_table(COLUMNS, cells, args.format,
                                         text_columns=("config",)))
  worst = max(table, key=lambda r: abs(r[2] / r[1] - 1))
  worst_a = max(table, key=lambda r: abs(r[3] / r[1] - 1))
  print("\nworst memory.py: %s, predicted / measured = %.3f; worst auto_mtf: "
        "%s, %.3f" % (worst[0], worst[2] / worst[1], worst_a[0],
                      worst_a[3] / worst_a[1]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
