"""The model's size, printed first, and refused when it cannot fit in RAM.

Owns report(): after the pre-flight and before any graph is built, train,
eval, decode and finetune print one line with the configured model's
parameters, d_model, layers and heads, so a gin-order mistake (a scale file
overridden by a later file) shows at once; on CPU a model whose parameters
alone need more than the machine's RAM is refused (ConfigError).

The parameters are counted exactly: the model's mtf graph is built (not
lowered) in a scratch tf.Graph and its trainable variables are summed; no
variable is initialised, so this costs a second, not memory.

The memory bound is a lower bound: BYTES_PER_PARAMETER = 12 per parameter
(float32 master weights, the per-device slices mtf copies them to, and the
gradients) plus, for training, the attention weights every attention layer
keeps for the backward pass (batch x heads x n x m float32 each); the other
activations and the optimizer state come on top.  E.g. the base T5 of
experiments/t5_heads/07 (204.6 M parameters; batch 128, lengths 512 / 114,
24 heads, 12 + 12 + 12 attention layers) needs at least 51.6 GB: on a 24 GB
machine it was killed after 231 s; now it is refused before the graph is
built.
"""
import sys

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils as mtf_utils
import tensorflow.compat.v1 as tf

from mtf_talking_heads import models
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import settings as settings_lib

BYTES_PER_PARAMETER = 12


def build_model(settings, layout_rules, mesh_shape):
  """The configured mtf model (t5's build_model with the task's vocabulary)."""
  vocab = settings_lib.vocab_size()
  return mtf_utils.build_model(
      model_type=settings.model_type, input_vocab_size=vocab,
      output_vocab_size=vocab, layout_rules=layout_rules,
      mesh_shape=mesh_shape)


def call_model(model, settings, mesh):
  """Builds `model`'s training loss on `mesh` from constant features.

  Every variable the model has is created; nothing is lowered.  Features
  are ones of shape [batch, length] for each of settings.sequence_length,
  e.g. {"inputs": [8, 16], "targets": [8, 8]} for a T5.
  """
  batch = mtf.Dimension("batch", settings.batch_size)
  features = {}
  for key, length in settings.sequence_length.items():
    shape = mtf.Shape([batch, mtf.Dimension("length", length)])
    features[key] = mtf.import_fully_replicated(
        mesh, tf.ones(shape.to_integer_list, tf.int32), shape, name=key)
  targets = features["targets"]
  inputs = features.get("inputs", targets)
  if settings.model_type in ("lm", "delimited_lm"):
    inputs = mtf.shift(targets, offset=1, dim=targets.shape.dims[-1],
                       wrap=False)
  model.call_simple(inputs=inputs, targets=targets, compute_loss=True,
                    mode=tf.estimator.ModeKeys.TRAIN,
                    variable_dtype=mtf_utils.get_variable_dtype())


def count_parameters(settings):
  """Trainable parameters of the configured model (its mtf variables).

  Args:
    settings: settings_lib.Settings of the parsed configuration.
  Returns:
    an int.
  """
  model = build_model(
      settings, mtf.convert_to_layout_rules(settings.layout_string or ""),
      settings.mesh_shape or mtf.convert_to_shape("model:1"))
  with tf.Graph().as_default():
    graph = mtf.Graph()
    call_model(model, settings, mtf.Mesh(graph, "size"))
    return sum(v.size for v in graph.trainable_variables)


def attention_weight_bytes(settings, description):
  """Bytes of the attention weights (softmax outputs) training keeps.

  Sum over attention layers of batch x heads x n x m x 4 (float32), with n,
  m the query and memory lengths of the layer's place in the model.
  """
  lengths = settings.sequence_length
  inputs = lengths.get("inputs", lengths.get("targets"))
  targets = lengths.get("targets", inputs)
  total = 0
  for stack, layer in models.attention_layers(description):
    heads = 1
    for d in (layer.bias_heads() if hasattr(layer, "bias_heads")
              else layer.activation_heads()):
      heads *= d.size
    if stack == "encoder" or settings.model_type == "aligned":
      n = m = inputs
    elif type(layer).__name__.endswith("EncoderAttention"):
      n, m = targets, inputs
    else:
      n = m = targets
    total += settings.batch_size * heads * n * m * 4
  return total


def machine_ram_bytes():
  """MemTotal of /proc/meminfo (None where there is none)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def describe(settings, description, params):
  """One line: type, parameters, d_model, layers, heads, d_k / d_v."""
  dims = description.dims
  heads = dims.get("heads")
  parts = ["%s" % settings.model_type,
           "%s parameters" % format(params, ",")]
  parts.append("d_model %s" % description.d_model)
  layers = models.query("num_layers")
  if layers is not None:
    parts.append("%s layers%s" % (layers, " per stack" if len(
        description.stacks) > 1 else ""))
  if heads is not None:
    groups = dims.get("groups")
    extra = ["%s %s" % (k, dims[k]) for k in ("heads_k", "heads_v", "d_k",
                                              "d_v") if k in dims]
    if groups:  # grouped talking heads: dims are per group
      extra = ["%d groups of %d" % (groups, heads)] + [
          "%s %d" % (e.split()[0], int(e.split()[1]) * groups)
          if e.startswith("heads") else e for e in extra]
      heads *= groups
    parts.append("heads %s%s" % (heads, (" (%s)" % ", ".join(extra))
                                 if extra else ""))
  parts.append("mesh %s" % (models.query("utils.run.mesh_shape") or "?"))
  return "model: " + ", ".join(parts)


def report(settings, description, tpu=None, label="mtf_th", train=True,
           log=None):
  """Prints the size line; on CPU refuses a model RAM cannot hold.

  Args:
    settings, description: the pre-flight's (checks.preflight()).
    tpu: a TPU run is not checked against this machine's RAM.
    label: the line's prefix, e.g. "train".
    train: count the attention weights kept for the backward pass.
  Returns:
    the parameter count.
  Raises:
    ConfigError: the lower bound of the memory needed > this machine's RAM.
  """
  params = count_parameters(settings)
  print("[%s] %s" % (label, describe(settings, description, params)),
        file=log or sys.stderr, flush=True)
  ram = machine_ram_bytes()
  weights = params * BYTES_PER_PARAMETER
  kept = attention_weight_bytes(settings, description) if train else 0
  if not tpu and ram and weights + kept > ram:
    raise errors.ConfigError(
        "this model needs at least %.1f GB (%s parameters x %d bytes%s) but "
        "this machine has %.1f GB of RAM: give a smaller scale file (e.g. "
        "models/t5_tiny.gin) as the LAST --gin_file, or lower batch_size, "
        "the lengths, d_model or num_layers" % (
            (weights + kept) / 1e9, format(params, ","), BYTES_PER_PARAMETER,
            (" + %.1f GB of attention weights kept for the backward pass"
             % (kept / 1e9)) if kept else "", ram / 1e9))
  return params
