"""Pre-flight: every check of the parsed configuration that needs no graph.

Owns preflight() and check_settings(): corpus paths, the task, the model's
layers against their gin arguments, the mesh against the devices, the layout
against the model's dims, divisibility of split dims, and sequence lengths
(position table, span corruption), each failure a ConfigError naming the
parameter and the fix.
"""
import difflib

import mesh_tensorflow as mtf

from mtf_talking_heads.core import spec
from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn import models
from mtf_talking_heads.nn import optimizers
from mtf_talking_heads.nn import strategies
from mtf_talking_heads.nn import validation
from mtf_talking_heads.training import cluster as training_cluster
from mtf_talking_heads.training import devices
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import settings as settings_lib


def _mesh_axis_of(settings, dim_name):
  """(mesh dim) a tensor dim named dim_name is split over, or None."""
  if settings.mesh_shape is None:
    return None
  axis = settings.layout.tensor_dimension_to_mesh_axis(
      mtf.Dimension(dim_name, 0), settings.mesh_shape)
  return None if axis is None else settings.mesh_shape.dims[axis]


def check_settings(settings, description, num_devices=None):
  """Every check that needs no graph.  Raises ConfigError naming the fix."""
  mesh = settings.mesh_shape
  dims = dict(description.dims)
  dims["batch"] = settings.batch_size
  dims["outer_batch"] = 1
  # -- devices
  if mesh is not None and num_devices is not None and mesh.size > num_devices:
    raise errors.ConfigError(
        "mesh_shape %s needs %d devices but only %d %s available: choose a "
        "smaller mesh (e.g. mesh_shape = 'model:%d')%s" % (
            mesh, mesh.size, num_devices,
            "is" if num_devices == 1 else "are", num_devices,
            "" if settings.tpu else
            " or raise mtf_th.mesh_devices.max_cpu_devices"))
  # -- layout names dims of this model
  model_dims = set(dims) | set(models.MTF_GENERIC_DIMS)
  for _, layer in models.attention_layers(description):
    # a sharding strategy's own dims (e.g. core_shard of BatchSplit);
    # GeneralBilinearAttention has no strategy
    strategy = getattr(layer, "strategy", None)
    if strategy is not None:
      model_dims.update(name for name, _ in strategy.layout_rules())
  # every rule names a mesh axis of the mesh (or batch / model) and a dim
  # of this model: a misspelt one would be ignored, training unsharded
  try:
    spec.check_layout_names(
        validation.parse_layout(settings.layout),
        [] if mesh is None else mesh.dimension_names, model_dims,
        what="layout %r (the layout macro or utils.run.layout_rules):"
        % settings.layout_string)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
  # -- divisibility of split dims
  if mesh is not None:
    seen = {}
    for name, size in sorted(dims.items()):
      axis = _mesh_axis_of(settings, name)
      if axis is None or size is None:
        continue
      if size % axis.size:
        what = ("batch_size %d" % size if name == "batch" else
                "dimension %r (size %d)" % (name, size))
        fix = ("set batch_size to a multiple of %d" % axis.size
               if name == "batch" else
               "choose sizes divisible by %d or drop %s:%s from the layout"
               % (axis.size, name, axis.name))
        raise errors.ConfigError(
            "%s is not divisible by mesh dimension %s:%d (layout %s:%s): %s."
            % (what, axis.name, axis.size, name, axis.name, fix))
      seen[name] = axis
    # Two dims of one attention tensor (e.g. P_l[heads_k, heads]) on one
    # mesh axis: validation checks every weight and activation of the layer.
    # (Sequence lengths are checked below; here they only size tensors.)
    lengths = [v for v in settings.sequence_length.values()
               if isinstance(v, int) and v > 0] or [1]
    for (_, layer) in models.attention_layers(description):
      try:
        validation.check_layers(
            [layer], dims["d_model"], mesh, settings.layout, dims["batch"],
            dims.get("length") or lengths[-1],
            memory_length=dims.get("memory_length") or lengths[0],
            strict=False)
      except ValueError as e:
        raise errors.ConfigError(
            "%s (layout %r)" % (e, settings.layout_string)) from e
      _check_strategy(layer, settings, dims["batch"],
                      dims.get("length") or lengths[-1])
  # -- sequence lengths
  lengths = settings.sequence_length
  for key in ("inputs", "targets"):
    value = lengths.get(key)
    if settings.model_type in ("lm",) and key == "inputs":
      continue
    errors.positive_int("sequence_length[%r]" % key, value,
                        " (macros inputs_length / targets_length)")
  if settings.model_type == "aligned" and lengths["inputs"] != lengths["targets"]:
    raise errors.ConfigError(
        "an aligned (BERT/ALBERT) model needs inputs and targets of one "
        "length, got %s: set targets_length = %%inputs_length" % lengths)
  if description.positional_embedding and description.max_length is not None:
    longest, what = max(lengths.values()), ""
    fix = "raise max_length or shorten inputs_length"
    if settings.model_type == "delimited_lm":  # "<inputs> EOS <targets> EOS"
      longest = lengths["inputs"] + lengths["targets"]
      what = " (inputs_length + targets_length)"
      fix = ("shorten inputs_length (a fine-tuned model keeps the table of "
             "its pre-training)")
    if longest > description.max_length:
      raise errors.ConfigError(
          "sequence length %d%s does not fit the position embedding table "
          "(Unitransformer.max_length = %d): %s"
          % (longest, what, description.max_length, fix))
  _check_span_lengths(settings)
  axis = _mesh_axis_of(settings, "length")
  if axis is not None:
    for key, value in lengths.items():
      if value % axis.size:
        raise errors.ConfigError(
            "sequence_length[%r] = %d is not divisible by mesh dimension %s:%d "
            "(layout length:%s)" % (key, value, axis.name, axis.size,
                                    axis.name))


