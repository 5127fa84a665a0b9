"""Checks of mesh shape, layout and attention layers, before any graph exists.

Mesh-TensorFlow reports a bad layout late (while lowering, after the whole
graph is built) and tersely ("Two Tensor Dimensions may not map to the same
Mesh Dimension", a failed integer division inside a slice function, or not at
all: a rule naming a mesh dim that the mesh lacks is silently ignored).  These
checks are pure Python: they create no TensorFlow or mtf ops, and each
problem raises one ValueError that names the parameter, the tensor and dims
involved, and the fix.

Typical use, before building a model::

  attention = [layers.TalkingHeadsAttention(heads_k=16, heads=8, heads_v=16)]
  mesh_shape, layout_rules = validation.check_layers(
      attention, d_model=512, mesh_shape="batch:2;model:4",
      layout="heads_k:model;heads_v:model;d_ff:model;batch:batch",
      batch=64, length=512, num_devices=8,
      extra_shapes=validation.transformer_tensor_shapes(
          d_model=512, d_ff=2048, vocab=32128, batch=64, length=512))

Tensor shapes are {tensor name: list of mtf.Dimension (or (name, size)
pairs)}; the layout maps tensor dim *names* to mesh dim names, so every check
is a question about names and sizes:

  * every mesh dim of a layout rule is in the mesh;
  * every tensor dim of a layout rule is a dim of some tensor;
  * a tensor dim maps to at most one mesh dim;
  * no tensor has two dims on one mesh dim (e.g. P_l[heads_k, heads] with
    ``heads_k:model;heads:model``);
  * the mesh dim size divides every dim laid out on it;
  * the mesh needs no more devices than there are.
"""
import mesh_tensorflow as mtf

from mtf_talking_heads.core import compat
from mtf_talking_heads.core import spec

# ------------------------------------------------------------------ parsing
def parse_mesh_shape(mesh_shape):
  """spec.parse_mesh_shape, also taking an mtf.Shape: [(name, size)]."""
  if isinstance(mesh_shape, mtf.Shape):
    mesh_shape = mesh_shape.dims
  return spec.parse_mesh_shape(mesh_shape)


def parse_layout(layout):
  """spec.parse_layout, also taking an mtf.LayoutRules: sorted pairs."""
  if isinstance(layout, mtf.LayoutRules):
    layout = compat.layout_pairs(layout)
  return spec.parse_layout(layout)


def _to_dimension(value, param):
  """An mtf.Dimension from a Dimension or a (name, size) pair (spec.dim_pair's
  check; a bare int has no name, so it is refused)."""
  return mtf.Dimension(*spec.dim_pair(value, None, param))


def _dimension_arg(value, default_name, param):
  """int -> Dimension(default_name, value); Dimension / pair pass
  (spec.dim_pair's check)."""
  return mtf.Dimension(*spec.dim_pair(value, default_name, param))


def _batch_dims(batch):
  """int / Dimension / pair / list of them -> list of batch Dimensions."""
  if isinstance(batch, (list, tuple)) and batch and not (
      len(batch) == 2 and isinstance(batch[0], str)):
    return [_dimension_arg(b, "batch", "batch") for b in batch]
  return [_dimension_arg(batch, "batch", "batch")]


def _normalize_shapes(tensor_shapes, param="tensor_shapes"):
  if not isinstance(tensor_shapes, dict):
    raise ValueError("%s must be a dict {tensor name: list of mtf.Dimension},"
                     " got %r" % (param, type(tensor_shapes).__name__))
  shapes = {}
  for name, dims in tensor_shapes.items():
    if isinstance(dims, mtf.Shape):
      dims = dims.dims
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
      raise ValueError("%s[%r] must be a list of mtf.Dimension, got %r"
                       % (param, name, dims))
    shapes[str(name)] = [_to_dimension(d, "%s[%r]" % (param, name))
                         for d in dims]
  return shapes


def _shape_str(dims):
  return "[%s]" % ", ".join("%s=%d" % (d.name, d.size) for d in dims)


