"""The paper's models from gin: where the gin files are, and what they build.

The models themselves are mesh_tensorflow.transformer's Bitransformer (T5) and
Unitransformer (BERT, ALBERT) with this package's attention layers, described
entirely by the gin files under the repository's ``gin/`` directory::

  gin/mtf_th.gin            plumbing: train loop, seed, mesh, dtype, optimiser
  gin/models/               t5_base, bert_base, albert_base, lm_small,
                            encdec_small (each with a *_tiny)
  gin/attention/            one file per variant (binds the mtf_th layer classes)
  gin/objectives/           span_corruption (T5), mlm (BERT), mlm_sop
                            (ALBERT), lm_bytes, prefix_lm_bytes,
                            span_corruption_bytes, copy_bytes
  gin/layouts/              data_parallel, heads_parallel, batch_model,
                            talking_heads_batch_split
  gin/experiments/<table>/  one file per row of the paper's tables

Importing this module puts ``gin/`` on gin's search path, so
``--gin_file=experiments/t5_heads/07_talking_heads_24_32.gin`` works from any
directory, for ``mtf_th`` and for ``t5_mesh_transformer
--module_import=mtf_talking_heads`` alike.

This module also reads a parsed configuration without building a graph:
``describe()`` instantiates the configured layer stacks (cheap Python
objects) and reports every tensor dimension the model will have, which the
pre-flight checks in training/checks.py compare with the mesh and layout.
"""
import collections
import logging
import os

import gin
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer

from mtf_talking_heads.core import compat
from mtf_talking_heads.estimate import model as model_lib
# models.gin_dir() is public too (the training package, setup.py's comment, tests)
from mtf_talking_heads.core.gin_paths import gin_dir  # pylint: disable=unused-import

MTF_DEFAULTS_GIN = os.path.join(os.path.dirname(transformer.__file__), "gin",
                                "defaults.gin")
# Tensor dims that mtf's own stock layouts name although a model may lack
# them (defaults.gin: "ensemble:ensemble,...,experts:batch"); harmless.
MTF_GENERIC_DIMS = frozenset(["ensemble", "experts", "outer_batch"])


def register_gin_search_path():
  """Adds gin_dir() to gin's file search path (idempotent)."""
  try:
    path = gin_dir()
  except FileNotFoundError:
    return None
  if path not in compat.gin_search_path():
    gin.add_config_file_search_path(path)
  return path


class _GinPathProbeFilter(logging.Filter):
  """Hides gin's "Path not found" noise: it logs an error for every include
  it first tries as a Python package before searching the gin directories."""

  def filter(self, record):
    return not str(record.msg).startswith("Path not found:")


if not any(isinstance(f, _GinPathProbeFilter) for f in logging.getLogger().filters):
  logging.getLogger().addFilter(_GinPathProbeFilter())
register_gin_search_path()


def list_gin_files(under=""):
  """Relative paths of the gin files under gin_dir()/under, sorted."""
  root = gin_dir()
  out = []
  for dirpath, _, names in os.walk(os.path.join(root, under)):
    for name in names:
      if name.endswith(".gin"):
        out.append(os.path.relpath(os.path.join(dirpath, name), root))
  return sorted(out)


def experiment_tables():
  """{table name: [experiment file, ...] in row order} from gin/experiments."""
  tables = collections.OrderedDict()
  for path in list_gin_files("experiments"):
    parts = path.split(os.sep)
    if len(parts) == 3:
      tables.setdefault(parts[1], []).append(path)
  return tables


# --------------------------------------------------------------------------
# Reading a parsed configuration


def query(name, default=None):
  """The value bound to gin parameter or macro `name`, macros resolved.

  Args:
    name: "utils.run.batch_size" or a macro name such as "heads".
    default: returned when nothing is bound.
  Returns:
    the literal value; a gin ConfigurableReference (e.g. @fn()) is returned
    as is.
  """
  key = name if "." in name else name + "/macro.value"
  try:
    value = gin.query_parameter(key)
  except ValueError:
    return default
  return _resolve(value)


