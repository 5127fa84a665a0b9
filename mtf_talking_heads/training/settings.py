"""Gin parsing and the run settings it binds.

Owns parse_gin (clear gin, parse mtf's defaults.gin, the gin files and the
bindings, refuse bindings nothing uses), resolve_gin_file, Settings (what
utils.run will receive: model type, mesh, layout, batch, lengths, steps,
task) and the configured vocabulary's size.  The checks of those settings
are checks.py's.
"""
import gin
import gin.tf  # pylint: disable=unused-import  (GinConfigSaverHook)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils as mtf_utils

from mtf_talking_heads.core import compat
from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.nn import layers  # noqa: F401  pylint: disable=unused-import  (gin classes)
from mtf_talking_heads.nn import models
from mtf_talking_heads.training import errors


def resolve_gin_file(name):
  """Absolute path of gin file `name` (a path, or relative to gin's search path).

  Raises:
    ConfigError: naming the file, the directories searched and close matches.
  """
  try:
    return gin_paths.resolve(name, compat.gin_search_path())
  except FileNotFoundError as e:
    raise errors.ConfigError(str(e)) from None


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
      raise errors.ConfigError(
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
        raise errors.ConfigError(
            "gin file %s: %s" % (path, _gin_message(e))) from e
    for param in gin_params:
      try:
        gin.parse_config(param)
      except (ValueError, KeyError, TypeError, SyntaxError, ImportError) as e:
        raise errors.ConfigError("--gin_param %r: %s"
                                 % (param, _gin_message(e))) from e
  from mtf_talking_heads.nn import gin_checks  # pylint: disable=g-import-not-at-top
  try:  # a misspelt macro, a binding nothing uses
    gin_checks.check_params(gin_params)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e


def _gin_message(e):
  """gin's first line (it adds "In bindings string line 1" and the text)."""
  message = (str(e).strip().splitlines() or [""])[0]
  if "No configurable matching" in message:
    message += (" (check the spelling; this package's layers are "
                "mtf_th.<Variant>Attention / mtf_th.<Variant>EncoderAttention, "
                "e.g. mtf_th.TalkingHeadsAttention.heads)")
  elif "doesn't have a parameter" in message or "has no parameter" in message:
    message += " (see the configurable's docstring for its parameters)"
  return message


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
        raise errors.ConfigError(
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
        raise errors.ConfigError(
            "mesh_shape %r is not a mesh shape (%s): write it like 'model:8' "
            "or 'batch:2,model:4'" % (raw_mesh, e)) from e
      if self.mesh_shape is None:
        raise errors.ConfigError(
            "mesh_shape is not set: bind utils.run.mesh_shape (or the "
            "mesh_shape macro), e.g. 'model:1'")
      for d in self.mesh_shape.dims:
        if d.size < 1:
          raise errors.ConfigError(
              "mesh_shape %r: every mesh dimension needs a size >= 1"
              % (raw_mesh,))
    raw_layout = models.query("utils.run.layout_rules")
    try:
      self.layout = mtf.convert_to_layout_rules(raw_layout or "")
    except (ValueError, TypeError) as e:
      raise errors.ConfigError(
          "layout %r is not a layout (%s): write it like "
          "'batch:batch,heads:model'" % (raw_layout, e)) from e
    self.layout_string = raw_layout
    self.batch_size = models.query("utils.run.batch_size")
    if isinstance(self.batch_size, (tuple, list)) and self.mesh_shape:
      self.batch_size = mtf_utils.compute_batch_size(
          self.sequence_length_or_none(), self.mesh_shape, self.layout,
          self.batch_size)
    errors.positive_int("batch_size", self.batch_size,
                        " (macro batch_size / utils.run.batch_size)")
    self.sequence_length = self.sequence_length_or_none()
    if self.sequence_length is None:
      raise errors.ConfigError(
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


def vocab_size():
  """Size of the configured vocabulary (builds the default one if needed)."""
  vocabulary = models.query("utils.run.vocabulary")
  if isinstance(vocabulary, gin.config.ConfigurableReference):
    with gin.unlock_config():
      vocabulary = vocabulary.scoped_configurable_fn()
  if vocabulary is None:
    raise errors.ConfigError("utils.run.vocabulary is not set: include an "
                             "objective file (objectives/*.gin)")
  from mtf_talking_heads.data import vocab  # pylint: disable=g-import-not-at-top
  if isinstance(vocabulary, (tuple, list)):
    return max(vocab.vocab_size_of(v) for v in vocabulary)
  return vocab.vocab_size_of(vocabulary)