# ------------------------------------------------------------------- checks
def check_mesh_and_layout(mesh_shape, layout, tensor_shapes, num_devices=None,
                          strict=True):
  """Checks a mesh shape and layout against the tensors they will lay out.

  Pure Python: creates no TensorFlow or mtf ops, so call it before building a
  graph.  The first problem found raises a ValueError whose message starts
  with the parameter at fault (mesh_shape, layout, tensor_shapes or
  num_devices), names the tensor, dims and sizes involved and says how to fix
  it.

  Args:
    mesh_shape: mtf string ("batch:2;model:4"), mtf.Shape or list of
      (name, size) pairs; None or "" for one device.
    layout: mtf string ("heads:model;batch:batch"), mtf.LayoutRules or list
      of (tensor dim, mesh dim) pairs; None or "" for no rules.
    tensor_shapes: {tensor name: list of mtf.Dimension or (name, size)} of
      every weight and activation the layout applies to (see
      attention_tensor_shapes and transformer_tensor_shapes).
    num_devices: optional integer, the devices available; the mesh may not
      need more.
    strict: if True (the default) a rule naming a mesh dim the mesh lacks, or
      a tensor dim no tensor has, is an error (usually a typo).  False
      ignores such rules, as mtf does, so that one layout string (e.g. t5's
      "batch:batch;heads:model;d_ff:model;vocab:model") serves several
      meshes and models.
  Returns:
    (mtf.Shape, mtf.LayoutRules) for mesh_shape and layout, ready for
    mtf.placement_mesh_impl.PlacementMeshImpl / mtf.simd_mesh_impl.
  Raises:
    ValueError: on any of the problems listed in the module docstring, or
      malformed arguments.
  """
  mesh = parse_mesh_shape(mesh_shape)
  rules = parse_layout(layout)
  shapes = _normalize_shapes(tensor_shapes)
  mesh_sizes = dict(mesh)
  mesh_text = repr(mesh_shape)
  known = sorted({d.name for dims in shapes.values() for d in dims})
  if not strict:
    rules = [(t, m) for t, m in rules if m in mesh_sizes and t in known]

  needed = 1
  for _, size in mesh:
    needed *= size
  if num_devices is not None:
    spec.positive_int("num_devices", num_devices)
    if needed > num_devices:
      raise ValueError(
          "mesh_shape: %s needs %d devices but only %d are available "
          "(num_devices=%d); use a mesh whose sizes multiply to at most %d"
          % (mesh_text, needed, num_devices, num_devices, num_devices))

  for tensor_dim, mesh_dim in rules:
    if mesh_dim not in mesh_sizes:
      raise ValueError(
          "layout: rule %s:%s names mesh dim %r, which mesh_shape %s does not "
          "have (mesh dims: %s); fix the spelling, add %r to mesh_shape, "
          "drop the rule, or pass strict=False to ignore rules for absent "
          "mesh dims as mtf does" % (tensor_dim, mesh_dim, mesh_dim, mesh_text,
                                     ", ".join(mesh_sizes) or "none",
                                     mesh_dim))

  for tensor_dim, mesh_dim in rules:
    if tensor_dim not in known:
      raise ValueError(
          "layout: rule %s:%s names tensor dim %r, which no tensor of the "
          "model has (known dims: %s); fix the spelling or drop the rule"
          % (tensor_dim, mesh_dim, tensor_dim, ", ".join(known)))

  mesh_dim_of = {}
  for tensor_dim, mesh_dim in rules:
    if tensor_dim in mesh_dim_of:
      raise ValueError(
          "layout: tensor dim %r is mapped to two mesh dims, %r and %r; keep "
          "one rule for it" % (tensor_dim, mesh_dim_of[tensor_dim], mesh_dim))
    mesh_dim_of[tensor_dim] = mesh_dim

  for name, dims in shapes.items():  # weights first, as the layers list them
    on_axis = {}
    for dim in dims:
      mesh_dim = mesh_dim_of.get(dim.name)
      if mesh_dim is None:
        continue
      if mesh_dim in on_axis:
        other = on_axis[mesh_dim]
        raise ValueError(
            "layout: tensor %s %s would put two of its dims, %r and %r, on "
            "mesh dim %r (rules %s:%s and %s:%s); mtf splits a tensor at most "
            "once per mesh dim. Map only one of them to %r (e.g. drop %s:%s)"
            % (name, _shape_str(dims), other.name, dim.name, mesh_dim,
               other.name, mesh_dim, dim.name, mesh_dim, mesh_dim, dim.name,
               mesh_dim))
      on_axis[mesh_dim] = dim
      if dim.size % mesh_sizes[mesh_dim]:
        raise ValueError(
            "layout: rule %s:%s splits dim %r of size %d (tensor %s %s) over "
            "mesh dim %r of size %d, which does not divide it; make %r a "
            "multiple of %d, change the mesh size or drop the rule"
            % (dim.name, mesh_dim, dim.name, dim.size, name, _shape_str(dims),
               mesh_dim, mesh_sizes[mesh_dim], dim.name,
               mesh_sizes[mesh_dim]))
  return mtf.Shape([mtf.Dimension(n, s) for n, s in mesh]), mtf.LayoutRules(
      rules)


