"""Gin bindings and values checked as text, before TensorFlow: one validator.

gin binds anything it can name: a misspelt macro (``heds = 12``) becomes a
new macro nothing reads, a binding of an attention class no layer stack
lists is stored and ignored, and a value of the right syntax may mean
nothing (``mesh_shape = 42``, a negative learning rate).  check() finds
these in the gin files and --gin_param bindings read as text
(gin_text.GinConfig, after mesh_tensorflow's defaults.gin as `mtf_th
train` parses it), without TensorFlow and without gin's global state:

* a --gin_param macro that no file refers to (%name);
* a --gin_param binding of an mtf_th attention class the configuration
  never refers to (@mtf_th.Class), or of a parameter the class does not
  have (`mtf_th.MultiHeadAttention.heads_k`: multi-head attention has one
  heads dim); t5's utils.tpu_mesh_shape, which nothing calls here;
* values: mesh_shape and layout parse (spec.parse_mesh_shape,
  spec.parse_layout) and the layout's rules name axes of the mesh
  (spec.check_layout_axes), seed is an integer, batch_size, train_steps and the
  lengths are positive integers, dropout_rate is in [0, 1), every learning
  rate is a finite number > 0, mtf_th.core_kernel.kind is 'auto', 'fused'
  or 'einsum' (and a --gin_param binds that parameter of mtf_th.core_kernel,
  not another or a misspelt configurable).

`mtf_th train`, eval, decode and finetune run it before TensorFlow loads
(commands/prechecks.gin_bindings), `mtf_th plan` on the files it prices:
each refuses the same binding with the same line.  After gin parses,
nn/gin_checks.py checks the live bindings with the same messages
(unused_macro, unused_configurable, ignored_mesh_binding), for what text
cannot show.

Example:
  >>> config = gin_text.GinConfig(["experiments/lm_heads/01_multi_head_4_32.gin"],
  ...                             ["heds = 8"])
  >>> check(config, ["heds = 8"])
  Traceback (most recent call last):
  ValueError: --gin_param 'heds = 8' binds the macro 'heds', which no gin ...
"""
import difflib
import importlib.util
import math
import numbers
import os

from gin import config_parser

from mtf_talking_heads.core import gin_text
from mtf_talking_heads.core import spec

# Configurables nothing here calls (utils.run.mesh_shape is a macro; training
# runs mtf's utils.run, not t5's MtfModel), by their last name.
TPU_MESH_SHAPE = "tpu_mesh_shape"
MTF_MODEL = "MtfModel"
# utils.tpu_mesh_shape / t5's MtfModel parameters -> the binding to use.
MESH_ADVICE = {
    "model_parallelism": (
        "use --gin_param \"mesh_shape = 'model:{value}'\" (on a TPU slice "
        "'batch:B,model:{value}' with B x {value} = its cores; "
        "launch/tpu.py derives it from --accelerator)"),
    "tpu_topology": (
        "use --gin_param \"mesh_shape = 'batch:B,model:M'\" with B x M = the "
        "slice's cores (launch/tpu.py derives it from --accelerator)"),
    "ensemble_parallelism": (
        "use --gin_param \"mesh_shape = 'ensemble:{value},model:M'\""),
    "mesh_shape": "use --gin_param \"mesh_shape = {value}\"",
    "layout_rules": "use --gin_param \"layout = {value}\"",
    "batch_size": "use --gin_param \"batch_size = {value}\"",
    "sequence_length": (
        "use --gin_param \"inputs_length = N\" and \"targets_length = N\""),
}
# Parameters of every mtf_th attention class but general bilinear's
# (nn/layers.py's AttentionLayer), besides its heads dims.
COMMON_PARAMETERS = ("d_k", "d_v", "dynamic_init_scale", "dropout_rate",
                     "relative_attention_type",
                     "relative_attention_num_buckets", "strategy")
BILINEAR_PARAMETERS = ("heads", "dropout_rate", "relative_attention_type",
                       "relative_attention_num_buckets")
# nn/core_kernel.py's configurable (mtf_th.core_kernel) and its kinds.
CORE_KERNEL = "core_kernel"
CORE_KERNEL_KINDS = ("auto", "fused", "einsum")
# Macros whose value must be a positive integer.
POSITIVE_MACROS = ("batch_size", "train_steps", "inputs_length",
                   "targets_length", "num_layers", "d_model", "d_ff")


def mtf_defaults_gin():
  """mesh_tensorflow's transformer/gin/defaults.gin (which `mtf_th train`
  parses first), found without importing mesh_tensorflow; None if absent."""
  found = importlib.util.find_spec("mesh_tensorflow")
  if found is None or not found.origin:
    return None
  path = os.path.join(os.path.dirname(found.origin), "transformer", "gin",
                      "defaults.gin")
  return path if os.path.isfile(path) else None


def read(gin_files, gin_params, gin_dir=None):
  """The GinConfig `mtf_th train` would parse: defaults.gin, the files,
  the bindings.

  Raises:
    ValueError: a file gin cannot read (missing, syntax, include cycle).
  """
  defaults = mtf_defaults_gin()
  return gin_text.GinConfig(([defaults] if defaults else []) +
                            list(gin_files), gin_params,
                            gin_dir or gin_text.GIN_DIR)


