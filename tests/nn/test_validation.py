"""Bad input is rejected before any graph exists, with a message naming it.

Every case runs inside a fresh tf.Graph and asserts that (a) a ValueError is
raised, (b) the graph still has no operation (nothing was built), and (c)
the message names the parameter at fault and the values involved.  The
positive tests check the tensor shapes validation derives from the layers
and that its verdicts agree with mtf's own layout rules.
"""
import re

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer_layers
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import validation

D_MODEL, BATCH, LENGTH = 16, 4, 8


def _th(**kwargs):
  args = dict(heads_k=16, heads=8, heads_v=24, d_k=4, d_v=4)
  args.update(kwargs)
  return layers.TalkingHeadsAttention(**args)


def _check(layout, mesh_shape="model:8", attention=None, **kwargs):
  return validation.check_layers(
      [attention or _th()], D_MODEL, mesh_shape, layout, BATCH, LENGTH,
      **kwargs)


BAD_INPUTS = [
    # (id, callable, words the message must contain)
    ("heads_zero", lambda: layers.MultiHeadAttention(heads=0),
     ["heads", "positive"]),
    ("heads_k_negative", lambda: _th(heads_k=-8), ["heads_k", "positive"]),
    ("project_weights_heads_zero",
     lambda: layers.ProjectWeightsAttention(heads=0), ["heads", "positive"]),
    ("general_bilinear_heads_zero",
     lambda: layers.GeneralBilinearAttention(heads=0), ["heads", "positive"]),
    ("same_name_different_sizes",
     lambda: _th(heads_k=("heads", 16), heads=("heads", 8)),
     ["heads_k", "heads", "16", "8"]),
    ("d_k_named_like_a_heads_dim", lambda: _th(d_k=("heads", 8)),
     ["d_k", "heads"]),
    ("heads_not_divisible_by_mesh",
     lambda: _check("heads:model", attention=_th(heads=12)),
     ["layout", "heads", "12", "model", "8"]),
    ("two_dims_of_p_l_on_one_mesh_dim",
     lambda: _check("heads_k:model;heads:model"),
     ["layout", "p_l", "heads_k", "heads", "model"]),
    ("two_dims_of_p_w_on_one_mesh_dim",
     lambda: _check("heads:model;heads_v:model"),
     ["layout", "p_w", "heads", "heads_v", "model"]),
    ("unknown_dim_in_layout", lambda: _check("head:model"),
     ["layout", "'head'", "known dims", "heads_k"]),
    ("unknown_mesh_dim_in_layout", lambda: _check("heads:modle"),
     ["layout", "'modle'", "mesh dims: model"]),
    ("data_parallel_rule_without_batch_mesh_dim",
     lambda: _check("heads:model;batch:batch"), ["layout", "'batch'"]),
    ("tensor_dim_on_two_mesh_dims",
     lambda: _check("batch:batch;batch:model", mesh_shape="batch:2;model:4"),
     ["layout", "'batch'", "two mesh dims"]),
    ("unknown_variant", lambda: layers.make_attention("talking_head"),
     ["variant", "talking_head", "talking_heads"]),
    ("unknown_dynamic_term",
     lambda: layers.DynamicProjectionsAttention(dynamic=["x2y"]),
     ["dynamic", "x2y", "m2l"]),
    ("repeated_dynamic_term",
     lambda: layers.DynamicProjectionsAttention(dynamic=["x2l", "x2l"]),
     ["dynamic", "x2l"]),
    ("dynamic_weights_term_without_p_w",
     lambda: layers.ProjectLogitsAttention(dynamic=["x2w"]),
     ["dynamic", "x2w", "P_w"]),
    ("dynamic_logits_term_without_p_l",
     lambda: layers.ProjectWeightsAttention(dynamic=["m2l"]),
     ["dynamic", "m2l", "P_l"]),
    ("dynamic_on_multi_head",
     lambda: layers.MultiHeadAttention(dynamic=["x2l"]), ["dynamic"]),
    ("heads_k_given_to_multi_head",
     lambda: layers.MultiHeadAttention(heads_k=8), ["heads_k", "heads"]),
    ("heads_v_given_to_multi_head_via_make_attention",
     lambda: layers.make_attention("multi_head", enc_dec=True, heads_v=8),
     ["heads_v", "heads"]),
    ("heads_v_given_to_project_logits",
     lambda: layers.ProjectLogitsAttention(heads_v=8), ["heads_v"]),
    ("heads_v_given_to_project_logits_encoder_attention",
     lambda: layers.ProjectLogitsEncoderAttention(heads_v=8),
     ["heads_v", "ProjectLogitsEncoderAttention", "heads"]),
    ("heads_k_given_to_project_weights",
     lambda: layers.ProjectWeightsAttention(heads_k=8), ["heads_k", "heads"]),
    ("heads_k_given_to_project_weights_encoder_attention",
     lambda: layers.ProjectWeightsEncoderAttention(heads_k=8),
     ["heads_k", "ProjectWeightsEncoderAttention", "heads"]),
    ("mesh_bigger_than_devices",
     lambda: _check("heads:model", mesh_shape="batch:2;model:8",
                    num_devices=8),
     ["mesh_shape", "16 devices", "8"]),
    ("bad_relative_attention_type",
     lambda: _th(relative_attention_type="contextual"),
     ["relative_attention_type", "contextual"]),
    ("general_bilinear_bad_relative_attention_type",
     lambda: layers.GeneralBilinearAttention(relative_attention_type="rel"),
     ["relative_attention_type", "rel"]),
    ("dropout_rate_one", lambda: _th(dropout_rate=1.0),
     ["dropout_rate", "[0, 1)"]),
    ("dropout_rate_negative",
     lambda: layers.MultiHeadEncoderAttention(dropout_rate=-0.1),
     ["dropout_rate"]),
    ("general_bilinear_dropout_rate",
     lambda: layers.GeneralBilinearAttention(dropout_rate=1.5),
     ["dropout_rate"]),
    ("malformed_mesh_shape", lambda: _check("heads:model", mesh_shape="model=8"),
     ["mesh_shape", "model=8"]),
    ("mesh_size_not_an_integer",
     lambda: _check("heads:model", mesh_shape="model:x"),
     ["mesh_shape", "'x'", "model"]),
    ("mesh_dim_repeated",
     lambda: _check("heads:model", mesh_shape="model:2;model:4"),
     ["mesh_shape", "twice"]),
    ("malformed_layout", lambda: _check("heads"), ["layout", "'heads'"]),
    ("num_devices_zero", lambda: _check("heads:model", num_devices=0),
     ["num_devices"]),
    ("d_model_zero",
     lambda: validation.check_layers([_th()], 0, "model:8", "heads:model",
                                     BATCH, LENGTH), ["d_model"]),
    ("non_attention_layer",
     lambda: validation.check_layers(
         [_th(), transformer_layers.DenseReluDense(hidden_size=32)], D_MODEL,
         "model:8", "heads:model", BATCH, LENGTH),
     ["layers[1]", "DenseReluDense", "extra_shapes"]),
    ("d_ff_not_divisible",
     lambda: _check("d_ff:model", extra_shapes=(
         validation.transformer_tensor_shapes(D_MODEL, 36, 128, BATCH,
                                              LENGTH))),
     ["layout", "d_ff", "36", "8"]),
    ("extra_shapes_not_a_dict",
     lambda: _check("heads:model", extra_shapes=[("d_ff", 32)]),
     ["extra_shapes"]),
]


