"""Train, evaluate, decode and fine-tune the paper's models, from gin only.

Python API (the ``mtf_th`` commands call these):

  train(model_dir, gin_files, gin_params, train_steps=None)
      trains up to global step train_steps (default: the configuration's
      utils.run.train_steps), resuming from the latest checkpoint in
      model_dir and skipping the batches it has already seen, so a resumed
      run follows the same loss curve as an uninterrupted one.
  evaluate(model_dir, gin_files, gin_params, checkpoint_steps=None)
      -> [dict(step, split, ln_ppl, tokens)]: held-out ln(PPL), the mean
      token cross-entropy in nats over the split's target tokens.
  decode(model_dir, gin_files, gin_params, inputs=None) -> [dict(input, output)]
  finetune(model_dir, pretrained_model_dir, gin_files, gin_params)

How: mesh_tensorflow.transformer.utils.run builds the TPUEstimator exactly as
``t5_mesh_transformer`` would from the same gin (model, mesh, layout,
optimiser, schedule, batch, lengths); its ``train_model_fn`` hook receives
that estimator.  Our ``mtf_th.train_model`` (bound by gin/mtf_th.gin, so the
stock script uses it too) seeds the graph, exposes every logical CPU device
to the session, skips seen data and attaches progress.ProgressHook; eval and
decode pass their own function to the same hook.  On CPU the mesh is
PlacementMeshImpl over logical CPU devices; with ``tpu=...`` utils.run uses
SimdMeshImpl on the TPU slice.

Everything that can be checked before a graph exists is checked first (gin
files and bindings, corpus paths, mesh shape against devices, layout against
the model's dims, divisibility, sequence lengths), raising ConfigError (a
ValueError) that names the parameter and the fix.

Files written to model_dir: checkpoints (model.ckpt-N.*, written by TF's
Saver: data to a temporary name, then renamed, then the ``checkpoint`` index
updated, so a killed run never leaves a listed checkpoint half-written),
operative_config.gin, TensorBoard events (train; eval_<split>/), and the CSV
files of progress.py.
"""
import contextlib
import difflib
import functools
import os
import re
import sys

import gin
import gin.tf  # pylint: disable=unused-import  (GinConfigSaverHook)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import utils as mtf_utils
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads import compat
from mtf_talking_heads import layers  # pylint: disable=unused-import  (gin classes)
from mtf_talking_heads import models
from mtf_talking_heads import progress
from mtf_talking_heads import validation

DEFAULT_MAX_CPU_DEVICES = 64
_TRAIN_FN = "mtf_th.train_model"


class ConfigError(ValueError):
  """A configuration problem found before any graph is built."""


class TrainingError(RuntimeError):
  """An op failed while the graph ran (train, eval or decode).

  Not a configuration problem (ConfigError).  Raised after the first
  failure: nothing is retried, because only a lost remote TPU worker is a
  real preemption.  The message names the failing op, the cause and what to
  change; the model directory keeps its last checkpoint.
  """


class Interrupted(KeyboardInterrupt):
  """Ctrl-C during a run.

  Attributes:
    model_dir: the model directory.
    checkpoint_step: the step of its last complete checkpoint (None: none).
  """

  def __init__(self, model_dir, checkpoint_step):
    super().__init__(model_dir, checkpoint_step)
    self.model_dir = model_dir
    self.checkpoint_step = checkpoint_step


# --------------------------------------------------------------------------
# gin


def resolve_gin_file(name):
  """Absolute path of gin file `name` (a path, or relative to gin's search path).

  Raises:
    ConfigError: naming the file, the directories searched and close matches.
  """
  if not isinstance(name, str) or not name.strip():
    raise ConfigError("--gin_file is empty (%r): give a gin file such as "
                      "experiments/t5_heads/07_talking_heads_24_32.gin" % (name,))
  candidates = [name] if os.path.isabs(name) else (
      [name] + [os.path.join(p, name) for p in
                gin.config._LOCATION_PREFIXES if p])  # pylint: disable=protected-access
  for path in candidates:
    if os.path.isfile(path):
      return os.path.abspath(path)
  known = []
  try:
    known = models.list_gin_files()
  except FileNotFoundError:
    pass
  close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
  hint = (" Did you mean %s?" % " or ".join(close)) if close else ""
  raise ConfigError(
      "--gin_file %r: no such file (looked in the current directory and %s)."
      "%s Files shipped with mtf_talking_heads are listed by "
      "`ls %s`." % (name, ", ".join(p for p in gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
                                    if p) or "nowhere else", hint,
                    models.gin_dir()))


def parse_gin(gin_files=(), gin_params=(), extra_params=()):
  """Clears gin, then parses mtf's defaults.gin, gin_files and gin_params.

  Args:
    gin_files: gin file names (paths, or relative to gin/).
    gin_params: bindings such as "heads = 24" or "utils.run.train_steps = 10".
    extra_params: bindings applied after gin_params.
  Raises:
    ConfigError: for a missing file, an unknown/invalid binding, or a
      binding that the configuration ignores (gin_checks.check_params).
  """
  gin_files = list(gin_files or ())
  gin_params = list(gin_params or ()) + list(extra_params or ())
  gin.clear_config()
  models.register_gin_search_path()
  paths = [resolve_gin_file(f) for f in gin_files]
  for param in gin_params:
    if not isinstance(param, str) or "=" not in param:
      raise ConfigError(
          "--gin_param %r is not a binding: write name = value, e.g. "
          "--gin_param=\"utils.run.train_steps = 100\" or "
          "--gin_param=\"mesh_shape = 'model:4'\"" % (param,))
  with gin.unlock_config():
    gin.parse_config_file(models.MTF_DEFAULTS_GIN)
    for path in paths:
      try:
        gin.parse_config_file(path)
      except (ValueError, KeyError, TypeError, SyntaxError, ImportError,
              IOError) as e:
        raise ConfigError("gin file %s: %s" % (path, _gin_message(e)))
    for param in gin_params:
      try:
        gin.parse_config(param)
      except (ValueError, KeyError, TypeError, SyntaxError, ImportError) as e:
        raise ConfigError("--gin_param %r: %s" % (param, _gin_message(e)))
  from mtf_talking_heads import gin_checks  # pylint: disable=g-import-not-at-top
  try:  # a misspelt macro, a binding nothing uses
    gin_checks.check_params(gin_params)
  except ValueError as e:
    raise ConfigError(str(e))


def _gin_message(e):
  message = str(e).strip()
  if "No configurable matching" in message:
    message += (" (check the spelling; this package's layers are "
                "mtf_th.<Variant>Attention / mtf_th.<Variant>EncoderAttention, "
                "e.g. mtf_th.TalkingHeadsAttention.heads)")
  elif "doesn't have a parameter" in message or "has no parameter" in message:
    message += " (see the configurable's docstring for its parameters)"
  return message