def _is_talking_heads_layer(layer):
  return hasattr(layer, "dims") and hasattr(layer, "weight_shapes")


def _is_general_bilinear_layer(layer):
  return (hasattr(layer, "heads") and hasattr(layer, "d_m") and
          hasattr(layer, "weight_shapes"))


def attention_tensor_shapes(layer, d_model, batch, length, memory_length=None):
  """Shapes of an attention layer's weights and activations.

  Talking-heads family (MultiHead..., TalkingHeads..., ProjectLogits...,
  ProjectWeights..., DynamicProjections...): the weights of
  ``layer.weight_shapes`` (p_q, p_k, p_v, p_o, p_l, p_w, p_xl, p_ml, p_xw,
  p_mw as present, plus relative_attention_bias [heads, buckets] if the
  layer has relative attention) and the activations of the paper's
  pseudocode, spec.activation_shapes (X, M, Q, K, V, J, L, W, U, O, Y and
  the dynamic R_Xl ... R_Mw; e.g. J: [batch, length, memory_length, heads_k]).

  General bilinear attention: p [d_model, heads, d_model_m], q [d_model_m,
  heads, d_model] and X, M [batch, memory_length, d_model_m], XP [batch,
  length, heads, d_model_m], L, W, WM [batch, length, heads, d_model_m], Y.

  Args:
    layer: an attention layer of mtf_talking_heads.nn.layers.
    d_model: int or mtf.Dimension / (name, size): the model width.
    batch: int, Dimension, (name, size) or a list of them (batch dims).
    length: int or Dimension / (name, size): the query length.
    memory_length: optional int or Dimension / (name, size): the memory
      (key) length; defaults to the query length (self-attention).  For
      attention over the encoder output pass the encoder length.
  Returns:
    {tensor name: list of mtf.Dimension}
  Raises:
    ValueError: naming the argument, if the layer is not an attention layer
      of this package or a size is not a positive integer.
  """
  d_model = _dimension_arg(d_model, "d_model", "d_model")
  batch_dims = _batch_dims(batch)
  length = _dimension_arg(length, "length", "length")
  if memory_length is None:
    memory_length = mtf.Dimension("memory_length", length.size)
  else:
    memory_length = _dimension_arg(memory_length, "memory_length",
                                   "memory_length")
  b = list(batch_dims)
  shapes = {}
  if _is_talking_heads_layer(layer):
    dims = layer.dims
    shapes.update(layer.weight_shapes(d_model))
    shapes.update(spec.activation_shapes(dims, b, length, memory_length,
                                         d_model, layer.dynamic))
    heads = layer.bias_heads()
  elif _is_general_bilinear_layer(layer):
    d_m = layer.d_m(d_model)
    shapes.update(layer.weight_shapes(d_model))
    shapes.update({
        "X": b + [length, d_model],
        "M": b + [memory_length, d_m],
        "XP": b + [length, layer.heads, d_m],
        "L": b + [length, memory_length, layer.heads],
        "W": b + [length, memory_length, layer.heads],
        "WM": b + [length, layer.heads, d_m],
        "Y": b + [length, d_model],
    })
    heads = [layer.heads]
  else:
    raise ValueError(
        "layer: a %s is not an attention layer of mtf_talking_heads.nn.layers "
        "(a talking-heads-family or general bilinear layer); describe its "
        "tensors in extra_shapes instead" % type(layer).__name__)
  if getattr(layer, "relative_attention_type", None):
    shapes["relative_attention_bias"] = heads + [
        mtf.Dimension("buckets", layer.relative_attention_num_buckets)]
  return shapes