@pytest.mark.parametrize("make, words",
                         [pytest.param(m, w, id=i) for i, m, w in BAD_INPUTS])
def test_bad_input_raises_before_any_graph(make, words):
  graph = tf.Graph()
  with graph.as_default():
    with pytest.raises(ValueError) as info:
      make()
    assert not graph.get_operations(), "a graph was built before the check"
  message = str(info.value)
  for word in words:  # whole words: "heads" must not match inside "heads_k"
    assert re.search(r"(?<!\w)%s(?!\w)" % re.escape(word), message), (
        word, message)


# ----------------------------------------------------------------- positive
def test_attention_tensor_shapes_talking_heads_with_dynamic():
  layer = _th(dynamic=["x2l", "m2w"])
  shapes = validation.attention_tensor_shapes(layer, D_MODEL, BATCH, LENGTH,
                                              memory_length=6)
  got = {name: [(d.name, d.size) for d in dims]
         for name, dims in shapes.items()}
  b, n, m, d = ("batch", 4), ("length", 8), ("memory_length", 6), (
      "d_model", 16)
  hk, h, hv, dk, dv = (("heads_k", 16), ("heads", 8), ("heads_v", 24),
                       ("d_k", 4), ("d_v", 4))
  assert got == {
      "p_q": [d, hk, dk], "p_k": [d, hk, dk], "p_v": [d, hv, dv],
      "p_o": [hv, dv, d], "p_l": [hk, h], "p_w": [h, hv],
      "p_xl": [d, hk, h], "p_mw": [d, h, hv],
      "X": [b, n, d], "M": [b, m, d], "Q": [b, n, hk, dk],
      "K": [b, m, hk, dk], "V": [b, m, hv, dv], "J": [b, n, m, hk],
      "L": [b, n, m, h], "W": [b, n, m, h], "U": [b, n, m, hv],
      "O": [b, n, hv, dv], "Y": [b, n, d],
      "R_Xl": [b, n, hk, h], "R_Mw": [b, m, h, hv],
  }


