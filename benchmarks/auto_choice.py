"""Where Auto's pick by predicted time differs from its old pick by bytes.

  PYTHONPATH=$PWD .venv/bin/python benchmarks/auto_choice.py

For every row of every paper table (gin/experiments/*, model.experiment_rows,
at the paper's batch), every attention placement that a split strategy can
run, on the meshes launch/tpu.py gives a v3-8 and a v3-32 (model:8,
batch:4 x model:8; also model:32, batch:2 x model:16) of tpu_v2 and tpu_v3:
the strategy with the fewest predicted ring bytes (what strategies.Auto ran
before it ranked by time) and what it runs now (planner.price_layer and
planner.pick, with the row's memory.py prediction).  Prints one line per
placement whose pick differs and a count.  TensorFlow is not imported:
Auto's candidates are priced with prices.predict on the heads-parallel
layout plus core_shard:model, the layout Auto prices with.
"""
import argparse
import sys

from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import strategy_table

HARDWARE = ("tpu_v2", "tpu_v3")
MESHES = ((1, 8), (4, 8), (1, 32), (2, 16))


def picks(model, att, n, m, groups, p, hardware):
  """(fewest-bytes pick, Auto's pick, fits) of one attention placement."""
  dims = prices.named_dims(att, model.d_model)
  mesh = prices.Layout("batch:%d;model:%d" % (groups, p),
                       [(prices.BATCH, "batch")] +
                       prices.heads_parallel_layout(dims) +
                       [("core_shard", "model")])
  b = model.batch // groups
  rings = {s: prices.predict(s, dims, mesh, model.batch, n, model.d_model,
                             att.dynamic, "model", m)
           for s in strategy_table.NAMES
           if planner.applies(s, att, b, n, p)}
  by_bytes = min(rings, key=lambda s: (rings[s], list(rings).index(s)))
  priced = planner.price_layer(
      rings, att, model.d_model, n, m, b, p, hardware, model=model,
      mesh_shape="batch:%d,model:%d" % (groups, p),
      layout=planner.layout(model, p))
  best, fits = planner.pick(priced, planner.usable_bytes(hardware,
                                                         groups * p))
  return by_bytes, best.name, fits


def main(argv=None):
  import os  # pylint: disable=g-import-not-at-top
  argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(
      argv)
  root = os.path.join(gin_paths.gin_dir(), "experiments")
  total = changed = 0
  for table in sorted(d for d in os.listdir(root)
                      if os.path.isdir(os.path.join(root, d))):
    for name, _, model in model_lib.experiment_rows(table):
      for hardware in HARDWARE:
        for groups, p in MESHES:
          if model.batch % groups:
            continue
          for placement, att, n, m in planner.attentions(model):
            if planner.split_only_heads(att):
              continue
            total += 1
            before, after, fits = picks(model, att, n, m, groups, p,
                                        hardware)
            if before != after:
              changed += 1
              print("%s/%s %s batch:%d,model:%d %s: %s -> %s%s" % (
                  table, name, hardware, groups, p, placement, before, after,
                  "" if fits else " (nothing fits: the smallest)"))
  print("%d of %d placements changed" % (changed, total))
  return 0


if __name__ == "__main__":
  sys.exit(main())