def _check_strategy(layer, settings, batch, length):
  """The layer's sharding strategy's own check (e.g. BatchSplit: batch % P)."""
  strategy = getattr(layer, "strategy", None)
  if strategy is None or not hasattr(strategy, "check"):
    return
  mesh_shape = ";".join("%s:%d" % (d.name, d.size)
                        for d in settings.mesh_shape.dims)
  try:
    strategy.check(layer.dims, mesh_shape, settings.layout_string or "",
                   batch, length)
  except ValueError as e:
    raise errors.ConfigError("%s (strategy %s, mesh_shape %r, layout %r)" % (
        e, type(strategy).__name__, mesh_shape, settings.layout_string)) from e


def check_core_kernel(settings, description, train):
  """mtf_th.core_kernel.kind = "fused" where the fused core cannot run:
  one ConfigError naming why (nn/core_kernel.check_before_graph)."""
  mesh = None
  if settings.mesh_shape is not None:
    mesh = strategies.MeshLayout(settings.mesh_shape, settings.layout)
  lengths = [v for v in settings.sequence_length.values()
             if isinstance(v, int) and v > 0] or [1]
  try:
    core_kernel.check_before_graph(
        [layer for _, layer in models.attention_layers(description)], mesh,
        models.query("utils.get_variable_dtype.activation_dtype", "float32"),
        train, bool(settings.tpu), settings.batch_size or 1, max(lengths))
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e


def _check_span_lengths(settings):
  """Span corruption: the targets must hold the dropped spans."""
  density = models.query("noise_density")
  span = models.query("mean_noise_span_length")
  if settings.model_type != "bitransformer" or not density or not span:
    return
  if "span" not in str(settings.mixture or ""):
    return
  from t5.data import preprocessors  # pylint: disable=g-import-not-at-top
  inputs = settings.sequence_length["inputs"]
  try:
    _, targets_needed = preprocessors.random_spans_helper(
        inputs_length=inputs, noise_density=density,
        mean_noise_span_length=span, extra_tokens_per_span_inputs=1,
        extra_tokens_per_span_targets=1)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.ConfigError("span corruption cannot make inputs of %d tokens "
                             "(noise_density %s, mean_noise_span_length %s): %s"
                             % (inputs, density, span, e)) from e
  if settings.sequence_length["targets"] < targets_needed:
    raise errors.ConfigError(
        "targets_length %d is too short for span corruption of %d input "
        "tokens (noise %s, mean span %s needs %d): set targets_length = %d"
        % (settings.sequence_length["targets"], inputs, density, span,
           targets_needed, targets_needed))


def _check_corpus():
  """The th_* tasks' corpus paths (missing or empty files)."""
  try:
    from mtf_talking_heads.data import corpus  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  try:
    corpus.configured_corpus()
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e


def preflight(tpu=None):
  """Reads and checks the parsed configuration; returns (settings, description)."""
  settings = settings_lib.Settings(tpu=tpu)
  _check_corpus()
  _check_task(settings.mixture)
  try:
    description = models.describe(settings.model_type,
                                  settings_lib.vocab_size())
  except errors.ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise errors.ConfigError(  # gin adds "In call to configurable" lines
        "the model's layers reject their gin arguments: %s"
        % (str(e).strip().splitlines() or [""])[0]) from e
  num_devices = None if tpu else devices.available_cpu_devices()
  training_cluster.check_mesh_size(settings.mesh_shape)  # --cluster: equal
  check_settings(settings, description, num_devices)
  try:
    optimizers.check_settings()
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
  return settings, description


def _check_task(name):
  if not name:
    raise errors.ConfigError("no task: bind MIXTURE_NAME (objectives/*.gin do)")
  import seqio  # pylint: disable=g-import-not-at-top
  try:
    seqio.get_mixture_or_task(name)
  except ValueError:
    known = sorted(t for t in seqio.MixtureRegistry.names()) + sorted(
        seqio.TaskRegistry.names())
    close = difflib.get_close_matches(name, known, n=3)
    raise errors.ConfigError(
        "MIXTURE_NAME %r is not a registered task or mixture%s" % (
            name, (" (did you mean %s?)" % " or ".join(close)) if close else
            "; this package registers th_span_corruption, th_mlm and "
            "th_finetune_squad_glue_superglue")) from None