def transformer_tensor_shapes(d_model, d_ff, vocab, batch, length):
  """Shapes of the usual transformer tensors outside attention.

  For `extra_shapes` of check_layers: the embedding, the logits and the
  feed-forward layer (mtf's DenseReluDense: its hidden dim is "d_ff").  The
  vocabulary size is taken as given (mtf's Unitransformer pads it to a
  multiple of vocab_divisor, 128 by default: pass the padded size).

  Args:
    d_model: int or mtf.Dimension / (name, size).
    d_ff: int or mtf.Dimension / (name, size), or None without feed-forward.
    vocab: int or mtf.Dimension / (name, size).
    batch: int, Dimension, (name, size) or a list of them.
    length: int or Dimension / (name, size).
  Returns:
    {tensor name: list of mtf.Dimension}
  Raises:
    ValueError: naming the argument, if a size is not a positive integer.
  """
  d_model = _dimension_arg(d_model, "d_model", "d_model")
  vocab = _dimension_arg(vocab, "vocab", "vocab")
  b = _batch_dims(batch)
  length = _dimension_arg(length, "length", "length")
  shapes = {
      "embedding": [vocab, d_model],
      "residual": b + [length, d_model],
      "logits": b + [length, vocab],
  }
  if d_ff is not None:
    d_ff = _dimension_arg(d_ff, "d_ff", "d_ff")
    shapes.update({
        "dense_relu_dense/wi": [d_model, d_ff],
        "dense_relu_dense/wo": [d_ff, d_model],
        "dense_relu_dense/hidden": b + [length, d_ff],
    })
  return shapes


def check_layers(layers, d_model, mesh_shape, layout, batch, length,
                 num_devices=None, extra_shapes=None, memory_length=None,
                 strict=True):
  """Checks a mesh and layout for a list of attention layers.

  Collects attention_tensor_shapes of every layer (named "layers[i].p_q",
  "layers[i].L", ...), the residual stream [batch, length, d_model] and
  `extra_shapes` (e.g. transformer_tensor_shapes(...) for d_ff and vocab),
  then runs check_mesh_and_layout.  Pure Python, no graph.

  Args:
    layers: list of attention layers of mtf_talking_heads.nn.layers (self- or
      encoder attention).
    d_model: int or mtf.Dimension / (name, size).
    mesh_shape: see check_mesh_and_layout.
    layout: see check_mesh_and_layout.
    batch: int, Dimension, (name, size) or a list of them (batch dims).
    length: int or Dimension / (name, size).
    num_devices: optional integer, the devices available.
    extra_shapes: optional {tensor name: list of mtf.Dimension} of other
      tensors the layout applies to.
    memory_length: optional memory length for encoder-attention layers
      (the encoder's length); defaults to `length`.
    strict: see check_mesh_and_layout.
  Returns:
    (mtf.Shape, mtf.LayoutRules), as check_mesh_and_layout.
  Raises:
    ValueError: naming the parameter at fault (layers, d_model, batch,
      length, mesh_shape, layout, num_devices, extra_shapes).
  """
  if not isinstance(layers, (list, tuple)):
    raise ValueError("layers must be a list of attention layers, got %r"
                     % (layers,))
  d_model = _dimension_arg(d_model, "d_model", "d_model")
  b = _batch_dims(batch)
  length = _dimension_arg(length, "length", "length")
  shapes = {"residual": b + [length, d_model]}
  for i, layer in enumerate(layers):
    if not (_is_talking_heads_layer(layer) or
            _is_general_bilinear_layer(layer)):
      raise ValueError(
          "layers[%d]: a %s is not an attention layer of "
          "mtf_talking_heads.nn.layers; pass only attention layers and describe "
          "other tensors in extra_shapes" % (i, type(layer).__name__))
    for name, dims in attention_tensor_shapes(
        layer, d_model, b, length, memory_length).items():
      shapes["layers[%d].%s" % (i, name)] = dims
  if extra_shapes is not None:
    extra = _normalize_shapes(extra_shapes, "extra_shapes")
    clash = sorted(n for n in set(extra) & set(shapes)
                   if extra[n] != shapes[n])
    if clash:
      raise ValueError(
          "extra_shapes: tensor %s %s has another shape in check_layers "
          "(%s); rename it" % (clash[0], _shape_str(extra[clash[0]]),
                               _shape_str(shapes[clash[0]])))
    shapes.update(extra)
  return check_mesh_and_layout(mesh_shape, layout, shapes, num_devices,
                               strict)
