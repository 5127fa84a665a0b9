"""Exact communication accounting of attention layers under sharding strategies.

The benchmark unit (as in the feasibility notes, so figures compare): a
Unitransformer with one attention layer (mtf's defaults.gin LayerStack: RMS
norm, the layer, residual), vocab 128, forward + backward + one SGD step,
every weight stored sharded as the layout says, lowered with
PlacementMeshImpl on logical CPUs and never run.  Figures are read from
``mtf.Lowering(...).counters``.

What mtf counts (ops.py, 0.1.21), for a mesh of N devices and a collective
over a group of P devices (the product of the sizes of its mesh axes):

  allreduce/<axes>/...  laid-out size of the reduced tensor: N * s, s = the
                        per-device slice that is summed.
  allconcat/<axis>/...  laid-out size of the *output*: N * s_out, s_out = the
                        gathered slice (S, the whole tensor within the group).
  alltoall/<axis>/...   laid-out size of the *input*: N * s_in, s_in = S / P.

Bytes sent per device under ring costs, for a tensor of S elements within a
group of P (s = S for an all-reduce), e elements -> bytes (4 for float32):

  all-reduce   2 (P-1)/P * S     = 2 (P-1)/P * counter / N
  all-gather     (P-1)/P * S     =   (P-1)/P * counter / N
  all-to-all     (P-1)/P^2 * S   =   (P-1)/P * counter / N

so ring_bytes_per_device = e * sum over counters of
(2 if allreduce else 1) * (P-1)/P * counter / N.  (The notes' "ring" column is
2 * allreduce + allconcat + alltoall in counter units: for one mesh axis of
size P = N it is ring_bytes_per_device * N^2 / ((N-1) e).)

einsum_replication = sum of "einsum" / sum of "einsum_unique" over the whole
graph (multiplies done on all devices / multiplies of the unsharded graph).

max_slice_elements = the largest per-device slice of an attention activation:
an output of an op built inside a strategy's core (variable scope
strategies.CORE_SCOPE, which the gradient ops inherit) that
strategies.is_core_activation accepts: J, L, W, U, the softmax intermediates
and their gradients (the n x m x heads tensors).
"""
import collections
import functools
import re

from mesh_tensorflow import placement_mesh_impl

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import auto_pricing
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies
from mtf_talking_heads.nn import validation

VARIANTS = spec_lib.SHARDED_VARIANTS
COLUMNS = ("variant", "strategy", "mesh_shape", "layout", "allreduce",
           "alltoall", "allconcat", "einsum_replication",
           "max_slice_elements", "ring_bytes_per_device")
BYTES_PER_ELEMENT = auto_pricing.BYTES_PER_ELEMENT  # the graph is float32
Config = collections.namedtuple(
    "Config", ["variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
               "d_model", "length", "batch", "dynamic", "groups"],
    defaults=(None,))  # groups: grouped_talking_heads only


class PointToPointMeshImpl(placement_mesh_impl.PlacementMeshImpl):
  """PlacementMeshImpl whose all-to-all is built point to point.

  mtf counts a collective in the op that asks for it (ReshapeOperation etc.),
  before the mesh implementation builds it, so the counters do not depend on
  how an all-to-all is built; mtf's alltoall_pointtwise (P splits, P concats
  per device) builds about 2-3x faster than its default ring version, and
  computes the same values.  Used for the lower-only accounting graphs and
  for the tests' 8-device runs.
  """

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    return self._collective_with_groups(  # pylint: disable=protected-access
        x, [mesh_axis], functools.partial(
            placement_mesh_impl.alltoall_pointtwise, split_axis=split_axis,
            concat_axis=concat_axis))


