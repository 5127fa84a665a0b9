"""The pre-flight memory check of `mtf_th train`, finetune and launch/tpu.py.

Pure Python (no TensorFlow): reads the model, mesh_shape, layout,
activation_dtype and dropout_rate from the gin files as `mtf_th plan`
does, predicts the memory per device of one training step (memory.py,
for every sharding strategy that applies: the layers' default, Auto, may
pick any; and heads-parallel with its core recomputed when the gin files
bind mtf_th.RecomputeCore to a layer's strategy; with the fused core on CPU
unless the gin files bind mtf_th.core_kernel.kind = "einsum", kernel_of)
and, if even the smallest
does not fit the target hardware with planner.DEFAULT_MARGIN left free,
gives one line naming the plan command that lists what would fit: a warning
for a TPU slice (warning(), launch/tpu.py), the reason to refuse a run on
this machine's CPU (cpu_refusal(), `mtf_th train` and `mtf_th finetune`
before any graph is built: the logical CPU devices share the host's RAM).
"""
import shlex

from mtf_talking_heads.core import gin_text
from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import strategy_table


def _recomputes(config):
  """True if a binding of the gin files makes some layer's strategy
  RecomputeCore (e.g. `mtf_th.TalkingHeadsAttention.strategy =
  @mtf_th.RecomputeCore()`, or gin's short name `@RecomputeCore()`)."""
  return any(isinstance(value, gin_text.Reference)
             and value.name.split(".")[-1] == "RecomputeCore"
             for value in (config.binding(key) for key in
                           config.binding_keys()
                           if key.endswith(".strategy")))


def kernel_of(config, hardware):
  """The attention core's kernel a run of `config` (a gin_text.GinConfig)
  uses on `hardware`, for memory.predict: "fused" unless the gin binds
  mtf_th.core_kernel.kind = "einsum" or the run is on a TPU (which keeps
  the einsum core).  memory.predict fuses only the layers the fused core
  applies to; "auto" is taken to load the op (make venv builds it)."""
  kind = config.binding("mtf_th.core_kernel.kind", "auto")
  return "fused" if hardware == "cpu" and kind != "einsum" else "einsum"


def applicable(model, mesh):
  """The strategies of strategy_table.NAMES that apply to every attention
  layer of `model` on `mesh` (model.parse_mesh's dict): those Auto may
  pick, or a gin may bind."""
  b, p = model.batch // mesh["batch"], mesh["model"]
  return [strategy for strategy in strategy_table.NAMES
          if all(planner.applies(strategy, att, b, n, p)
                 for _, att, n, _ in planner.attentions(model))]


def _smallest_total(predict, options):
  """The smallest predict(*option)["total"] of `options`, or None when
  there is none or memory.py models none of them (ValueError)."""
  totals = []
  for option in options:
    try:
      totals.append(predict(*option)["total"])
    except ValueError:
      continue
  return min(totals) if totals else None


def smallest_forward(model, mesh_shape, impl, layout=None, decode=False,
                     kernel="einsum"):
  """memory.predict_forward's smallest total over the applicable
  strategies (bytes per device), or None when none applies; kernel as
  memory.predict_forward's (kernel_of)."""
  return _smallest_total(
      lambda strategy: memory.predict_forward(model, mesh_shape, impl,
                                              layout, strategy, decode,
                                              kernel=kernel),
      [(s,) for s in applicable(model, model_lib.parse_mesh(mesh_shape))])


