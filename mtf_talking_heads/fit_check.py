"""The pre-flight memory warning of `mtf_th train` and launch/tpu.py.

Pure Python (no TensorFlow): reads the model, mesh_shape, layout,
activation_dtype and dropout_rate from the gin files as `mtf_th plan`
does, predicts the memory per device of one training step (memory.py,
for every sharding strategy that applies: the layers' default, Auto, may
pick any) and, if even the smallest does not fit the target hardware
with planner.DEFAULT_MARGIN left free, returns one warning line naming
the plan command that lists what would fit.
"""
import shlex

from mtf_talking_heads import memory
from mtf_talking_heads import perf
from mtf_talking_heads import planner


def _config(gin_files, gin_params):
  from mtf_talking_heads import gin_paths  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import gin_text as gin_reader  # pylint: disable=g-import-not-at-top
  return gin_reader.GinConfig(gin_files, gin_params, gin_paths.gin_dir())


def smallest(gin_files, gin_params, hardware):
  """(bytes per device of the best strategy, mesh_shape, devices), or None
  when the gin files are not a model perf.py reads or the mesh has other
  axes than batch and model."""
  try:
    model = perf.model_from_gin(gin_files, gin_params)
    config = _config(gin_files, gin_params)
    mesh_shape = config.get("mesh_shape", "model:1")
    mesh = perf.parse_mesh(mesh_shape)
    layout = config.get("layout", None)
    impl = ("mtf_th_float32" if hardware == "cpu" or config.get(
        "activation_dtype", "float32") == "float32" else "mtf_th")
    dropout = bool(config.get("dropout_rate", 0.0))
  except (ValueError, TypeError, KeyError):
    return None
  b, p = model.batch // mesh["batch"], mesh["model"]
  totals = []
  for strategy in planner.STRATEGIES:
    if all(planner.applies(strategy, att, b, n, p)
           for _, att, n, _ in planner.attentions(model)):
      try:
        totals.append(memory.predict(model, mesh_shape, impl, strategy,
                                     dropout=dropout, layout=layout)["total"])
      except ValueError:
        continue
  if not totals:
    return None
  return min(totals), mesh_shape, mesh["batch"] * mesh["model"]


def warning(prog, gin_files, gin_params, hardware, devices=None):
  """One line if the run is predicted not to fit `hardware`, else None.

  Args:
    prog: the command that warns ("mtf_th train").
    gin_files, gin_params: what the run parses.
    hardware: a perf hardware name (the slice's TPU generation, or cpu).
    devices: mtf devices of the target (None: the mesh's).
  """
  if not gin_files:
    return None
  found = smallest(gin_files, gin_params, hardware)
  if found is None:
    return None
  total, mesh_shape, mesh_devices = found
  devices = devices or mesh_devices
  usable = planner.usable_bytes(hardware, devices)
  if total <= usable:
    return None
  plan = ["mtf_th", "plan"] + sum((["--gin_file", f] for f in gin_files),
                                  []) + ["--hardware", hardware, "--devices",
                                         str(devices)]
  return ("%s: warning: predicted %.2f GiB per device for mesh %s on %s, "
          "more than the %.2f GiB usable (%d%% left free); it may run out "
          "of memory: see %s" % (
              prog, total / memory.GiB, mesh_shape, hardware,
              usable / memory.GiB, round(100 * planner.DEFAULT_MARGIN),
              " ".join(shlex.quote(a) for a in plan)))