def make_config(variant, heads, d_k, d_v, d_model, length, batch,
                heads_k=None, heads_v=None, dynamic=(), groups=None):
  """Validates (as `mtf_th costs` does) and returns a Config."""
  if variant not in VARIANTS:
    raise ValueError("variant=%r has no sharding strategies; choose one of: "
                     "%s" % (variant, ", ".join(VARIANTS)))
  resolved = costs.resolve_config(variant, heads_k, heads, heads_v, d_k, d_v,
                                  d_model, length, dynamic=dynamic,
                                  groups=groups)
  batch = spec_lib.positive_int("batch", batch)
  return Config(variant, resolved["heads_k"], resolved["heads"],
                resolved["heads_v"], resolved["d_k"], resolved["d_v"],
                resolved["d_model"], resolved["length"], batch,
                resolved["dynamic"], resolved["groups"])


def attention_spec(config):
  """The spec.AttentionSpec of a Config."""
  return spec_lib.AttentionSpec(config.variant, config.heads_k, config.heads,
                                config.heads_v, config.d_k, config.d_v,
                                config.dynamic, config.groups)


def make_layer(config, strategy=None):
  """The attention layer (mtf_th class) for `config` with `strategy`."""
  return layers.layer_for_spec(attention_spec(config), strategy=strategy)


def default_layout(layer, mesh_shape):
  """Heads-parallel layout that stores every attention weight it can sharded.

  "batch" (if the mesh has it) -> batch; on "model": heads_k, then heads_v,
  each unless a weight already has a dim on "model" together with it (P_l
  [h_k, h] and P_w [h, h_v] may not have both dims on one axis): multi-head
  -> heads:model, talking heads -> heads_k:model;heads_v:model; grouped
  talking heads -> groups:model.

  Raises:
    ValueError: if the mesh has axes other than "batch" and "model".
  """
  mesh = strategies.MeshLayout(mesh_shape, "")
  axes = [d.name for d in mesh.mesh_shape.dims]
  other = [a for a in axes if a not in ("batch", "model")]
  if other:
    raise ValueError("no default layout for mesh axis %r (mesh_shape %r); "
                     "pass --layout" % (other[0], mesh_shape))
  rules = ["batch:batch"] if "batch" in axes else []
  if "model" in axes:
    rules += ["%s:%s" % r for r in prices.heads_parallel_layout(layer.dims)]
  return ";".join(rules)


def full_layout(layout, pairs):
  """`layout` plus the (dim, axis) `pairs` it lacks (e.g. a strategy's
  layout_rules()), in order."""
  rules = spec_lib.split_rules(layout)
  for pair in pairs:
    rule = "%s:%s" % pair
    if rule not in rules:
      rules.append(rule)
  return ";".join(rules)


def _group_size(key, mesh):
  """P: the devices in one group of collective `key` (a counter name)."""
  axes_text = key.split("/")[1]
  axes = [int(a) for a in re.findall(r"\d+", axes_text)]
  size = 1
  for a in axes:
    size *= mesh.mesh_shape.dims[a].size
  return size


def summarize_counters(counters, mesh_shape):
  """Sums mtf counters by collective and prices them under ring costs.

  Args:
    counters: mtf.Lowering.counters (a list of (key, elements) pairs).
    mesh_shape: the mesh the lowering used.
  Returns:
    dict with allreduce, alltoall, allconcat (elements, summed over devices
    as mtf counts them), einsum, einsum_unique and ring_elements_per_device.
  """
  mesh = strategies.MeshLayout(mesh_shape, "")
  n = max(mesh.mesh_shape.size, 1)
  out = dict(allreduce=0, alltoall=0, allconcat=0, einsum=0, einsum_unique=0,
             ring_elements_per_device=0.0)
  for key, value in counters:
    kind = key.split("/")[0]
    if kind in ("einsum", "einsum_unique"):
      out[kind] += value
    elif kind in ("allreduce", "alltoall", "allconcat"):
      out[kind] += value
      p = _group_size(key, mesh)
      factor = 2.0 if kind == "allreduce" else 1.0
      out["ring_elements_per_device"] += factor * (p - 1) / p * value / n
  return out


