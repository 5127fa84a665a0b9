"""auto_mtf.layout_and_mesh_shape's choice vs mtf_th plan's, on LMs.

  PYTHONPATH=$PWD <a venv with ortools> benchmarks/auto_mtf_layout.py [NAME ...]

Needs ortools (auto_mtf's CP-SAT layout optimizer), which the pinned stack
does not install; ortools 9.7.2996 installs beside it without changing any
pin (docs/costs.md).  For each configuration of CONFIGS (a decoder-only LM
step graph, memory_measure.StepGraph's model, not lowered) auto_mtf picks
the mesh shape and layout that minimise its own peak-memory estimate over
the devices; the line gives its mesh, layout and estimate, and the
planner's first candidate on tpu_v3 (the fastest that fits) with its
memory.py prediction and step time.  auto_mtf optimises memory only; it
has no step time to compare.
"""
import argparse
import sys

from mtf_talking_heads import compat

SMALL = dict(d_k=16, num_layers=2, d_model=32, d_ff=64, vocab=128, batch=8,
             length=32, heads=8, mesh_shape="model:4")
# the paper's T5 dims as a decoder-only LM (12 layers, length 512, batch 128)
PAPER = dict(d_k=32, heads=24, num_layers=12, d_model=768, d_ff=3072,
             vocab=32128, batch=128, length=512, mesh_shape="model:8")
CONFIGS = (
    ("th_h8_n32", 4, dict(SMALL, variant="talking_heads")),
    ("mh_h8_n32", 4, dict(SMALL, variant="multi_head")),
    ("th_paper_lm", 8, dict(PAPER, variant="talking_heads")),
)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", metavar="NAME",
                      help="only these CONFIGS (default: all)")
  names = parser.parse_args(argv).names
  compat.split_cpu(4)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import auto_mtf  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import memory_measure  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import planner  # pylint: disable=g-import-not-at-top
  for name, devices, kw in CONFIGS:
    if names and name not in names:
      continue
    config = memory_measure.MeasureConfig(**kw)
    graph = memory_measure.StepGraph(config, lower=False)
    layout, mesh = auto_mtf.layout_and_mesh_shape(graph.mtf_graph, devices,
                                                  [graph.mtf_loss])
    estimator = memory_measure.load_auto_mtf("memory_estimator")
    optimizer = memory_measure.load_auto_mtf("layout_optimizer")
    value = optimizer.LayoutOptimizer(estimator.MemoryEstimator(
        graph.mtf_graph, mesh, [graph.mtf_loss])).evaluate_layout(
            ";".join("%s:%s" % p for p in sorted(layout._pairs)))  # pylint: disable=protected-access
    model = memory_measure.attention_model(config)
    best = planner.plan(model, "tpu_v3", devices)[0]
    print("%s: auto_mtf mesh %s layout %s, its estimate %d bytes/device; "
          "planner: %s %s, %d bytes/device, %.4f s" % (
              name, mtf.convert_to_shape(mesh), ";".join(
                  "%s:%s" % p for p in sorted(layout._pairs)),  # pylint: disable=protected-access
              value, best.mesh_shape,
              best.strategy + ("+recompute" if best.recompute else ""),
              best.memory["total"],
              best.step_s))
    graph.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
