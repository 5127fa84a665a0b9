"""The protocol between an attention layer and its strategy.

The layer (layers.AttentionLayer.call) tells its strategy what it is about
to compute in an AttentionCall, and ``strategy.frame(call)`` returns the
Frame the layer computes in: where its projections run and the core it
calls with Q, K, V.  Strategy is the base class of every strategy.
"""
import collections

from mtf_talking_heads.nn.strategies import mesh_layout


class AttentionCall(collections.namedtuple("AttentionCall", [
    "layer_name", "dims", "dynamic", "context", "x", "memory"])):
  """What an attention layer tells its strategy before computing anything.

  Fields:
    layer_name: the layer's class name (Auto logs it).
    dims: the layer's attention.AttentionDims.
    dynamic: its dynamic terms, e.g. ("x2l", "m2w").
    context: the mtf transformer Context.
    x: X[batch..., length, d_model] (incremental: no length).
    memory: encoder attention's M[batch..., memory_length, d_model] (the
      encoder output); None for self-attention.
  """


class Frame(object):
  """Where a layer computes its projections, and the core it calls.

  The layer (layers.AttentionLayer.call) computes, in this order::

    weights = frame.gather_weights(weights)          # {name: weight}
    Q = compute_q(frame.to_core(X)), K, V, R_M from frame.to_core(M)
    O = frame.core(context, frame.dims, Q, K, V, ..., frame.to_core(bias))
    Y = frame.from_core(compute_y(O, P_o, frame.dims))

  This one changes nothing: the projections run as the layout lays them
  out, and `core` (a strategy's core, Strategy.core's arguments) moves
  what it needs.  GatheredBatchSplit's frame cuts the batch over the mesh
  axis instead (plans.Plan).

  Attributes:
    core: fn(context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
      dynamic_w, bias, dropout_fn) -> O[..., n, h_v, d_v].
    dims: the heads dims Q, K, V and the weights carry in this frame.
  """

  def __init__(self, core, dims):
    self.core = core
    self.dims = dims

  def gather_weights(self, weights):
    """{name: weight} as the projections use them."""
    return weights

  def to_core(self, t):
    """X, M or the bias as the projections and the core use them."""
    return t

  def from_core(self, y):
    """Y back in the layer's layout."""
    return y


class Strategy(object):
  """Base class: `frame` places a layer's projections, `core` computes O
  from Q, K, V, `check` validates a layout."""

  name = None

  def layout_rules(self):
    """(tensor-dim name, mesh axis) pairs this strategy's layout needs."""
    return []

  def check(self, dims, mesh_shape, layout, batch, length):
    """Raises ValueError (naming dim and mesh axis) if this cannot apply.

    Args:
      dims: attention.AttentionDims of the layer.
      mesh_shape: e.g. "model:8" or "batch:2;model:4".
      layout: layout rules, e.g. "heads_k:model;heads_v:model".
      batch: the batch size.
      length: the sequence length (n = m).
    """
    self._check(dims, mesh_layout.MeshLayout(mesh_shape, layout), batch,
                length)

  def _check(self, dims, mesh, batch, length):
    """check() on a MeshLayout: the layer's layout must split cleanly."""
    mesh_layout.check_layout(dims, mesh, batch, length)

  def core_layout(self, dims, mesh, batch, length):
    """The MeshLayout the core's dims keep (core_kernel asks it before a
    graph), None if the core has them whole.  This default: the layer's
    (a heads-parallel core).  Arguments as _check's."""
    del dims, batch, length
    return mesh

  def frame(self, call):
    """The Frame the layer of `call` (an AttentionCall) computes in.

    This default keeps the projections as the layout lays them out (Q, K, V
    with the layer's heads dims, Y summed over them) and moves only the
    core (self.core), in every mode (train/eval, first_part, incremental).
    """
    return Frame(self.core, call.dims)

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """O[..., n, h_v, d_v] from Q, K, V (see attention.attention_core)."""
    raise NotImplementedError("%s.core" % type(self).__name__)