def core_activation_slices(lowering, dims):
  """(largest per-device slice, largest whole size) of n x m x heads tensors.

  Args:
    lowering: an mtf.Lowering.
    dims: the layer's AttentionDims.
  Returns:
    (max_slice_elements, max_elements); (0, 0) if no core was found.  A
    fused core (core_kernel.FusedCore) counts the tensors its slices
    compute block by block.
  """
  best_slice = best_size = 0
  for op in lowering.graph.operations:
    if "/%s/" % strategies.CORE_SCOPE not in "/" + op.name + "/":
      continue
    if isinstance(op, core_kernel.FusedCore):
      impl = lowering.mesh_impl(op)
      for shape in op.core_shapes():
        best_slice = max(best_slice, impl.slice_size(shape))
        best_size = max(best_size, shape.size)
      continue
    for t in op.outputs:
      if not strategies.is_core_activation(t.shape, dims):
        continue
      impl = lowering.mesh_impl(t)
      best_slice = max(best_slice, impl.slice_size(t.shape))
      best_size = max(best_size, t.shape.size)
  return best_slice, best_size


def check_config(config, mesh_shape, layout=None):
  """The checks every strategy makes (divisibility, obstacle 1), no graph.

  First every rule of `layout` must name an axis of the mesh (or batch /
  model) and a dim of the unit (spec.check_layout_names): a misspelt one
  would otherwise be ignored and report 0 bytes.

  Raises:
    ValueError: naming the dim and mesh axis.
  """
  layer = make_layer(config)
  if layout is None:
    layout = default_layout(layer, mesh_shape)
  spec_lib.check_layout_names(
      layout, [name for name, _ in spec_lib.parse_mesh_shape(mesh_shape)],
      spec_lib.unit_dim_names(attention_spec(config)), what="--layout")
  strategies.HeadsParallel().check(layer.dims, mesh_shape, layout,
                                 config.batch, config.length)
  mesh = strategies.MeshLayout(mesh_shape, layout)
  for d in mesh.mesh_shape.dims:
    if d.name == "batch" and config.batch % d.size:
      raise ValueError("dim 'batch' (size %d) is not divisible by mesh axis "
                       "'batch' (size %d)" % (config.batch, d.size))


def _setup(config, strategy_name, mesh_shape, layout):
  """(strategy, layer, layout) of one measurement: the layout is
  default_layout's unless given, plus the strategy's rules (Auto adds its
  own when it needs it)."""
  strategy = strategies.make_strategy(strategy_name)
  layer = make_layer(config, strategy)
  if layout is None:
    layout = default_layout(layer, mesh_shape)
  if not isinstance(strategy, strategies.Auto):
    layout = full_layout(layout, strategy.layout_rules())
  return strategy, layer, layout