def layer_parameters(layer_class):
  """The parameters of an mtf_th attention class, or None for another name.

  Example:
    layer_parameters("MultiHeadEncoderAttention")[:2] == ("heads", "d_k")
  """
  for v in spec.VARIANT_TABLE:
    if layer_class in spec.layer_class_names(v.name):
      if v.name == spec.BILINEAR:
        return BILINEAR_PARAMETERS
      heads = ((("heads_k",) if v.project_logits else ()) + ("heads",) +
               (("heads_v",) if v.project_weights else ()))
      extra = ((("groups",) if v.name == spec.GROUPED else ()) +
               (("dynamic",) if v.project_logits or v.project_weights
                else ()))
      return heads + COMMON_PARAMETERS[:2] + extra + COMMON_PARAMETERS[2:]
  return None


def did_you_mean(name, known):
  close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
  return (" Did you mean %s?" % " or ".join(repr(c) for c in close)
          if close else "")


def unused_macro(param, name, used_macros):
  """The line for a --gin_param macro nothing refers to."""
  return (
      "--gin_param %r binds the macro %r, which no gin file uses, so it "
      "would change nothing.%s (Macros this configuration uses: %s.)" % (
          param, name, did_you_mean(name, used_macros),
          ", ".join(sorted(used_macros))))


def unused_configurable(param, short, peers):
  """The line for a binding of a class the configuration never refers to;
  `short` as mtf_th.Class, `peers` the used classes of its kind."""
  return (
      "--gin_param %r binds %s, which this configuration never uses (no "
      "@%s in any layer stack or binding), so it would change nothing.%s "
      "(Used: %s.)" % (param, short, short, did_you_mean(short, peers),
                       ", ".join(sorted(peers)) or "none"))


def ignored_mesh_binding(param, arg_name, value, mtf_model=False):
  """The line for a binding of utils.tpu_mesh_shape (or t5's MtfModel)."""
  advice = MESH_ADVICE.get(arg_name, "use the mesh_shape / layout macros")
  where = ("mtf_th trains with mesh_tensorflow's utils.run, not t5's "
           "MtfModel" if mtf_model else
           "utils.run.mesh_shape is the mesh_shape macro here, so "
           "utils.tpu_mesh_shape is never called")
  return "--gin_param %r is ignored: %s; %s." % (
      param, where, advice.format(value=value))


def _missing_parameter(param, short, name, own):
  """The line for a binding of a parameter the class does not have."""
  having = sorted(c for v in spec.VARIANT_TABLE
                  for c in spec.layer_class_names(v.name)[:1]
                  if name in layer_parameters(c))
  if having:
    return ("--gin_param %r: %s has no parameter %s (its heads dims: %s); "
            "the classes with %s: %s" % (
                param, short, name, ", ".join(
                    p for p in own if p.startswith("heads")), name,
                ", ".join("mtf_th." + c for c in having)))
  return ("--gin_param %r: %s has no parameter %r, so gin would refuse it."
          "%s (Its parameters: %s.)" % (param, short, name,
                                        did_you_mean(name, own),
                                        ", ".join(own)))


def unknown_kernel(kind):
  """The line for mtf_th.core_kernel.kind bound to none of its kinds.

  Example:
    unknown_kernel("fusd") -> "mtf_th.core_kernel.kind = 'fusd' is not a
      kernel: choose 'auto', 'fused' or 'einsum'. Did you mean 'fused'?"
  """
  return ("mtf_th.core_kernel.kind = %r is not a kernel: choose 'auto', "
          "'fused' or 'einsum'.%s" % (kind, did_you_mean(
              str(kind).lower(), CORE_KERNEL_KINDS)))


def _check_core_kernel_param(param, statement):
  """A --gin_param binding of mtf_th.core_kernel (its one parameter is
  kind) or of a misspelling of it (gin would refuse it after TensorFlow
  loads)."""
  selector = statement.selector.split("/")[-1]
  parts = selector.split(".")
  last = parts[-1]
  if len(parts) > 2 or (len(parts) == 2 and parts[0] != "mtf_th"):
    return
  if last != CORE_KERNEL:
    if did_you_mean(last, [CORE_KERNEL]):
      raise ValueError(
          "--gin_param %r binds %s, which is no configurable: the "
          "attention core's kernel is mtf_th.core_kernel.kind = 'auto', "
          "'fused' or 'einsum'" % (param, selector))
    return
  if statement.arg_name != "kind":
    raise ValueError(
        "--gin_param %r: mtf_th.core_kernel has no parameter %r; its one "
        "parameter is kind = 'auto', 'fused' or 'einsum'"
        % (param, statement.arg_name))


def _statements(param):
  return [s for s in config_parser.ConfigParser(param, gin_text._Delegate())  # pylint: disable=protected-access
          if isinstance(s, config_parser.BindingStatement)]


