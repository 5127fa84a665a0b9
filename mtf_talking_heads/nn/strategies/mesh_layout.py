"""The layout algebra of the strategies: mesh, layout rules, tensor shapes.

MeshLayout answers which mesh axis a tensor dim is on (prices.Layout) and
holds the mtf objects the checks use; check_layout runs the divisibility
and obstacle-1 checks on the attention tensors before any graph is built;
model_layout reads the layout a model was built for from the mtf Context.
The dim names and CORE_SCOPE are what every strategy and measure/comm.py
agree on.
"""
import mesh_tensorflow as mtf

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.nn import validation

# Every op a strategy builds for the core (and, by mtf's naming, every
# gradient op of those) lives under this variable scope; comm.py finds the
# n x m x heads activations by it.
CORE_SCOPE = "attention_core"
BATCH = "batch"
LENGTH = "length"
MEMORY_LENGTH = "memory_length"
D_MODEL = "d_model"
CORE_SUFFIX = "_core"  # heads dims inside a split core: whole, on no axis


class MeshLayout(prices.Layout):
  """prices.Layout (a mesh shape and layout rules, asked by tensor-dim name)
  with the mtf objects validation checks against.

  Also takes a model's own mtf.Shape and mtf.LayoutRules.

  Example:
    MeshLayout("batch:2;model:4", "batch:batch;heads:model").axis_of("heads")
    == "model"
  """

  def __init__(self, mesh_shape, layout):
    super().__init__(validation.parse_mesh_shape(mesh_shape),
                     validation.parse_layout(layout))
    self.mesh_shape = mtf.Shape([mtf.Dimension(n, k)
                                 for n, k in self.mesh_pairs])
    self.rules = mtf.LayoutRules(self.pairs)

  def names_on(self, axis):
    """Tensor-dim names the layout maps to mesh axis `axis`."""
    return [t for t, m in self.pairs if m == axis]


def attention_tensor_shapes(dims, batch, length):
  """{tensor: [Dimension]} of every tensor the attention core touches.

  The layer's view (its heads dims), as the layout rules see it:
  Q, K, V, J, L, W, U, O and P_l / P_w where the variant has them; each with
  `groups` before its heads dims when the layer is grouped.
  """
  shapes = spec.activation_shapes(
      dims, [mtf.Dimension(BATCH, batch)], mtf.Dimension(LENGTH, length),
      mtf.Dimension(MEMORY_LENGTH, length))
  g = dims.group_dims
  if dims.project_logits:
    shapes["P_l"] = g + [dims.heads_k, dims.heads]
  if dims.project_weights:
    shapes["P_w"] = g + [dims.heads, dims.heads_v]
  return shapes


def check_layout(dims, mesh, batch, length):
  """Divisibility and obstacle 1 for the attention tensors, before any graph.

  Runs validation.check_mesh_and_layout (non-strict: rules for other dims of
  the model are fine) on attention_tensor_shapes.

  Args:
    dims: attention.AttentionDims.
    mesh: a MeshLayout.
    batch: the batch size.
    length: the sequence length (n = m for self-attention).
  Raises:
    ValueError: naming the dim and mesh axis, if a dim mapped to an axis is
      not divisible by its size, or two dims of one tensor map to one axis.
  """
  validation.check_mesh_and_layout(
      mesh.mesh_shape, mesh.rules, attention_tensor_shapes(dims, batch, length),
      strict=False)


def model_layout(context):
  """The MeshLayout the model was built for (None if it was not told)."""
  model = getattr(context, "model", None)
  layout = getattr(model, "layout", None)
  mesh_shape = getattr(model, "mesh_shape", None)
  if layout is None and mesh_shape is None:
    return None
  return MeshLayout(mesh_shape, layout)


def required_model_layout(context, strategy):
  """model_layout(context), or a ValueError naming how to provide it."""
  mesh = model_layout(context)
  if mesh is None:
    raise ValueError(
        "%s reads the layout from the model: build the Unitransformer / "
        "Bitransformer with layout= and mesh_shape= (t5's "
        "utils.build_model does)" % type(strategy).__name__)
  return mesh


def size_of(tensor, name):
  """The size of `tensor`'s dim called `name` (None if it has none)."""
  for d in tensor.shape.dims:
    if d.name == name:
      return d.size
  return None


def is_core_activation(shape, dims):
  """Whether a tensor built in a strategy's core is an n x m x heads one.

  True for J, L, W, U, the softmax intermediates and their gradients (in
  any layout: heads dims under their own or their "_core" names, the query
  length whole or split); false for Q, K, V, O (they have d_k or d_v), the
  softmax sums (no memory_length) and P_l, P_w, R_l, R_w (two heads dims).
  """
  names = [d.name for d in shape.dims]
  heads = set()
  for d in (dims.heads_k, dims.heads, dims.heads_v):
    heads.update((d.name, d.name + CORE_SUFFIX))
  return (MEMORY_LENGTH in names and dims.d_k.name not in names and
          dims.d_v.name not in names and
          len([n for n in names if n in heads]) == 1)