def measure(config, strategy_name, mesh_shape, layout=None, vocab=128,
            lower_only=True, kernel="einsum"):
  """Builds the benchmark unit for one strategy and returns its figures.

  Args:
    config: a Config.
    strategy_name: a key of strategies.STRATEGIES.
    mesh_shape: e.g. "model:8" or "batch:2;model:4".
    layout: layout rules for the layer's dims (None: default_layout); the
      strategy's own rules (layout_rules()) are appended, except for "auto",
      which adds its rule itself when it picks a split strategy (the
      `layout` column then shows it).
    vocab: vocabulary size of the Unitransformer.
    lower_only: build and lower, do not open a session.
    kernel: mtf_th.core_kernel.kind for the unit: "einsum" (the default:
      the graph prices.py's formulas describe; the fused core sends the
      same, except that query_split_allgather all-reduces dP_l, dP_w as
      [h, h], not broadcast over the batch), or "fused" / "auto".
  Returns:
    dict with the COLUMNS plus einsum, einsum_unique, max_elements and
    ring_elements_per_device.
  Raises:
    ValueError: (before any graph is built) if the strategy cannot apply.
  """
  strategy, layer, layout = _setup(config, strategy_name, mesh_shape, layout)
  check_config(config, mesh_shape, layout)
  auto = isinstance(strategy, strategies.Auto)
  mesh = strategies.MeshLayout(mesh_shape, layout)
  strategy.check(layer.dims, mesh_shape, layout, config.batch, config.length)
  with core_kernel.bound(kernel):
    run = harness.Harness(
        [layer], d_model=config.d_model, vocab=vocab, batch=config.batch,
        length=config.length, mesh_shape=mesh_shape, layout=layout,
        optimizer_step=True, run=not lower_only,
        mesh_impl_cls=PointToPointMeshImpl if lower_only else None)
  summary = summarize_counters(run.lowering.counters, mesh_shape)
  max_slice, max_size = core_activation_slices(run.lowering, layer.dims)
  name = strategy.name
  if auto:  # what the layer ran, and the rules it added to the model's
    name = "auto:" + strategy.picked
    layout = full_layout(layout, validation.parse_layout(run.model.layout))
  result = dict(
      variant=attention_spec(config).label,
      strategy=name, mesh_shape=mesh.mesh_shape_string,
      layout=layout, allreduce=summary["allreduce"],
      alltoall=summary["alltoall"], allconcat=summary["allconcat"],
      einsum_replication=summary["einsum"] / max(summary["einsum_unique"], 1),
      max_slice_elements=max_slice, max_elements=max_size,
      einsum=summary["einsum"], einsum_unique=summary["einsum_unique"],
      ring_elements_per_device=summary["ring_elements_per_device"],
      ring_bytes_per_device=int(round(
          BYTES_PER_ELEMENT * summary["ring_elements_per_device"])))
  if not lower_only:
    result["harness"] = run
  else:
    run.close()
  return result


def predict(config, strategy_name, mesh_shape, layout=None):
  """Predicted ring bytes per device of one attention layer (no graph).

  prices.ring_elements x 4, with the layout measure() uses
  (default_layout unless given, plus the strategy's rules).  It leaves out
  what every strategy sends alike (tests/strategies/test_auto.py: measured minus
  predicted is one constant per configuration).
  """
  _, layer, layout = _setup(config, strategy_name, mesh_shape, layout)
  return BYTES_PER_ELEMENT * prices.ring_elements(
      strategy_name, layer.dims, mesh_shape, layout, config.batch,
      config.length, config.d_model, config.dynamic)


def explain_auto(config, mesh_shape, layout=None):
  """Lines saying what strategies.Auto picks for `config` and why.

  One line per candidate (predicted ring bytes per device, or the reason
  it does not apply), then the choice.
  """
  auto, layer, layout = _setup(config, strategies.Auto.name, mesh_shape,
                               layout)
  mesh = strategies.MeshLayout(mesh_shape, layout)
  chosen, predicted, table = auto.choose(layer.dims, mesh, config.batch,
                                         config.length, config.d_model,
                                         config.dynamic)
  seconds = {c.name: c.seconds for c in auto.priced or ()}
  lines = []
  for name, value in table.items():
    if isinstance(value, str):
      lines.append("auto: %s does not apply: %s" % (name,
                                                    value.splitlines()[0]))
    else:
      lines.append("auto: %s predicts %d bytes/device%s" % (
          name, value, "" if name not in seconds else
          ", %+.4f ms of step time" % (1e3 * seconds[name])))
  lines.append("auto picks %s (%d bytes/device predicted; the fastest "
               "predicted on %s: planner.price_layer, relative to the "
               "heads-parallel compute)" % (chosen.name, predicted,
                                            auto.hardware))
  return lines


def row_cells(result):
  """The COLUMNS of a measure() result, formatted for printing."""
  cells = []
  for c in COLUMNS:
    value = result[c]
    cells.append("%.3f" % value if c == "einsum_replication" else value)
  return cells


def num_devices(mesh_shapes):
  """Logical CPU devices needed for all of `mesh_shapes`."""
  sizes = [max(strategies.MeshLayout(m, "").mesh_shape.size, 1)
           for m in mesh_shapes]
  return max(sizes + [1])

