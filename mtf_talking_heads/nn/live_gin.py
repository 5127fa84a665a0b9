"""The model gin's live bindings describe, for strategies.Auto.

While `mtf_th train` (or any command that parsed the gin files) builds the
graph, Auto prices each attention layer's strategies with the estimators
(estimate/planner.py, TensorFlow-free); for the memory of a whole step it
needs the whole model.  model_from_live_gin reads the same macros as
estimate/model.model_from_gin, but from the bindings gin holds now, not
from files: that needs gin's runtime state (nn/models.query), so it lives
here, above the estimators.
"""
import gin

from mtf_talking_heads.core import gin_text
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import planner


def model_from_live_gin(vocab, batch=None):
  """The model.Model of gin's current configuration, or None.

  What strategies.Auto reads while `mtf_th train` (or any command that
  parsed the gin files) builds the graph: model.model_from_gin's macros,
  from the bindings gin holds now.  None when they do not describe a model
  model.py reads (a test harness building layers by hand).

  Args:
    vocab: the model's vocabulary size.
    batch: the batch the graph is built with (None: batch_size).
  """
  try:
    model = model_lib.model_from_config(_LiveGin(), "the gin configuration",
                                        vocab)
  except (ValueError, TypeError, KeyError):
    return None
  return model if batch is None else model._replace(batch=batch)


def model_for_layer(vocab, batch, att, d_model, n):
  """model_from_live_gin's Model if it holds this layer, else None.

  The layer's attention, d_model and length must be the model's: gin may
  still hold another configuration than the graph being built (a test
  building layers by hand after a command parsed a model).
  """
  model = model_from_live_gin(vocab, batch)
  if model is None or model.d_model != d_model or n not in (
      model.inputs_length, model.targets_length) or all(
          a != att for _, a, _, _ in planner.attentions(model)):
    return None
  return model


class _LiveGin(object):
  """gin_text.GinConfig's questions answered by gin's current bindings."""

  def __init__(self):
    from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
    self._query = models.query

  def _convert(self, value):
    if isinstance(value, gin.config.ConfigurableReference):
      return gin_text.Reference(value.selector, value.evaluate)
    return value

  def binding(self, key, default=None):
    return self._convert(self._query(key, default))

  def __contains__(self, name):
    return self._query(name) is not None

  def get(self, name, default=None):
    return self._convert(self._query(name, default))

  def require(self, name, where):
    if name not in self:
      raise ValueError("%s does not define the gin macro %r" % (where, name))
    return self.get(name)