# --------------------------------------------------------------------------
# settings and pre-flight checks


class Settings(object):
  """The run settings as bound in gin (what utils.run will receive).

  Attributes:
    model_type, mesh_shape (mtf.Shape or None on TPU with a gin function),
    layout (mtf.LayoutRules), batch_size (int), sequence_length (dict),
    train_steps (int), mixture (task or mixture name), vocab_size (int).
  """

  def __init__(self, tpu=None):
    self.tpu = tpu
    self.model_type = models.query("utils.run.model_type", "bitransformer")
    raw_mesh = models.query("utils.run.mesh_shape")
    self.mesh_shape = None
    if isinstance(raw_mesh, gin.config.ConfigurableReference):
      if not tpu:
        raise ConfigError(
            "utils.run.mesh_shape is bound to %s, which only works on a TPU; "
            "on CPU set it to a shape, e.g. --gin_param=\"mesh_shape = "
            "'model:4'\". (mtf's defaults.gin binds it; gin/mtf_th.gin, "
            "which every file in models/ and experiments/ includes, binds it "
            "to the mesh_shape macro: did you give only attention/ or "
            "*_tiny.gin files? Start --gin_file with a models/*_base.gin or "
            "an experiments/ file.)" % raw_mesh.selector)
    else:
      try:
        self.mesh_shape = mtf.convert_to_shape(raw_mesh)
      except (ValueError, TypeError) as e:
        raise ConfigError(
            "mesh_shape %r is not a mesh shape (%s): write it like 'model:8' "
            "or 'batch:2,model:4'" % (raw_mesh, e))
      if self.mesh_shape is None:
        raise ConfigError("mesh_shape is not set: bind utils.run.mesh_shape "
                          "(or the mesh_shape macro), e.g. 'model:1'")
      for d in self.mesh_shape.dims:
        if d.size < 1:
          raise ConfigError("mesh_shape %r: every mesh dimension needs a "
                            "size >= 1" % (raw_mesh,))
    raw_layout = models.query("utils.run.layout_rules")
    try:
      self.layout = mtf.convert_to_layout_rules(raw_layout or "")
    except (ValueError, TypeError) as e:
      raise ConfigError("layout %r is not a layout (%s): write it like "
                        "'batch:batch,heads:model'" % (raw_layout, e))
    self.layout_string = raw_layout
    self.batch_size = models.query("utils.run.batch_size")
    if isinstance(self.batch_size, (tuple, list)) and self.mesh_shape:
      self.batch_size = mtf_utils.compute_batch_size(
          self.sequence_length_or_none(), self.mesh_shape, self.layout,
          self.batch_size)
    if not isinstance(self.batch_size, int) or self.batch_size < 1:
      raise ConfigError("batch_size must be a positive integer, got %r "
                        "(macro batch_size / utils.run.batch_size)"
                        % (self.batch_size,))
    self.sequence_length = self.sequence_length_or_none()
    if self.sequence_length is None:
      raise ConfigError(
          "utils.run.sequence_length is not set: include an objective "
          "(objectives/span_corruption.gin or objectives/mlm.gin) or bind it")
    self.train_steps = models.query("utils.run.train_steps")
    self.mixture = models.query(
        "mesh_train_dataset_fn.mixture_or_task_name") or models.query(
            "MIXTURE_NAME")

  @staticmethod
  def sequence_length_or_none():
    value = models.query("utils.run.sequence_length")
    if isinstance(value, int):
      value = {"inputs": value, "targets": value}
    return value


def _mesh_axis_of(settings, dim_name):
  """(mesh dim) a tensor dim named dim_name is split over, or None."""
  if settings.mesh_shape is None:
    return None
  axis = settings.layout.tensor_dimension_to_mesh_axis(
      mtf.Dimension(dim_name, 0), settings.mesh_shape)
  return None if axis is None else settings.mesh_shape.dims[axis]


def available_cpu_devices(max_cpu_devices=None):
  """Logical CPU devices this process has or may still create."""
  if compat._LOGICAL_CPUS:  # pylint: disable=protected-access
    return len(compat._LOGICAL_CPUS)  # pylint: disable=protected-access
  if max_cpu_devices is None:
    max_cpu_devices = models.query("mtf_th.mesh_devices.max_cpu_devices",
                                   DEFAULT_MAX_CPU_DEVICES)
  return max_cpu_devices


