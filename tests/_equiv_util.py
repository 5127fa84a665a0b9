"""Helpers shared by test_reference, test_mtf_equivalence, test_gradients,
test_decode, test_strategies and test_sharded.

* `Probe` wraps an attention layer inside a Unitransformer and records the
  mtf tensors it saw (its input X, after the layer norm, and its output Y),
  so a test can compare one sub-layer against the NumPy reference.
* `Twins` runs two layers on the same X, so a paper identity (e.g. talking
  heads with identity projections == multi-head) can be checked in mtf.
* `paper_weights` maps a layer's variables (our layouts) to the paper's
  index order used by tests/_reference.py.
* `export` / `run` fetch recorded mtf tensors from a `harness.Harness`.
"""
from mtf_talking_heads.core import compat  # noqa: F401  (before mesh_tensorflow)
import mesh_tensorflow as mtf  # pylint: disable=g-bad-import-order
from mesh_tensorflow.transformer import transformer
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import layers as th_layers


class Probe(transformer.TransformerLayer):
  """A TransformerLayer that calls `inner` and records its X and Y.

  Variables of `inner` live under "<stack>/<name>/Probe/".

  Args:
    inner: a TransformerLayer (e.g. mtf_th.TalkingHeadsAttention(...)).
    name: a unique name (the variable scope of this layer in the stack).
    sequence_id: optional int array [batch, length]; if given, it is set on
      the context (as a packed/padded batch would have it) before `inner`
      runs, so mtf's padding mask reaches this and every later layer.
  """

  def __init__(self, inner, name, sequence_id=None):
    self.inner = inner
    self.sequence_id = sequence_id
    self.x = None
    self.y = None
    self.fully_autoregressive = None
    self.set_name(name)

  def call(self, context, x, losses=None):
    if (self.sequence_id is not None
        and not isinstance(context.sequence_id, mtf.Tensor)):
      context.sequence_id = mtf.import_tf_tensor(
          context.mesh, tf.constant(self.sequence_id, tf.int32),
          context.batch_dims + [context.length_dim])
    y = self.inner.call(context, x)
    self.x, self.y = x, y
    self.fully_autoregressive = context.model.fully_autoregressive
    return y

  @property
  def scope(self):
    return "%s/Probe/" % self.name


class Twins(transformer.TransformerLayer):
  """Calls layers `a` and `b` on the same X (scopes a/ and b/).

  Returns the mean of their outputs, so both take part in the loss (every
  variable then has a gradient).
  """

  def __init__(self, a, b, name):
    self.a = a
    self.b = b
    self.x = self.y_a = self.y_b = None
    self.set_name(name)

  def call(self, context, x, losses=None):
    with tf.variable_scope("a"):
      self.y_a = self.a.call(context, x)
    with tf.variable_scope("b"):
      self.y_b = self.b.call(context, x)
    self.x = x
    return (self.y_a + self.y_b) * 0.5

  def scope(self, which):
    return "%s/Twins/%s/" % (self.name, which)



def relative_error(got, want):
  """max |got - want| / max |want| (shapes must agree), in float64."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  return np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)

def export(h, tensors):
  """tf tensors (float64) for mtf tensors {key: mtf.Tensor} of harness h."""
  with h.graph.as_default():
    return {k: tf.cast(h.lowering.export_to_tf_tensor(t), tf.float64)
            for k, t in tensors.items()}


def run(h, exported):
  """Runs exported tensors in h's session: {key: float64 ndarray}."""
  return h.session.run(exported)


def layer_values(values, scope):
  """{short name: array} of the variables under `scope` (a name fragment)."""
  out = {}
  for name, value in values.items():
    i = name.find(scope)
    if i >= 0:
      out[name[i + len(scope):]] = np.asarray(value)
  if not out:
    raise KeyError("no variable under %r in %s" % (scope, sorted(values)))
  return out


def full_names(values, scope):
  """{short name: full variable name} of the variables under `scope`."""
  return {name[name.find(scope) + len(scope):]: name
          for name in values if scope in name}


def paper_weights(layer, v):
  """The paper's weights (index order of tests/_reference.py) of a layer.

  Args:
    layer: one of our layer objects (AttentionLayer or
      GeneralBilinearAttention).
    v: {short variable name: array} as created by that layer.
  Returns:
    dict of keyword arguments for the reference functions, e.g. P_q[d_X, d_k,
    h_k] from p_q[d_model, heads_k, d_k]; for general bilinear P[d_X, d_M, h]
    and Q[d_M, d_Y, h].
  """
  if isinstance(layer, th_layers.GeneralBilinearAttention):
    return {"P": v["p"].transpose(0, 2, 1), "Q": v["q"].transpose(0, 2, 1)}
  w = {"P_q": v["p_q"].transpose(0, 2, 1), "P_k": v["p_k"].transpose(0, 2, 1),
       "P_v": v["p_v"].transpose(0, 2, 1), "P_o": v["p_o"].transpose(2, 1, 0)}
  for ours, paper in (("p_l", "P_l"), ("p_w", "P_w"), ("p_xl", "P_Xl"),
                      ("p_ml", "P_Ml"), ("p_xw", "P_Xw"), ("p_mw", "P_Mw")):
    if ours in v:
      w[paper] = v[ours]
  return w


def max_rel_err(actual, expected):
  """max |actual - expected| / max |expected| (a scale-free error)."""
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  return float(np.max(np.abs(actual - expected))
               / max(np.max(np.abs(expected)), 1e-30))
