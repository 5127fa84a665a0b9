"""Predicted (memory.py) vs measured memory of one training step, on CPU.

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/memory.py

For each configuration of CONFIGS (variants, heads, lengths, meshes,
strategies, optimizers): a decoder-only LM (memory_measure.StepGraph)
takes one training step on logical CPU devices; the measured figure is the
largest device's slice variables + its allocator peak during the step
(memory_measure's docstring says how and why), the predicted one
memory.predict(..., impl="mtf_th_float32") for the same model and mesh.
Columns: measured and predicted bytes per device, ratio = predicted /
measured, and mesh-tensorflow's auto_mtf MemoryEstimator on the same mtf
graph (the peak of its per-device tensor sizes under the graph's own
schedule, memory_measure.auto_mtf_peak) with its ratio to the measurement.
The last line gives the worst |ratio - 1| of each.  docs/costs.md records
a run.  --format csv for a CSV table.
"""
import argparse
import sys

from mtf_talking_heads import compat

C = None  # memory_measure.MeasureConfig, bound in main()

# (name, MeasureConfig kwargs): every variant, 4-16 heads, length 16-64,
# 1-4 devices, the split strategies, Adafactor and Adam.
CONFIGS = (
    ("mh_h4_n32_1", dict(variant="multi_head", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("th_h4_n32_1", dict(variant="talking_heads", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("pl_h4_n32_1", dict(variant="project_logits", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("pw_h4_n32_1", dict(variant="project_weights", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("th_h8_n32_m2", dict(variant="talking_heads", heads=8, length=32,
                          mesh_shape="model:2")),
    ("th_h4_n64_m2", dict(variant="talking_heads", heads=4, length=64,
                          mesh_shape="model:2")),
    ("mh_h8_n64_m4", dict(variant="multi_head", heads=8, length=64,
                          mesh_shape="model:4")),
    ("th_h8_n16_b2m2", dict(variant="talking_heads", heads=8, length=16,
                            mesh_shape="batch:2,model:2")),
    ("gth_h8_g2_n32_m2", dict(variant="grouped_talking_heads", heads=8,
                              groups=2, length=32, mesh_shape="model:2")),
    ("dp_h4_n32_m2", dict(variant="talking_heads", heads=4, length=32,
                          dynamic=("x2l", "m2w"), mesh_shape="model:2")),
    ("th_h4_n32_b2", dict(variant="talking_heads", heads=4, length=32,
                          mesh_shape="batch:2")),
    ("th_h8_n32_m4_bsplit", dict(variant="talking_heads", heads=8, length=32,
                                 mesh_shape="model:4",
                                 strategy="batch_split")),
    ("th_h8_n32_m2_qsplit", dict(variant="talking_heads", heads=8, length=32,
                                 mesh_shape="model:2",
                                 strategy="query_split")),
    ("mh_h16_n64_m2_adam", dict(variant="multi_head", heads=16, length=64,
                                mesh_shape="model:2", optimizer="adam")),
)
BASE = dict(d_k=16, num_layers=2, d_model=32, d_ff=64, vocab=128, batch=8)
COLUMNS = ("config", "measured", "predicted", "ratio", "auto_mtf",
           "auto_mtf_ratio")


def rows(names=None):
  """[(name, measured bytes, predicted bytes, auto_mtf bytes)]."""
  from mtf_talking_heads import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import memory_measure  # pylint: disable=g-import-not-at-top
  out = []
  for name, kw in CONFIGS:
    if names and name not in names:
      continue
    config = memory_measure.MeasureConfig(**dict(BASE, **kw))
    graph = memory_measure.StepGraph(config)
    try:
      measured = memory_measure.measure(config, graph)["peak_bytes"]
      estimated = memory_measure.auto_mtf_peak(graph)
    finally:
      graph.close()
    predicted = memory.predict(memory_measure.attention_model(config),
                               config.mesh_shape, "mtf_th_float32",
                               strategy=config.strategy)["total"]
    out.append((name, measured, predicted, estimated))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--format", choices=("md", "csv"), default="md")
  parser.add_argument("--config", action="append",
                      help="only these CONFIGS names (repeatable)")
  args = parser.parse_args(argv)
  compat.split_cpu(4)
  from mtf_talking_heads import commands  # pylint: disable=g-import-not-at-top
  table = rows(args.config)
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
