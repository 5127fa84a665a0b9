"""Gin mistakes that gin accepts silently, found right after parsing.

gin binds anything it can name: a misspelt macro (``heds = 12``) becomes a
new macro that nothing reads, and a parameter of a configurable that the
configuration never calls (t5's ``utils.tpu_mesh_shape.model_parallelism``
when utils.run.mesh_shape is the ``mesh_shape`` macro; an mtf layer class
that no layer stack lists) is stored and ignored.  ``check_params`` finds
both in the ``--gin_param`` bindings, once the files and bindings are
parsed, and raises ValueError (training.parse_gin turns it into ConfigError)
with a did-you-mean, or with the macro to use instead.

A configurable counts as used when the configuration references it
(``@name`` anywhere, macros included).  Only the configurables that are
never called except through such a reference are checked: transformer
layer classes, sharding strategies and utils.tpu_mesh_shape; t5's MtfModel
is never used by this package (training goes through mtf's utils.run).
The messages are core/binding_checks.py's, which `mtf_th train` and `mtf_th
plan` run on the gin text before TensorFlow loads: this module sees what
only gin's live bindings show (e.g. a macro referred to only by a binding
that a layer stack's scoped one shadows).
"""
import gin
from gin import config_parser

from mtf_talking_heads.core import binding_checks
from mtf_talking_heads.core import compat

TPU_MESH_SHAPE = "mesh_tensorflow.transformer.utils.tpu_mesh_shape"
MTF_MODEL = "t5.models.mtf_model.MtfModel"
_MACRO = "gin.macro"


def bindings(param):
  """The gin BindingStatements of one --gin_param string.

  gin's own delegate makes the references (printed "@name", "@name()",
  "%macro"); gin.parse_config has already accepted `param`, so every name
  it references is registered.
  """
  parser = config_parser.ConfigParser(param, gin.config.ParserDelegate())
  return [s for s in parser if isinstance(s, config_parser.BindingStatement)]


def _walk(value, found):
  """Collects the ConfigurableReferences in a bound value (nested too)."""
  if isinstance(value, gin.config.ConfigurableReference):
    found.append(value)
  elif isinstance(value, (list, tuple, set)):
    for v in value:
      _walk(v, found)
  elif isinstance(value, dict):
    for v in value.values():
      _walk(v, found)
  return found


def _shadowed(scope, selector, param, config):
  """An unscoped binding that a Bitransformer never reads: both its stacks
  (gin scopes encoder/ and decoder/) bind the same parameter (e.g. mtf's
  defaults.gin `transformer.make_layer_stack.layers = [...]`)."""
  if scope or models_query("utils.run.model_type",
                           "bitransformer") != "bitransformer":
    return False
  return all(param in config.get((s, selector), {})
             for s in ("encoder", "decoder"))


def models_query(name, default):
  from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
  return models.query(name, default)


def references():
  """(macro names, configurable selectors) referenced by the parsed config."""
  config = compat.gin_bindings()
  found = []
  for (scope, selector), params in config.items():
    for param, value in params.items():
      if not _shadowed(scope, selector, param, config):
        _walk(value, found)
  macros, configurables = set(), set()
  for ref in found:
    if ref.configurable.name == "macro":
      macros.add(ref.scoped_selector.rsplit("/", 1)[0])
    else:
      configurables.add(ref.configurable.selector)
  return macros, configurables


def defined_macros():
  return sorted(scope for scope, selector in compat.gin_bindings()
                if selector == _MACRO)


def _reference_only(configurable):
  """True for configurables that run only when something references them."""
  if configurable.selector in (TPU_MESH_SHAPE, MTF_MODEL):
    return True
  cls = configurable.wrapped
  if not isinstance(cls, type):
    return False
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  return issubclass(cls, (transformer.TransformerLayer, strategies.Strategy))


def _short(selector):
  """mesh_tensorflow.transformer.utils.tpu_mesh_shape -> utils.tpu_mesh_shape."""
  parts = selector.split(".")
  return ".".join(parts[-2:]) if len(parts) > 2 else selector


def _check_macro(param, name, used_macros):
  if name in used_macros:
    return
  raise ValueError(binding_checks.unused_macro(param, name, used_macros))


def _check_configurable(param, statement, used_configurables):
  configurable = compat.gin_configurable(statement.selector)
  if configurable is None or not _reference_only(configurable):
    return
  if configurable.selector in used_configurables:
    return
  if _short(configurable.selector) == "mtf_th.Auto" and any(
      _short(s).startswith("mtf_th.") and s.endswith("Attention")
      for s in used_configurables):
    return  # every mtf_th attention layer's default strategy
  if configurable.selector in (TPU_MESH_SHAPE, MTF_MODEL):
    raise ValueError(binding_checks.ignored_mesh_binding(
        param, statement.arg_name, statement.value,
        configurable.selector == MTF_MODEL))
  peers = sorted(
      _short(s) for s in used_configurables
      if _reference_only(compat.gin_configurable(s)))
  raise ValueError(binding_checks.unused_configurable(
      param, _short(configurable.selector), peers))


def check_params(gin_params):
  """Raises ValueError for a --gin_param that the parsed config ignores.

  Call after parsing (every file and binding).

  Args:
    gin_params: the binding strings given on the command line.
  Raises:
    ValueError: naming the binding and what to write instead.
  """
  used_macros, used_configurables = references()
  for param in gin_params:
    for statement in bindings(param):
      if not statement.arg_name:
        name = ("%s/%s" % (statement.scope, statement.selector)
                if statement.scope else statement.selector)
        _check_macro(param, name, used_macros)
      else:
        _check_configurable(param, statement, used_configurables)