def _mtf_th_class(selector):
  """'TalkingHeadsAttention' for 'mtf_th.TalkingHeadsAttention' (or the
  class's module path); None for another selector."""
  parts = selector.split(".")
  if len(parts) < 2 or parts[0] not in ("mtf_th", "mtf_talking_heads"):
    return None
  return parts[-1] if layer_parameters(parts[-1]) is not None else None


def _check_param(param, statement, macros, classes):
  if statement.arg_name:
    _check_core_kernel_param(param, statement)
  if not statement.arg_name:
    if not statement.scope and statement.selector not in macros:
      raise ValueError(unused_macro(param, statement.selector, macros))
    return
  last = statement.selector.split(".")[-1]
  if last in (TPU_MESH_SHAPE, MTF_MODEL) and last not in {
      c.split(".")[-1] for c in classes}:
    raise ValueError(ignored_mesh_binding(param, statement.arg_name,
                                          statement.value,
                                          last == MTF_MODEL))
  name = _mtf_th_class(statement.selector)
  if name is None:
    return
  short = "mtf_th." + name
  used = {c.split(".")[-1] for c in classes}
  if name not in used:
    peers = ["mtf_th." + c for c in used if layer_parameters(c) is not None]
    raise ValueError(unused_configurable(param, short, peers))
  own = layer_parameters(name)
  if statement.arg_name not in own:
    raise ValueError(_missing_parameter(param, short, statement.arg_name,
                                        own))


def _resolved(read, name):
  """read(name) (GinConfig.get or .binding), or None when it refers to a
  macro no file defines (gin reports that when it parses)."""
  try:
    return read(name)
  except ValueError:
    return None


def _number(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _learning_rates(config):
  """[(where, value)] of every learning rate the configuration sets."""
  out = [("learning_rate", _resolved(config.get, "learning_rate"))]
  for key in config.binding_keys():
    if (key.endswith(".learning_rate") or
        key.endswith("learning_rate_schedule_noam.multiplier")):
      out.append((key, _resolved(config.binding, key)))
  schedule = _resolved(config.binding, "utils.run.learning_rate_schedule")
  if _number(schedule):  # mtf: a number is a constant rate
    out.append(("utils.run.learning_rate_schedule", schedule))
  return out


def check_values(config):
  """Values of the right syntax that mean nothing.

  Raises:
    ValueError: one line naming the macro or binding and what to give.
  """
  for name in ("mesh_shape", "layout"):
    value = _resolved(config.get, name)
    if value is None or isinstance(value, gin_text.Reference):
      continue
    parse = spec.parse_mesh_shape if name == "mesh_shape" else (
        spec.parse_layout)
    if not isinstance(value, str):
      raise ValueError("%s = %r is not a string: write it like %s" % (
          name, value, "'model:8' or 'batch:2,model:4'" if name ==
          "mesh_shape" else "'batch:batch,heads:model'"))
    parse(value)
  mesh, layout = (_resolved(config.get, n) for n in ("mesh_shape", "layout"))
  if isinstance(mesh, str) and isinstance(layout, str):  # as the pre-flight
    spec.check_layout_axes(
        layout, [name for name, _ in spec.parse_mesh_shape(mesh)],
        what="layout %r (the layout macro or utils.run.layout_rules):"
        % layout)
  seed = _resolved(config.get, "seed")
  if seed is not None and (not isinstance(seed, int) or
                           isinstance(seed, bool)):
    raise ValueError("seed = %r is not an integer: give e.g. seed = 1234"
                     % (seed,))
  for name in POSITIVE_MACROS:
    value = _resolved(config.get, name)
    if value is not None and not isinstance(
        value, (gin_text.Reference, tuple, list)):  # mtf: (unit, n)
      spec.positive_int(name, value, " (gin macro %s)" % name)
  rate = _resolved(config.get, "dropout_rate")
  if rate is not None and (not _number(rate) or not 0 <= rate < 1):
    raise ValueError("dropout_rate = %r must be a number in [0, 1)"
                     % (rate,))
  for key in config.binding_keys():
    selector, _, arg = key.rpartition(".")
    if (arg == "kind" and selector.split("/")[-1] in (
        CORE_KERNEL, "mtf_th." + CORE_KERNEL)):
      kind = _resolved(config.binding, key)
      if kind is not None and kind not in CORE_KERNEL_KINDS:
        raise ValueError(unknown_kernel(kind))
  for where, value in _learning_rates(config):
    if isinstance(value, gin_text.Reference) or value is None:
      continue
    if not _number(value) or not math.isfinite(value) or value <= 0:
      raise ValueError(
          "%s = %r: a learning rate must be a finite number > 0 (a negative "
          "or zero rate trains nothing or climbs the loss)" % (where, value))


def check(config, gin_params):
  """Raises ValueError for the first --gin_param that changes nothing or
  names a parameter its class lacks, then for a value that means nothing.

  Args:
    config: read(gin_files, gin_params) (a gin_text.GinConfig).
    gin_params: the --gin_param strings, in order.
  """
  macros, classes = config.references()
  for param in gin_params:
    for statement in _statements(param):
      _check_param(param, statement, macros, classes)
  check_values(config)