def check_settings(settings, description, num_devices=None):
  """Every check that needs no graph.  Raises ConfigError naming the fix."""
  mesh = settings.mesh_shape
  dims = dict(description.dims)
  dims["batch"] = settings.batch_size
  dims["outer_batch"] = 1
  # -- devices
  if mesh is not None and num_devices is not None and mesh.size > num_devices:
    raise ConfigError(
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
  for tensor_dim, mesh_dim in settings.layout._pairs:  # pylint: disable=protected-access
    if tensor_dim not in model_dims:
      close = difflib.get_close_matches(tensor_dim, sorted(dims), n=2)
      raise ConfigError(
          "layout %r splits tensor dimension %r, which this model does not "
          "have%s. Its dimensions are: %s. Fix the layout macro (or "
          "utils.run.layout_rules)." % (
              settings.layout_string, tensor_dim,
              (" (did you mean %s?)" % " or ".join(close)) if close else "",
              ", ".join(sorted(d for d in dims if d))))
    if mesh is not None and mesh_dim not in mesh.dimension_names:
      tf.logging.info("layout rule %s:%s has no effect: mesh %s has no %r",
                      tensor_dim, mesh_dim, mesh, mesh_dim)
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
        raise ConfigError(
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
        raise ConfigError("%s (layout %r)" % (e, settings.layout_string))
  # -- sequence lengths
  lengths = settings.sequence_length
  for key in ("inputs", "targets"):
    value = lengths.get(key)
    if settings.model_type in ("lm",) and key == "inputs":
      continue
    if not isinstance(value, int) or value < 1:
      raise ConfigError(
          "sequence_length[%r] must be a positive integer, got %r (macros "
          "inputs_length / targets_length)" % (key, value))
  if settings.model_type == "aligned" and lengths["inputs"] != lengths["targets"]:
    raise ConfigError(
        "an aligned (BERT/ALBERT) model needs inputs and targets of one "
        "length, got %s: set targets_length = %%inputs_length" % lengths)
  if description.positional_embedding and description.max_length is not None:
    longest = max(lengths.values())
    if longest > description.max_length:
      raise ConfigError(
          "sequence length %d does not fit the position embedding table "
          "(Unitransformer.max_length = %d): raise max_length or shorten "
          "inputs_length" % (longest, description.max_length))
  _check_span_lengths(settings)
  axis = _mesh_axis_of(settings, "length")
  if axis is not None:
    for key, value in lengths.items():
      if value % axis.size:
        raise ConfigError(
            "sequence_length[%r] = %d is not divisible by mesh dimension %s:%d "
            "(layout length:%s)" % (key, value, axis.name, axis.size,
                                    axis.name))


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
    raise ConfigError("span corruption cannot make inputs of %d tokens "
                      "(noise_density %s, mean_noise_span_length %s): %s"
                      % (inputs, density, span, e))
  if settings.sequence_length["targets"] < targets_needed:
    raise ConfigError(
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
    raise ConfigError(str(e))


def _vocab_size():
  """Size of the configured vocabulary (builds the default one if needed)."""
  vocabulary = models.query("utils.run.vocabulary")
  if isinstance(vocabulary, gin.config.ConfigurableReference):
    with gin.unlock_config():
      vocabulary = vocabulary.scoped_configurable_fn()
  if vocabulary is None:
    raise ConfigError("utils.run.vocabulary is not set: include an "
                      "objective file (objectives/*.gin)")
  if isinstance(vocabulary, (tuple, list)):
    return max(v.vocab_size for v in vocabulary)
  return vocabulary.vocab_size


def preflight(tpu=None):
  """Reads and checks the parsed configuration; returns (settings, description)."""
  settings = Settings(tpu=tpu)
  _check_corpus()
  _check_task(settings.mixture)
  try:
    description = models.describe(settings.model_type, _vocab_size())
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise ConfigError("the model's layers reject their gin arguments: %s"
                      % e)
  num_devices = None if tpu else available_cpu_devices()
  check_settings(settings, description, num_devices)
  return settings, description


def _check_task(name):
  if not name:
    raise ConfigError("no task: bind MIXTURE_NAME (objectives/*.gin do)")
  import seqio  # pylint: disable=g-import-not-at-top
  try:
    seqio.get_mixture_or_task(name)
  except ValueError:
    known = sorted(t for t in seqio.MixtureRegistry.names()) + sorted(
        seqio.TaskRegistry.names())
    close = difflib.get_close_matches(name, known, n=3)
    raise ConfigError(
        "MIXTURE_NAME %r is not a registered task or mixture%s" % (
            name, (" (did you mean %s?)" % " or ".join(close)) if close else
            "; this package registers th_span_corruption, th_mlm and "
            "th_finetune_squad_glue_superglue"))


# --------------------------------------------------------------------------
# devices


def _tpu_flag():
  """--tpu of the stock t5_mesh_transformer, if that script is running."""
  try:
    from absl import flags  # pylint: disable=g-import-not-at-top
    return flags.FLAGS["tpu"].value if "tpu" in flags.FLAGS else None
  except Exception:  # pylint: disable=broad-except
    return None


@gin.configurable(module="mtf_th")
def mesh_devices(mesh_shape=None, max_cpu_devices=DEFAULT_MAX_CPU_DEVICES):
  """Device names for mtf's PlacementMeshImpl: one logical CPU per mesh slot.

  Bound by gin/mtf_th.gin as utils.run.mesh_devices, so the stock
  t5_mesh_transformer also places the mesh on logical CPU devices.  On a TPU
  (--tpu) returns None and SimdMeshImpl places the mesh on the slice.

  Args:
    mesh_shape: mesh shape; default: gin's utils.run.mesh_shape.
    max_cpu_devices: refuse meshes needing more logical CPU devices.
  Returns:
    a list of device strings, or None on TPU.
  Raises:
    ConfigError: if the mesh needs more devices than may exist.
  """
  if _tpu_flag():
    return None
  shape = mtf.convert_to_shape(
      mesh_shape if mesh_shape is not None else models.query(
          "utils.run.mesh_shape"))
  size = max(shape.size, 1)
  limit = available_cpu_devices(max_cpu_devices)
  if size > limit:
    raise ConfigError(
        "mesh_shape %s needs %d devices but only %d logical CPU devices are "
        "available in this process: choose a smaller mesh" % (shape, size,
                                                             limit))
  try:
    return compat.split_cpu(size)
  except ValueError as e:
    raise ConfigError(str(e))


def _configure_estimator(estimator, seed):
  """Seeds the graph, shows every logical CPU device to the session and
  makes new variables resource variables.

  Resource variables matter for reproducibility: with TF1 ref variables (what
  tf.disable_v2_behavior() selects) a read aliases the variable's buffer, so
  a gradient op that runs after the optimizer's assign to the same weight
  (nothing orders them) sees the updated value: two runs with the same seed
  and data then differ from the second step on.  A resource read is a copy.
  """
  tf.enable_resource_variables()
  config = estimator._config  # pylint: disable=protected-access
  changes = {"tf_random_seed": seed}
  if not config.master and compat._LOGICAL_CPUS:  # pylint: disable=protected-access
    changes["session_config"] = compat.estimator_session_config(
        len(compat._LOGICAL_CPUS),  # pylint: disable=protected-access
        base=config.session_config)
  config = config.replace(**changes)
  estimator._config = config  # pylint: disable=protected-access
  estimator._session_config = config.session_config  # pylint: disable=protected-access


_WRITE_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
              "ResourceScatterAdd", "ResourceScatterUpdate")


class OrderReadsBeforeWritesHook(tf.train.SessionRunHook):
  """Within a training step, every variable is read before it is written.

  mtf 0.1.21's train op is tf.group(variable updates + assign_add(step)) in
  a TF1 graph, where nothing orders a variable's reads against its writes:
  a gradient op may read a weight after the optimizer has assigned it, and
  the learning-rate schedule and Adafactor (decay 1 - (t+1)^-0.8) may read
  the global step before or after its increment.  On a multi-threaded CPU
  two runs with the same seed and data then differ after a few steps, and a
  resumed run does not follow the uninterrupted one.  In begin() (before the
  graph is finalised) this hook makes each write in the train op's fan-in
  wait for every read of the same resource variable in that fan-in (reads
  that depend on a write are left alone), the rule TF2's automatic control
  dependencies apply.  Needs resource variables (_configure_estimator).
  """

  def begin(self):
    step = tf.train.get_global_step()
    if step is None:
      return
    graph = step.graph
    increments = [op for op in step.op.outputs[0].consumers()
                  if op.type in ("AssignAdd", "AssignAddVariableOp")]
    if not increments:
      return
    parents = {}
    for op in graph.get_operations():
      for control in op.control_inputs:
        parents.setdefault(control, []).append(op)
    # the train op: the tf.group NoOps above the step increment (tf.group
    # makes one NoOp per device under a final one)
    roots, stack = set(), list(increments)
    while stack:
      for parent in parents.get(stack.pop(), []):
        if parent.type == "NoOp" and parent not in roots:
          roots.add(parent)
          stack.append(parent)
    fanin = _transitive_fanin(roots, stop=None)
    writes = [op for op in fanin if op.type in _WRITE_OPS]
    after_writes = _transitive_fanout(writes, within=fanin)
    reads = {}
    for op in fanin:
      if op.type == "ReadVariableOp" and op not in after_writes:
        reads.setdefault(op.inputs[0].op, []).append(op)
    for write in writes:
      pending = [r for r in reads.get(write.inputs[0].op, [])
                 if r not in write.control_inputs]
      if pending:
        write._add_control_inputs(pending)  # pylint: disable=protected-access


def _transitive_fanout(ops, within):
  """Ops in `within` reachable from `ops` (data and control edges)."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    for nxt in [c for t in op.outputs for c in t.consumers()] + list(
        op._control_outputs):  # pylint: disable=protected-access
      if nxt in within and nxt not in seen:
        seen.add(nxt)
        stack.append(nxt)
  return seen


def _transitive_fanin(ops, stop):
  """All ops that `ops` depend on (data and control edges), except `stop`."""
  seen = set()
  stack = list(ops)
  while stack:
    op = stack.pop()
    if op in seen or op is stop:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return seen


# --------------------------------------------------------------------------
# failures: no retry loop, one clear message


@contextlib.contextmanager
def _no_session_recovery(tpu):
  """TF's MonitoredSession retries AbortedError/UnavailableError forever.

  It treats both as a preemption and rebuilds the session (rewriting the
  graph to the events file) in an endless loop, e.g. on a oneDNN kernel's
  AbortedError; and TPUEstimator (which utils.run uses on CPU too) drops
  both when they reach it, so a run stopped by one would end as if it had
  succeeded.  On CPU nothing can be preempted, so no error is retried or
  dropped; on a TPU only UnavailableError (a lost worker) is.
  """
  from tensorflow.python.training import monitored_session  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import error_handling  # pylint: disable=g-import-not-at-top
  saved = (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
           error_handling._IGNORED_ERRORS)  # pylint: disable=protected-access
  recoverable = (tf.errors.UnavailableError,) if tpu else ()
  monitored_session._PREEMPTION_ERRORS = recoverable  # pylint: disable=protected-access
  error_handling._IGNORED_ERRORS = recoverable  # pylint: disable=protected-access
  try:
    yield
  finally:
    (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
     error_handling._IGNORED_ERRORS) = saved  # pylint: disable=protected-access


_FIXES = (
    ("Input dims must be <= 5",
     "a oneDNN kernel takes at most 5 dims: run with TF_ENABLE_ONEDNN_OPTS=0 "
     "in the environment, or choose a sharding strategy whose attention "
     "tensors have at most 5 dims"),
    ("OOM", "out of memory: lower batch_size, the sequence lengths or the "
            "model size, or use a larger mesh"),
)


def _op_failure(e):
  """What failed: "op 'NAME' failed (ErrorClass: cause)", and the fix."""
  text = str(getattr(e, "message", "") or e)
  match = re.search(r"\{\{node ([^}]+)\}\}", text)
  op = (e.op.name if getattr(e, "op", None) is not None else
        match.group(1) if match else "unknown op")
  cause = next((l.strip() for l in text.splitlines()
                if l.strip() and not l.strip().startswith(
                    ("Graph execution error", "Detected at node", "[[",
                     "File ", "Node:"))), text.strip() or type(e).__name__)
  fix = next((f for key, f in _FIXES if key in text),
             "rerun with --verbose for TensorFlow's log of the op")
  return ("op %r failed (%s: %s)" % (op, type(e).__name__, cause[:300]),
          fix[0].upper() + fix[1:])


def _op_error_message(e, model_dir, step):
  """One line: the failing op, the cause and what to change."""
  failure, fix = _op_failure(e)
  return ("%s at step %s; not a preemption, so not retried. %s. The last "
          "checkpoint in %s (step %s) is intact and the same command resumes "
          "from it." % (failure, "?" if step is None else step, fix,
                        model_dir, latest_step(model_dir)))


@contextlib.contextmanager
def _op_errors_stop(doing):
  """An op failing in eval or decode: one TrainingError line, no traceback.

  Args:
    doing: what was running, e.g. "evaluating checkpoint 8 of runs/x".
  Raises:
    TrainingError: naming the op, the cause and what to change.
  """
  try:
    yield
  except tf.errors.OpError as e:
    failure, fix = _op_failure(e)
    raise TrainingError("%s while %s. %s." % (failure, doing, fix)) from None


def _events_files(model_dir):
  return set(tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*")))


def _discard_failed_attempt(model_dir, start, events_before):
  """An attempt that saved no new checkpoint leaves no events file."""
  tf.summary.FileWriterCache.clear()  # close the writers before deleting
  if (latest_step(model_dir) or 0) > start:
    return
  for path in _events_files(model_dir) - events_before:
    tf.io.gfile.remove(path)


# --------------------------------------------------------------------------
# checkpoints: which to keep, no graph unless asked


class _CheckpointKeeper(tf.train.CheckpointSaverListener):
  """Keeps the checkpoints an eval needs out of the Saver's deletion list.

  TF's Saver lists (in <model_dir>/checkpoint) and keeps the last
  utils.run.keep_checkpoint_max checkpoints and deletes older ones.  Before
  each save this listener takes out of that list the protected steps: those
  given (keep_checkpoint_steps), the step the run started from (0 for a
  fresh run, else the previous run's last checkpoint) and every step in
  eval_results.csv.  They stay on disk, complete but unlisted, and
  checkpoint_steps() (used by eval and decode) still finds them.
  """

  def __init__(self, model_dir, steps):
    self._model_dir = model_dir
    self._steps = set(int(s) for s in steps)
    self.saver = None

  def protected(self):
    evaluated = set(r["step"] for r in progress.read_eval_results(
        self._model_dir))
    return self._steps | evaluated

  def before_save(self, session, global_step_value):
    del session, global_step_value
    if self.saver is None:
      return
    keep = self.protected()
    self.saver.set_last_checkpoints_with_time([
        (path, t) for path, t in self.saver._last_checkpoints  # pylint: disable=protected-access
        if int(mtf_utils.get_step_from_checkpoint_path(path)) not in keep])


def _saver_hook_class(keeper, write_graph):
  """tf.train.CheckpointSaverHook, as built by mtf, with our policy."""
  base = tf.train.CheckpointSaverHook

  class CheckpointSaverHook(base):
    """Adds `keeper`; writes graph.pbtxt, *.meta and the graph to the events
    file only if write_graph (each is the size of the whole graph)."""

    def __init__(self, checkpoint_dir, *args, **kwargs):
      kwargs["listeners"] = list(kwargs.get("listeners") or ()) + [keeper]
      kwargs["save_graph_def"] = write_graph
      super().__init__(checkpoint_dir, *args, **kwargs)

    def begin(self):
      super().begin()
      keeper.saver = self._get_saver()

    def after_create_session(self, session, coord):
      if write_graph:
        return super().after_create_session(session, coord)
      step = session.run(self._global_step_tensor)
      self._save(session, step)
      self._timer.update_last_triggered_step(step)

  return CheckpointSaverHook


@contextlib.contextmanager
def _checkpoint_policy(model_dir, keeper, write_graph):
  """Our saver hook and events writer for the duration of estimator.train.

  mtf builds its CheckpointSaverHook inside estimator.train, so the class is
  swapped.  TF's hooks share one events writer per directory
  (FileWriterCache), which writes the whole graph into the events file when
  it is created; unless write_graph, it is created here without the graph.
  The writer is closed at the end: one events file per run.
  """
  from tensorflow.python.summary.writer import writer_cache  # pylint: disable=g-import-not-at-top
  saved = tf.train.CheckpointSaverHook
  tf.train.CheckpointSaverHook = _saver_hook_class(keeper, write_graph)
  if not write_graph:
    cache = writer_cache.FileWriterCache
    with cache._lock:  # pylint: disable=protected-access
      if model_dir not in cache._cache:  # pylint: disable=protected-access
        with tf.Graph().as_default():  # (FileWriter refuses eager mode)
          cache._cache[model_dir] = tf.summary.FileWriter(model_dir)  # pylint: disable=protected-access
  try:
    yield
  finally:
    tf.train.CheckpointSaverHook = saved
    writer_cache.FileWriterCache.clear()


def latest_step(model_dir):
  """Global step of the latest checkpoint in model_dir, or None."""
  path = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.exists(
      model_dir) else None
  return None if path is None else int(
      mtf_utils.get_step_from_checkpoint_path(path))


def checkpoint_steps(model_dir):
  """Steps of the complete checkpoints in model_dir.

  A checkpoint counts if it is listed in model_dir/checkpoint or its index
  file exists, and its index and every data shard are present.
  """
  if not tf.io.gfile.exists(model_dir):
    return []
  prefixes = set(p[:-len(".index")] for p in tf.io.gfile.glob(
      os.path.join(model_dir, "model.ckpt-*.index")))
  state = tf.train.get_checkpoint_state(model_dir)
  if state is not None:
    for path in state.all_model_checkpoint_paths:
      prefixes.add(path if os.path.isabs(path) else
                   os.path.join(model_dir, path))
  steps = []
  for prefix in prefixes:
    shards = tf.io.gfile.glob(prefix + ".data-*-of-*")
    if (tf.io.gfile.exists(prefix + ".index") and shards and
        len(shards) == int(shards[0].rsplit("-of-", 1)[1])):
      steps.append(int(mtf_utils.get_step_from_checkpoint_path(prefix)))
  return sorted(set(steps))


# --------------------------------------------------------------------------
# train


@gin.configurable(module="mtf_th", denylist=["estimator", "vocabulary"])
def train_model(estimator, vocabulary, sequence_length, batch_size,
                train_dataset_fn, train_steps, ensemble_inputs,
                dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False,
                seed=1234, log_every_steps=1, print_every_secs=10.0,
                keep_checkpoint_steps=(), write_graph=False, hooks=()):
  """utils.run's train_model_fn: mtf's train_model, reproducible and logged.

  Same arguments as mesh_tensorflow.transformer.utils.train_model, plus:

  Args:
    seed: graph-level seed (initialisation and any random op).
    log_every_steps: a train_log.csv row every this many steps.
    print_every_secs: a progress line at most this often.
    keep_checkpoint_steps: steps whose checkpoints are never deleted (e.g.
      the sweep's eval steps), besides the last utils.run.keep_checkpoint_max
      ones, the step this run starts from and the steps in
      eval_results.csv.
    write_graph: also write graph.pbtxt, model.ckpt-N.meta and the graph to
      the events file (each about the size of the graph, e.g. 10 MB).
    hooks: extra tf.train.SessionRunHook objects.
  Raises:
    TrainingError: an op failed (the first failure stops the run).
    Interrupted: Ctrl-C.
  """
  del vocabulary
  if checkpoint_input_pipeline:
    raise ConfigError("checkpoint_input_pipeline is not supported by "
                      "mtf_th.train_model; it uses skip_seen_data")
  _configure_estimator(estimator, seed)
  model_dir = estimator.model_dir
  start = latest_step(model_dir) or 0
  if start >= train_steps:
    print("[train] %s is already at step %d >= train_steps %d; nothing to do"
          % (model_dir, start, train_steps), file=sys.stderr, flush=True)
    return

  def input_fn(params):
    del params
    dataset = train_dataset_fn(sequence_length=sequence_length,
                               vocabulary=None, dataset_split=dataset_split)
    dataset = dataset.repeat().batch(batch_size * (ensemble_inputs or 1),
                                     drop_remainder=True)
    if skip_seen_data and start > seen_data_init_step:
      tf.logging.info("Skipping %d steps of data.", start - seen_data_init_step)
      dataset = dataset.skip(start - seen_data_init_step)
    return dataset.prefetch(2)

  hook = progress.ProgressHook(model_dir, train_steps,
                               log_every_steps=log_every_steps,
                               print_every_secs=print_every_secs)
  keeper = _CheckpointKeeper(model_dir, list(keep_checkpoint_steps or ())
                             + [start])
  events_before = _events_files(model_dir)
  try:
    with _no_session_recovery(bool(estimator.config.master)), \
        _checkpoint_policy(model_dir, keeper, write_graph):
      estimator.train(input_fn=input_fn, max_steps=train_steps,
                      hooks=[OrderReadsBeforeWritesHook(), hook] +
                      list(hooks or ()))
  except tf.errors.OpError as e:
    _discard_failed_attempt(model_dir, start, events_before)
    if start and isinstance(e, (tf.errors.NotFoundError,
                                tf.errors.InvalidArgumentError)) and (
                                    "checkpoint" in str(e).lower() or
                                    "restor" in str(e).lower() or
                                    "Key " in str(e)):
      raise ConfigError(
          "the checkpoint in %s (step %d) does not match this configuration "
          "(%s). Use the gin files it was trained with (see its "
          "operative_config.gin) or a new --model_dir."
          % (model_dir, start, str(e).splitlines()[0])) from None
    raise TrainingError(_op_error_message(e, model_dir, hook.last_step)) \
        from None
  except KeyboardInterrupt:
    _discard_failed_attempt(model_dir, start, events_before)
    raise Interrupted(model_dir, latest_step(model_dir)) from None


def _check_model_dir(model_dir):
  if not isinstance(model_dir, str) or not model_dir.strip():
    raise ConfigError("--model_dir is required: the directory for "
                      "checkpoints and logs")
  if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
    raise ConfigError("--model_dir %r exists and is not a directory"
                      % model_dir)


def _run(model_dir, tpu, tpu_zone, gcp_project, fn, settings):
  """utils.run with `fn` as its train_model_fn (see module docstring)."""
  devices = None if tpu else mesh_devices(settings.mesh_shape)
  kwargs = {} if fn is None else {"train_model_fn": fn}
  with gin.unlock_config(), _no_session_recovery(tpu):
    mtf_utils.run(tpu_job_name=None, tpu=tpu, gcp_project=gcp_project,
                  tpu_zone=tpu_zone, model_dir=model_dir,
                  mesh_devices=devices, mode="train", dataset_split="train",
                  **kwargs)


def train(model_dir, gin_files=(), gin_params=(), train_steps=None, tpu=None,
          tpu_zone=None, gcp_project=None):
  """Trains up to global step `train_steps`, resuming from model_dir.

  Args:
    model_dir: checkpoints, logs, operative_config.gin, train_log.csv.
    gin_files: gin files (e.g. an experiment file, then models/t5_tiny.gin).
    gin_params: extra bindings.
    train_steps: stop at this global step (default: utils.run.train_steps).
    tpu, tpu_zone, gcp_project: a Cloud TPU (launch/tpu.sh); None = CPU.
  Returns:
    the rows of train_log.csv (dicts with step, loss, steps_per_sec,
    elapsed_sec).
  Raises:
    ConfigError: for any configuration problem, before a graph is built.
  """
  _check_model_dir(model_dir)
  extra = []
  if train_steps is not None:
    if not isinstance(train_steps, int) or train_steps < 1:
      raise ConfigError("--train_steps must be a positive integer, got %r"
                        % (train_steps,))
    extra.append("utils.run.train_steps = %d" % train_steps)
  parse_gin(gin_files, gin_params, extra)
  _require_train_fn()
  settings, _ = preflight(tpu)
  if not isinstance(settings.train_steps, int) or settings.train_steps < 1:
    raise ConfigError("train_steps must be a positive integer, got %r"
                      % (settings.train_steps,))
  if latest_step(model_dir) is not None:
    check_checkpoint_matches([tf.train.latest_checkpoint(model_dir)],
                             settings)
  tf.io.gfile.makedirs(model_dir)
  _run(model_dir, tpu, tpu_zone, gcp_project, None, settings)
  return progress.read_train_log(model_dir)


def _require_train_fn():
  bound = models.query("utils.run.train_model_fn")
  if not (isinstance(bound, gin.config.ConfigurableReference)
          and bound.selector.endswith("train_model")
          and "mtf_th" in bound.selector):
    with gin.unlock_config():
      gin.bind_parameter("utils.run.train_model_fn", train_model)


# --------------------------------------------------------------------------
# checkpoints for eval / decode


def _checkpoint_paths(model_dir, steps):
  """Paths of the checkpoints for `steps` (None: latest; "all")."""
  available = checkpoint_steps(model_dir)
  if not available:
    raise ConfigError("no checkpoint in --model_dir %r: train first "
                      "(mtf_th train --model_dir %s ...)" % (model_dir,
                                                            model_dir))
  if steps is None or steps == -1:
    steps = [available[-1]]
  elif steps == "all":
    steps = available
  elif isinstance(steps, int):
    steps = [steps]
  out = []
  for step in steps:
    if step not in available:
      raise ConfigError(
          "no checkpoint for step %s in %s; available steps: %s"
          % (step, model_dir, ", ".join(str(s) for s in available)))
    out.append((step, os.path.join(model_dir, "model.ckpt-%d" % step)))
  return out


def configured_variables(settings):
  """{name: shape} of the configured model's variables, without a session.

  Builds the model's mtf graph (no lowering, no gradients, no optimizer) in
  a throw-away tf.Graph: a few seconds even for a base model, and nothing is
  written anywhere.  Names are those of the checkpoint's variables.
  """
  vocab_size = _vocab_size()
  lengths = settings.sequence_length
  with tf.Graph().as_default():
    model = mtf_utils.build_model(
        model_type=settings.model_type, input_vocab_size=vocab_size,
        output_vocab_size=vocab_size, layout_rules=settings.layout,
        mesh_shape=settings.mesh_shape or mtf.Shape([]))
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "shapes")
    batch = mtf.Dimension("batch", settings.batch_size)

    def ids(key):
      length = mtf.Dimension("length", lengths.get(key) or lengths["targets"])
      return mtf.zeros(mesh, mtf.Shape([batch, length]), tf.int32)

    targets = ids("targets")
    if settings.model_type in ("lm", "delimited_lm"):
      inputs = transformer.autoregressive_inputs(targets)
    else:
      inputs = ids("inputs")
    model.call_simple(inputs=inputs, targets=targets, compute_loss=True,
                      mode="train",
                      variable_dtype=mtf_utils.get_variable_dtype())
    return {v.name: v.shape.to_integer_list for v in graph.all_variables}


def check_checkpoint_matches(checkpoint_paths, settings, flag="--model_dir",
                             missing_ok=False):
  """The checkpoints hold every configured variable in its shape.

  Args:
    checkpoint_paths: checkpoint prefixes (model_dir/model.ckpt-N).
    settings: the configured run's Settings.
    flag: the flag that named their directory, for the message.
    missing_ok: only compare shapes (fine-tuning starts from a checkpoint
      that may lack new variables).
  Raises:
    ConfigError: one line naming the first mismatching variable and both
      shapes, before any graph or event is written.
  """
  configured = sorted(configured_variables(settings).items())
  for path in checkpoint_paths:
    stored = dict(tf.train.list_variables(path))
    for name, shape in configured:
      if name not in stored and missing_ok:
        continue
      if name in stored and list(stored[name]) == list(shape):
        continue
      model_dir = os.path.dirname(path)
      found = ("has no variable %s (shape %s in this configuration)" % (
          name, list(shape)) if name not in stored else
               "has %s of shape %s but this configuration makes it %s" % (
                   name, list(stored[name]), list(shape)))
      raise ConfigError(
          "%s %s: checkpoint %s %s; the model was trained with other gin "
          "files (see %s): use those, or another %s" % (
              flag, model_dir, os.path.basename(path), found,
              os.path.join(model_dir, "operative_config.gin"), flag))


def _match_checkpoint_dtype(checkpoint_path):
  """Reads checkpoints in the dtype they were written in (bf16 or f32)."""
  reader = tf.train.load_checkpoint(checkpoint_path)
  dtypes = set(dtype for name, dtype in
               reader.get_variable_to_dtype_map().items()
               if "slot" not in name and not name.startswith("global_step"))
  if len(dtypes) == 1:
    with gin.unlock_config():
      gin.bind_parameter("utils.get_variable_dtype.master_dtype",
                         dtypes.pop().name)


def _operative_gin(model_dir, gin_files):
  """Without gin files, eval/decode use the config the model was trained with."""
  if gin_files:
    return list(gin_files)
  path = os.path.join(model_dir, "operative_config.gin")
  if not os.path.exists(path):
    raise ConfigError(
        "no --gin_file given and %s has no operative_config.gin: give the "
        "gin files the model was trained with" % model_dir)
  return [path]


# --------------------------------------------------------------------------
# evaluate


@gin.configurable(module="mtf_th")
def evaluate_checkpoints(mixture_or_task_name=None, split="validation",
                         max_eval_examples=None, seed=4321):
  """Gin-configurable evaluation settings (bound in gin/objectives/*.gin).

  Args:
    mixture_or_task_name: the task whose held-out split is scored.
    split: the split ("validation").
    max_eval_examples: score at most this many examples (None: all).
    seed: seed of the corruption noise of the held-out examples, so every
      checkpoint is scored on identical inputs.
  Returns:
    dict of the settings.
  """
  return {"mixture_or_task_name": mixture_or_task_name, "split": split,
          "max_eval_examples": max_eval_examples, "seed": seed}


def _eval_dataset(task_name, sequence_length, split, seed, max_examples):
  """A finite, deterministic dataset of held-out examples (unbatched)."""
  import seqio  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(task_name)
  if split not in task.splits:
    raise ConfigError("task %s has no %r split (it has %s)"
                      % (task_name, split, ", ".join(task.splits)))
  ds = task.get_dataset(sequence_length, split=split, use_cached=False,
                        shuffle=False, num_epochs=1, seed=seed)
  feature_keys = tuple(k for k in task.output_features
                       if k in tf.data.get_output_shapes(ds))
  eos_keys = set(k for k, f in task.output_features.items() if f.add_eos)
  ds = ds.map(lambda ex: {k: ex[k] for k in feature_keys})
  ds = transformer_dataset.pack_or_pad(ds, sequence_length, pack=True,
                                       feature_keys=feature_keys,
                                       ensure_eos=eos_keys)
  ds = ds.map(mtf_utils._filter_features)  # pylint: disable=protected-access
  if max_examples:
    ds = ds.take(max_examples)
  return ds


def _count(dataset_fn):
  with tf.Graph().as_default():
    ds = dataset_fn()
    n = ds.reduce(np.int64(0), lambda c, _: c + 1)
    with tf.Session() as sess:
      return int(sess.run(n))


def _eval_with_estimator(estimator, vocabulary, sequence_length, batch_size,
                         train_dataset_fn, train_steps, ensemble_inputs,
                         results, checkpoints, options, **unused):
  """utils.run hook: scores each checkpoint's held-out ln(PPL)."""
  del vocabulary, train_dataset_fn, train_steps, ensemble_inputs, unused
  _configure_estimator(estimator, options["seed"])
  dataset_fn = functools.partial(
      _eval_dataset, options["mixture_or_task_name"], sequence_length,
      options["split"], options["seed"], options["max_eval_examples"])
  n = _count(dataset_fn)
  if n == 0:
    raise ConfigError("the %r split of %s is empty: nothing to evaluate"
                      % (options["split"], options["mixture_or_task_name"]))
  steps = -(-n // batch_size)

  def input_fn(params):
    del params
    ds = transformer_dataset.pad_dataset_with_zeroed_out_examples(dataset_fn())
    return ds.batch(batch_size, drop_remainder=True)

  for step, path in checkpoints:
    print("[eval] checkpoint %d: %d examples in %d batches of %d (%s split)"
          % (step, n, steps, batch_size, options["split"]), file=sys.stderr,
          flush=True)
    with _op_errors_stop("evaluating checkpoint %d of %s (%s split)"
                         % (step, estimator.model_dir, options["split"])):
      metrics = estimator.evaluate(input_fn=input_fn, steps=steps,
                                   checkpoint_path=path,
                                   name=options["split"])
    result = {"step": step, "split": options["split"],
              "ln_ppl": float(-metrics["neg_log_perplexity"]),
              "tokens": int(metrics["num_eval_tokens"])}
    print("[eval] checkpoint %d: ln(PPL) %.4f over %d tokens"
          % (step, result["ln_ppl"], result["tokens"]), file=sys.stderr,
          flush=True)
    results.append(result)


def evaluate(model_dir, gin_files=(), gin_params=(), checkpoint_steps=None,
             tpu=None, tpu_zone=None, gcp_project=None):
  """Held-out ln(PPL) of checkpoints; also written to eval_results.csv.

  Args:
    model_dir: the trained model.
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings (e.g. mtf_th.evaluate_checkpoints.split).
    checkpoint_steps: None (latest), "all", an int or a list of ints.
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    [dict(step=int, split=str, ln_ppl=float, tokens=int)], one per checkpoint.
  Raises:
    ConfigError: bad configuration or missing checkpoints.
    TrainingError: an op failed (one line: the op, the cause, the fix).
  """
  _check_model_dir(model_dir)
  checkpoints = _checkpoint_paths(model_dir, checkpoint_steps)
  parse_gin(_operative_gin(model_dir, gin_files), gin_params)
  _match_checkpoint_dtype(checkpoints[-1][1])
  settings, _ = preflight(tpu)
  check_checkpoint_matches([path for _, path in checkpoints], settings)
  options = evaluate_checkpoints()
  options["mixture_or_task_name"] = (options["mixture_or_task_name"] or
                                     settings.mixture)
  results = []
  fn = functools.partial(_eval_with_estimator, results=results,
                         checkpoints=checkpoints, options=options)
  with _op_errors_stop("evaluating %s" % model_dir):
    _run(model_dir, tpu, tpu_zone, gcp_project, fn, settings)
  progress.write_eval_results(model_dir, results)
  return results


# --------------------------------------------------------------------------
# decode


def _decode_inputs(task_name, sequence_length, vocabulary, inputs, count,
                   seed):
  """Input id rows: encoded `inputs` strings, or held-out examples' inputs."""
  length = sequence_length["inputs"]
  rows = []
  if inputs:
    for text in inputs:
      ids = list(vocabulary.encode(text))[:length - 1] + [1]
      rows.append(ids + [0] * (length - len(ids)))
  else:
    with tf.Graph().as_default():
      ds = _eval_dataset(task_name, sequence_length, "validation", seed, count)
      it = tf.data.make_one_shot_iterator(ds).get_next()
      with tf.Session() as sess:
        try:
          while len(rows) < count:
            rows.append(list(sess.run(it)["inputs"]))
        except tf.errors.OutOfRangeError:
          pass
  return np.array(rows, dtype=np.int32)


def _decode_with_estimator(estimator, vocabulary, sequence_length, batch_size,
                           train_dataset_fn, train_steps, ensemble_inputs,
                           results, checkpoint, options, **unused):
  """utils.run hook: decodes a batch of inputs with one checkpoint."""
  del train_dataset_fn, train_steps, ensemble_inputs, unused
  _configure_estimator(estimator, options["seed"])
  vocab = mtf_utils.inputs_vocabulary(vocabulary)
  ids = _decode_inputs(options["task"], sequence_length, vocab,
                       options["inputs"], options["count"], options["seed"])
  n = len(ids)
  padded = np.zeros((-(-n // batch_size) * batch_size, ids.shape[1]),
                    np.int32)
  padded[:n] = ids

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices({"inputs": padded}).batch(
        batch_size, drop_remainder=True)

  step, path = checkpoint
  with _op_errors_stop("decoding with checkpoint %d of %s"
                       % (step, estimator.model_dir)):
    outputs = list(mtf_utils.decode(estimator, input_fn, vocabulary, path))
  for row, out in zip(ids, outputs[:n]):
    text = [int(t) for t in row if t > 1]
    results.append({
        "step": step,
        "input": vocab.decode(text),
        "output": out.decode("utf-8") if isinstance(out, bytes) else out})


def decode(model_dir, gin_files=(), gin_params=(), inputs=None,
           checkpoint_step=None, num_examples=8, tpu=None, tpu_zone=None,
           gcp_project=None):
  """Greedy decoding with an encoder-decoder checkpoint.

  Args:
    model_dir: the trained model.
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings (e.g. Bitransformer.decode.temperature).
    inputs: strings to decode; None: `num_examples` held-out inputs.
    checkpoint_step: a step (default: latest).
    num_examples: how many held-out inputs when `inputs` is None.
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    [dict(step, input, output)] with text decoded by the vocabulary.
  Raises:
    ConfigError: bad configuration, missing checkpoint, not a T5 model.
    TrainingError: an op failed (one line: the op, the cause, the fix).
  """
  _check_model_dir(model_dir)
  checkpoint = _checkpoint_paths(model_dir, checkpoint_step)[0]
  parse_gin(_operative_gin(model_dir, gin_files), gin_params)
  _match_checkpoint_dtype(checkpoint[1])
  settings, _ = preflight(tpu)
  if settings.model_type != "bitransformer":
    raise ConfigError(
        "decode needs an encoder-decoder (T5, model_type bitransformer) "
        "model; this one is %r: score it with mtf_th eval" %
        settings.model_type)
  check_checkpoint_matches([checkpoint[1]], settings)
  if inputs is not None and not all(isinstance(s, str) and s.strip()
                                    for s in inputs):
    raise ConfigError("--inputs: every input must be a non-empty string")
  results = []
  options = {"task": settings.mixture, "inputs": inputs,
             "count": int(num_examples), "seed": 4321}
  fn = functools.partial(_decode_with_estimator, results=results,
                         checkpoint=checkpoint, options=options)
  with _op_errors_stop("decoding with %s" % model_dir):
    _run(model_dir, tpu, tpu_zone, gcp_project, fn, settings)
  return results


# --------------------------------------------------------------------------
# fine-tune


def finetune(model_dir, pretrained_model_dir, gin_files=(), gin_params=(),
             finetune_steps=None, checkpoint_step=None, tpu=None,
             tpu_zone=None, gcp_project=None):
  """Fine-tunes a pre-trained checkpoint (paper 5.1; gin/experiments/finetune.gin).

  Starts from pretrained_model_dir's checkpoint at step P (latest, or
  checkpoint_step) and trains to global step P + finetune_steps (default:
  the `finetune_steps` macro, 131072 in finetune.gin) in model_dir; resumes
  like train().

  Args:
    model_dir: the fine-tuned model's directory (not the pre-trained one).
    pretrained_model_dir: a directory with pre-training checkpoints.
    gin_files: the pre-training model's gin files, then finetune.gin.
    gin_params: extra bindings.
    finetune_steps: steps to add (default: macro finetune_steps).
    checkpoint_step: the pre-training step to start from (default: latest).
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    the rows of model_dir/train_log.csv.
  """
  _check_model_dir(model_dir)
  if not pretrained_model_dir:
    raise ConfigError("--pretrained_model_dir is required")
  if os.path.abspath(pretrained_model_dir) == os.path.abspath(model_dir):
    raise ConfigError("--model_dir must differ from --pretrained_model_dir "
                      "(fine-tuning never overwrites pre-training "
                      "checkpoints)")
  step, path = _checkpoint_paths(pretrained_model_dir, checkpoint_step)[0]
  parse_gin(gin_files, gin_params)
  if finetune_steps is None:
    finetune_steps = models.query("finetune_steps")
  if not isinstance(finetune_steps, int) or finetune_steps < 1:
    raise ConfigError("finetune_steps must be a positive integer, got %r "
                      "(include experiments/finetune.gin or pass "
                      "--finetune_steps)" % (finetune_steps,))
  with gin.unlock_config():
    gin.bind_parameter("utils.run.init_checkpoint", path)
    gin.bind_parameter("utils.run.train_steps", step + finetune_steps)
    gin.bind_parameter("utils.run.total_run_steps", step + finetune_steps)
    gin.bind_parameter("utils.run.seen_data_init_step", step)
  _require_train_fn()
  settings, _ = preflight(tpu)
  check_checkpoint_matches([path], settings, "--pretrained_model_dir",
                           missing_ok=True)
  if latest_step(model_dir) is not None:
    check_checkpoint_matches([tf.train.latest_checkpoint(model_dir)],
                             settings)
  tf.io.gfile.makedirs(model_dir)
  print("[finetune] from %s (step %d) to step %d in %s"
        % (path, step, step + finetune_steps, model_dir), file=sys.stderr,
        flush=True)
  _run(model_dir, tpu, tpu_zone, gcp_project, None, settings)
  return progress.read_train_log(model_dir)


def trainable_variable_names(model_dir):
  """Names of the variables in model_dir's latest checkpoint (for tests)."""
  path = tf.train.latest_checkpoint(model_dir)
  return sorted(name for name, _ in tf.train.list_variables(path))


def parameter_count(model_dir, pattern=""):
  """Number of parameters in the latest checkpoint whose names match."""
  path = tf.train.latest_checkpoint(model_dir)
  regex = re.compile(pattern)
  total = 0
  for name, shape in tf.train.list_variables(path):
    if "/slot_" in name or name.startswith("global_step") or "adafactor" in \
        name.lower() or not regex.search(name):
      continue
    total += int(np.prod(shape)) if shape else 1
  return total