def _resolve(value):
  """Replaces macro references (also nested in lists/dicts) by their values."""
  if isinstance(value, gin.config.ConfigurableReference):
    if value.configurable.name == "macro":
      return query(value.scoped_selector.rsplit("/", 1)[0])
    return value
  if isinstance(value, (list, tuple)):
    return type(value)(_resolve(v) for v in value)
  if isinstance(value, dict):
    return {k: _resolve(v) for k, v in value.items()}
  return value


ModelDescription = collections.namedtuple(
    "ModelDescription",
    ["model_type", "d_model", "vocab_size", "stacks", "dims",
     "positional_embedding", "max_length"])


def _stack_layers(scope):
  """The layer objects of the configured layer stack in gin scope `scope`."""
  if scope:
    with gin.config_scope(scope):
      return transformer.make_layer_stack().layers
  return transformer.make_layer_stack().layers


def _scoped(name, scope):
  if scope:
    value = query("%s/%s" % (scope, name))
    if value is not None:
      return value
  return query(name)


def describe(model_type, vocab_size):
  """What the configured model will contain, without building a graph.

  Instantiates the layer stacks (attention layers validate their arguments
  here and raise ValueError naming the parameter) and collects every tensor
  dimension name with its size.

  Args:
    model_type: "bitransformer", "aligned" or "lm".
    vocab_size: the vocabulary size (unpadded).
  Returns:
    a ModelDescription; dims maps dim name -> size (None if it varies).
  Raises:
    ValueError: for an unknown model_type or a bad layer argument.
  """
  if model_type == "bitransformer":
    scopes = {"encoder": "encoder", "decoder": "decoder"}
  elif model_type in ("aligned", "lm", "delimited_lm"):
    scopes = {"transformer": ""}
  else:
    raise ValueError(
        "utils.run.model_type must be one of bitransformer, aligned, lm, "
        "delimited_lm, got %r" % (model_type,))
  d_model = query("transformer.Unitransformer.d_model") or query("d_model")
  d_model_dim = mtf.Dimension("d_model", d_model)
  dims = {"d_model": d_model,
          "vocab": model_lib.padded_vocab(vocab_size),
          "batch": None, "length": None, "memory_length": None}
  stacks = {}
  positional = None
  max_length = None
  for stack_name, scope in scopes.items():
    layers = _stack_layers(scope)
    stacks[stack_name] = layers
    pos = _scoped("transformer.Unitransformer.positional_embedding", scope)
    if pos is None:
      pos = True
    if pos and not (model_type == "bitransformer" and stack_name == "decoder"
                    and positional is False):
      positional = bool(pos) if positional is None else positional or pos
      max_length = _scoped("transformer.Unitransformer.max_length", scope)
      if pos:
        dims["max_length"] = max_length
    elif positional is None:
      positional = False
    for layer in layers:
      shapes = {}
      if hasattr(layer, "weight_shapes"):
        shapes = layer.weight_shapes(d_model_dim)
      for shape in shapes.values():
        for dim in shape:
          dims[dim.name] = dim.size
      if hasattr(layer, "activation_heads"):
        for dim in layer.activation_heads():
          dims[dim.name] = dim.size
      hidden = getattr(layer, "hidden_size", None)
      if hidden is not None:
        dims["d_ff"] = hidden
  embedding_cls = query("transformer.get_vocab_embedding_cls.cls")
  if embedding_cls is not None and "Factorized" in repr(embedding_cls):
    dims["inner_vocab"] = query(
        "vocab_embeddings.FactorizedVocabEmbedding.inner_dimension_size")
  return ModelDescription(model_type, d_model, vocab_size, stacks, dims,
                          bool(positional), max_length)


def attention_layers(description):
  """[(stack name, layer)] for every attention layer of a description."""
  out = []
  for name, layers in description.stacks.items():
    for layer in layers:
      if hasattr(layer, "activation_heads"):
        out.append((name, layer))
  return out
