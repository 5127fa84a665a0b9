"""auto_mtf.layout_and_mesh_shape's choice vs mtf_th plan's, on small LMs.

  PYTHONPATH=$PWD <a venv with ortools> benchmarks/auto_mtf_layout.py

Needs ortools (auto_mtf's CP-SAT layout optimizer), which the pinned stack
does not install; ortools 9.7.2996 installs beside it without changing any
pin (docs/costs.md).  For each configuration of CONFIGS (a decoder-only LM
step graph, memory_measure.StepGraph's model, not lowered) auto_mtf picks
the mesh shape and layout that minimise its own peak-memory estimate over
the devices; the line gives its layout and estimate, memory.py's prediction
for the mesh it chose when that is a batch x heads layout memory.py knows,
and the planner's fastest fitting candidate on cpu with its memory.
"""
import sys

from mtf_talking_heads import compat

CONFIGS = (
    ("th_h8_n32", dict(variant="talking_heads", heads=8, length=32,
                       mesh_shape="model:4")),
    ("mh_h8_n32", dict(variant="multi_head", heads=8, length=32,
                       mesh_shape="model:4")),
)
BASE = dict(d_k=16, num_layers=2, d_model=32, d_ff=64, vocab=128, batch=8)


def main():
  compat.split_cpu(4)
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import auto_mtf  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import memory_measure  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import planner  # pylint: disable=g-import-not-at-top
  for name, kw in CONFIGS:
    config = memory_measure.MeasureConfig(**dict(BASE, **kw))
    graph = memory_measure.StepGraph(config)
    layout, mesh = auto_mtf.layout_and_mesh_shape(graph.mtf_graph, 4,
                                                  [graph.mtf_loss])
    estimator = memory_measure.load_auto_mtf("memory_estimator")
    optimizer = memory_measure.load_auto_mtf("layout_optimizer")
    value = optimizer.LayoutOptimizer(estimator.MemoryEstimator(
        graph.mtf_graph, mesh, [graph.mtf_loss])).evaluate_layout(
            ";".join("%s:%s" % p for p in sorted(layout._pairs)))  # pylint: disable=protected-access
    model = memory_measure.attention_model(config)
    best = [c for c in planner.plan(model, "cpu", 4) if c.fits][0]
    print("%s: auto_mtf mesh %s layout %s, its estimate %d bytes/device; "
          "planner: %s %s, %d bytes/device, %.4f s" % (
              name, mtf.convert_to_shape(mesh), ";".join(
                  "%s:%s" % p for p in sorted(layout._pairs)),  # pylint: disable=protected-access
              value, best.mesh_shape, best.strategy, best.memory["total"],
              best.step_s))
    graph.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
