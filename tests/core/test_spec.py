"""spec.py's table and checks agree with the layers they describe.

VARIANT_TABLE stores, per variant, whether it has P_l and P_w; the layers
decide it from their dim names (attention.AttentionDims: P_l iff heads_k and
heads are different dims, P_w iff heads and heads_v are).  The two must not
drift: each variant's gin class is built (no graph) and compared.
"""
import pytest

from mtf_talking_heads.core import spec
from mtf_talking_heads.nn import layers

_SMALL = dict(heads=4, d_k=4, d_v=4)
_EXTRA = {spec.GROUPED: dict(groups=2), spec.DYNAMIC: dict(dynamic=("x2l",))}


@pytest.mark.parametrize("variant", [v for v in spec.VARIANTS
                                     if v != spec.BILINEAR])
def test_table_flags_follow_the_layers_dim_names(variant):
  v = spec.VARIANT[variant]
  self_class, enc_class = layers.VARIANTS[variant]
  assert (self_class.__name__, enc_class.__name__) == (
      spec.layer_class_names(variant))
  dims = layers.make_attention(variant, **dict(_SMALL,
                                               **_EXTRA.get(variant, {}))).dims
  assert (v.project_logits, v.project_weights) == (
      dims.heads_k.name != dims.heads.name,
      dims.heads.name != dims.heads_v.name)
  assert (dims.project_logits, dims.project_weights) == (
      v.project_logits, v.project_weights)


def test_general_bilinear_has_one_heads_dim_and_no_projection():
  layer = layers.make_attention(spec.BILINEAR, heads=4)
  assert layer.heads == ("heads", 4)
  v = spec.VARIANT[spec.BILINEAR]
  assert not (v.project_logits or v.project_weights)


@pytest.mark.parametrize("value,message", [
    (True, "heads must be an int or a (name, size) pair, got True"),
    (("heads", False), "heads must be an int or a (name, size) pair, got "
     "('heads', False)"),
    (0, "heads must have a positive size, got 0; set heads to a positive "
     "integer"),
])
def test_dim_pair_refuses_bools_and_sizes_below_one(value, message):
  with pytest.raises(ValueError) as e:
    spec.dim_pair(value, "heads", "heads")
  assert str(e.value) == message
  with pytest.raises(ValueError) as e:  # the same check in general bilinear
    layers.GeneralBilinearAttention(heads=value)
  assert str(e.value).splitlines()[0] == message