def test_attention_tensor_shapes_general_bilinear_and_relative_bias():
  layer = layers.GeneralBilinearAttention(heads=8,
                                          relative_attention_type="bias")
  shapes = validation.attention_tensor_shapes(layer, D_MODEL, BATCH, LENGTH)
  assert [(d.name, d.size) for d in shapes["p"]] == [
      ("d_model", 16), ("heads", 8), ("d_model_m", 16)]
  assert [(d.name, d.size) for d in shapes["L"]] == [
      ("batch", 4), ("length", 8), ("memory_length", 8), ("heads", 8)]
  assert [(d.name, d.size) for d in shapes["relative_attention_bias"]] == [
      ("heads", 8), ("buckets", 32)]


def test_valid_layouts_pass_and_agree_with_mtf():
  """Accepted layouts lay out every tensor in mtf; the rejected one does not."""
  extra = validation.transformer_tensor_shapes(D_MODEL, 32, 128, BATCH,
                                               LENGTH)
  layer = _th(dynamic=["m2l", "x2w"])
  graph = tf.Graph()
  with graph.as_default():
    for layout in ("heads_k:model", "heads:model", "heads_v:model",
                   "d_ff:model", "vocab:model"):
      mesh, rules = validation.check_layers(
          [layer], D_MODEL, "batch:2;model:4", layout + ";batch:batch",
          BATCH, LENGTH, num_devices=8, extra_shapes=extra)
      assert mesh == mtf.convert_to_shape("batch:2;model:4")
      assert isinstance(rules, mtf.LayoutRules)
      for dims in validation.attention_tensor_shapes(
          layer, D_MODEL, BATCH, LENGTH).values():
        rules.tensor_layout(mtf.Shape(dims), mesh)  # mtf accepts it
    assert not graph.get_operations()
  # mtf rejects what validation rejects, but only once a tensor is laid out
  rules = mtf.convert_to_layout_rules("heads_k:model;heads:model")
  p_l = mtf.Shape(layer.weight_shapes(mtf.Dimension("d_model", 16))["p_l"])
  with pytest.raises(ValueError):
    rules.tensor_layout(p_l, mtf.convert_to_shape("model:8"))


def test_objects_and_lenient_mode():
  """mtf objects are accepted; strict=False ignores unused rules, as mtf does."""
  mesh, rules = validation.check_mesh_and_layout(
      mtf.convert_to_shape("model:4"),
      mtf.convert_to_layout_rules("heads:model"),
      {"p_l": [mtf.Dimension("heads_k", 4), ("heads", 8)]})
  assert mesh.to_string == "Shape[model=4]"
  # t5-style layout: data-parallel and experts rules with no batch mesh dim
  t5_layout = "ensemble:ensemble,batch:batch,heads:model,experts:batch"
  mesh, rules = _check(t5_layout, strict=False)
  assert rules.tensor_layout(
      mtf.Shape([mtf.Dimension("heads", 8)]), mesh).tensor_axis_to_mesh_axis \
      == (0,)
  with pytest.raises(ValueError, match="layout"):
    _check(t5_layout)
