"""The model's size, printed first.

Owns report(): after the pre-flight and before any graph is built, train,
eval, decode and finetune print one line with the configured model's
parameters, d_model, layers and heads, so a gin-order mistake (a scale file
overridden by a later file) shows at once.  Whether a training run fits in
this machine's RAM is fit_check.cpu_refusal's (memory.py's prediction),
checked by `mtf_th train` and `mtf_th finetune` before this.

The parameters are counted exactly: the model's mtf graph is built (not
lowered) in a scratch tf.Graph and its trainable variables are summed; no
variable is initialised, so this costs a second, not memory.
"""
import sys

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import utils as mtf_utils
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import models
from mtf_talking_heads.training import settings as settings_lib

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

  Returns:
    call_simple's (logits, loss).
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
  return model.call_simple(inputs=inputs, targets=targets, compute_loss=True,
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


def report(settings, description, label="mtf_th", log=None):
  """Prints the size line.

  Args:
    settings, description: the pre-flight's (checks.preflight()).
    label: the line's prefix, e.g. "train".
    log: where to print (default stderr).
  Returns:
    the parameter count.
  """
  params = count_parameters(settings)
  print("[%s] %s" % (label, describe(settings, description, params)),
        file=log or sys.stderr, flush=True)
  return params