def smallest(gin_files, gin_params, hardware, vocab=None):
  """(bytes per device of the best strategy, mesh_shape, devices), or None
  when the gin files are not a model model.py reads or the mesh has other
  axes than batch and model.

  vocab: the padded vocabulary dim the run computes with, as `mtf_th plan`
  prices it (commands/vocabulary.priced_vocab: the gin files' task's; estimate/
  reads no task); None: T5's 32128.
  """
  try:
    model = model_lib.model_from_gin(
        gin_files, gin_params, vocab=vocab or model_lib.PAPER_T5["vocab"])
    config = gin_text.GinConfig(gin_files, gin_params)
    mesh_shape = config.get("mesh_shape", "model:1")
    mesh = model_lib.parse_mesh(mesh_shape)
    layout = config.get("layout", None)
    impl = ("mtf_th_float32" if hardware == "cpu" or config.get(
        "activation_dtype", "float32") == "float32" else "mtf_th")
    dropout = bool(config.get("dropout_rate", 0.0))
    recompute = _recomputes(config)
    kernel = kernel_of(config, hardware)
  except (ValueError, TypeError, KeyError):
    return None
  options = [(strategy, False) for strategy in applicable(model, mesh)]
  if recompute:
    options.append(("heads_parallel", True))
  total = _smallest_total(
      lambda strategy, recomputed: memory.predict(
          model, mesh_shape, impl, strategy, recompute=recomputed,
          dropout=dropout, layout=layout, kernel=kernel, packed=True),
      options)
  if total is None:
    return None
  return total, mesh_shape, mesh["batch"] * mesh["model"]


def _excess(gin_files, gin_params, hardware, devices, vocab=None):
  """(total, usable, mesh_shape, devices) if the prediction does not fit."""
  if not gin_files:
    return None
  found = smallest(gin_files, gin_params, hardware, vocab)
  if found is None:
    return None
  total, mesh_shape, mesh_devices = found
  devices = devices or mesh_devices
  usable = planner.usable_bytes(hardware, devices)
  if total <= usable:
    return None
  return total, usable, mesh_shape, devices


def _plan_command(gin_files, hardware, devices):
  plan = ["mtf_th", "plan"] + sum((["--gin_file", f] for f in gin_files),
                                  []) + ["--hardware", hardware, "--devices",
                                         str(devices)]
  return " ".join(shlex.quote(a) for a in plan)


def warning(prog, gin_files, gin_params, hardware, devices=None,
            vocab=None):
  """One line if the run is predicted not to fit `hardware`, else None.

  Args:
    prog: the command that warns ("launch/tpu.py").
    gin_files, gin_params: what the run parses.
    hardware: a hardware.py name (the slice's TPU generation).
    devices: mtf devices of the target (None: the mesh's).
    vocab: the padded vocabulary (smallest's; None: T5's).
  """
  excess = _excess(gin_files, gin_params, hardware, devices, vocab)
  if excess is None:
    return None
  total, usable, mesh_shape, devices = excess
  return ("%s: warning: predicted %.2f GiB per device for mesh %s on %s, "
          "more than the %.2f GiB usable (%d%% left free); it may run out "
          "of memory: see %s" % (
              prog, total / memory.GiB, mesh_shape, hardware,
              usable / memory.GiB, round(100 * planner.DEFAULT_MARGIN),
              _plan_command(gin_files, hardware, devices)))


def cpu_refusal(gin_files, gin_params, vocab=None):
  """Why a training run on this machine's CPU cannot fit, or None.

  The prediction per logical CPU device against this host's RAM shared by
  the mesh's devices (memory.device_memory("cpu", devices)), with
  planner.DEFAULT_MARGIN left free; vocab as smallest's.
  """
  excess = _excess(gin_files, gin_params, "cpu", None, vocab)
  if excess is None:
    return None
  total, usable, mesh_shape, devices = excess
  ram = memory.device_memory("cpu") / memory.GiB
  return ("predicted %.2f GiB per device for mesh %s (%d device%s) but this "
          "machine's %.1f GiB of RAM leaves %.2f GiB usable per device (%d%% "
          "left free): give a smaller scale file (e.g. models/t5_tiny.gin) "
          "as the LAST --gin_file, or lower batch_size, the lengths, d_model "
          "or num_layers; see %s" % (
              total / memory.GiB, mesh_shape, devices,
              "" if devices == 1 else "s", ram, usable / memory.GiB,
              round(100 * planner.DEFAULT_MARGIN),
              _plan_command(gin_files, "cpu", devices)))
