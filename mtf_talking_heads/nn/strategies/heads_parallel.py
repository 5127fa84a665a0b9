"""HeadsParallel: the core keeps the layer's heads dims as laid out."""
import gin
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn.strategies import frame
from mtf_talking_heads.nn.strategies import mesh_layout


@gin.configurable(module="mtf_th")
class HeadsParallel(frame.Strategy):
  """The baseline: the core keeps the layer's heads dims, as laid out by the
  layout rules (e.g. heads:model).  Talking-heads projections mix heads, so a
  split heads dim makes them collectives over n x m x heads tensors.

  Args:
    ordered: True: kernels.ordered_core (heads-major n x m x heads tensors,
      fast on CPU); False: attention.attention_core exactly as the paper's
      pseudocode lays it out (the reference the tests compare against).
  """

  name = "heads_parallel"

  def __init__(self, ordered=True):
    self.ordered = ordered

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """Returns O[..., n, h_v, d_v] (dims in any order; Y contracts by name)."""
    mesh = mesh_layout.model_layout(context)
    length = mesh_layout.size_of(q, mesh_layout.LENGTH)
    if mesh is not None and length is not None:
      mesh_layout.check_layout(
          dims, mesh, mesh_layout.size_of(q, mesh_layout.BATCH) or 1, length)
    with tf.variable_scope(mesh_layout.CORE_SCOPE):
      if not self.ordered:
        return attention.attention_core(q, k, v, memory_length, dims, p_l,
                                        p_w, dynamic_l, dynamic_w, bias,
                                        dropout_fn)
      return kernels.ordered_core(
          q, k, v, memory_length, dims, p_l, p_w, dynamic_l, dynamic_w, bias,
          dropout_fn, fused_softmax=not (
              mesh and mesh.axis_of(memory_length.name)), layout=mesh)
