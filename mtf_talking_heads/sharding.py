"""Sharding strategies for the n x m x heads core of the attention layers.

A strategy decides how the core (J, L, W, U, O; see attention.attention_core)
is laid out across the mesh.  The layer computes Q, K, V (and the dynamic R
tensors) with its own heads dims, hands them to ``strategy.core(...)`` and
projects the returned O with P_o.  A strategy may rename dims of its inputs
(each rename is an mtf reshape: free, an all-gather or an all-to-all,
depending on the layout) as long as the result equals the unsharded one.
"""
import gin

from mtf_talking_heads import attention


@gin.configurable(module="mtf_th")
class HeadsParallel(object):
  """The baseline: the core keeps the layer's heads dims, as laid out by the
  layout rules (e.g. heads:model).  Talking-heads projections mix heads, so a
  split heads dim makes them collectives over n x m x heads tensors.
  """

  def core(self, context, dims, q, k, v, memory_length, p_l, p_w, dynamic_l,
           dynamic_w, bias, dropout_fn):
    """Returns O[..., n, h_v, d_v] (see attention.attention_core)."""
    del context
    return attention.attention_core(q, k, v, memory_length, dims, p_l, p_w,
                                    dynamic_l, dynamic_w, bias, dropout_fn)
