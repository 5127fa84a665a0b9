"""Auto: runs the strategy estimate/auto_pricing.py picks for each layer.

The pricing is TensorFlow-free (auto_pricing.choose); this module gathers
what it needs from the mtf graph being built (the model's mesh and
layout, the batch, the lengths, d_model, the live gin's model) and applies
the result: it adds the split strategies' layout rule to the model's
mtf.LayoutRules when needed, logs one line, and returns the chosen
strategy's frame.
"""
import gin
import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import auto_pricing
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import strategy_table
from mtf_talking_heads.nn import live_gin
from mtf_talking_heads.nn import validation
from mtf_talking_heads.nn.strategies import frame
from mtf_talking_heads.nn.strategies import heads_parallel
from mtf_talking_heads.nn.strategies import mesh_layout
from mtf_talking_heads.nn.strategies import registry
from mtf_talking_heads.nn.strategies import split

_LOGGED = set()  # Auto's choices already logged (one line each)


def add_layout_rules(layout, rules):
  """Adds the missing (tensor dim, mesh axis) `rules` to `layout` in place.

  How Auto adds its split strategies' rule: compat.add_layout_rules on the
  model's mtf.LayoutRules (anything else is left alone).

  Returns:
    the pairs added (those the layout did not have).
  """
  if not isinstance(layout, mtf.LayoutRules):
    return []
  return compat.add_layout_rules(layout, rules)


@gin.configurable(module="mtf_th")
class Auto(frame.Strategy):
  """The fastest strategy that fits, chosen when the layer is built.

  Reads the mesh and layout the model was built for, the batch size and
  the lengths, and runs what auto_pricing.choose picks: it prices every
  candidate that applies with prices.ring_elements' formulas (which
  tests/strategies/test_auto.py checks against mtf's counters) and, with the
  planner's predictors (planner.price_layer: those bytes over
  `hardware`'s network plus the softmax a split strategy stops
  replicating, step_time.py's; memory.py's step memory for the model gin
  describes, when it describes one), runs the fastest of those predicted
  to fit one device of `hardware` (planner.pick; ties: the earlier
  candidate), or, if none fits, the smallest, saying so in one logged
  line.  It logs one line with its pick's predicted bytes per device and
  those of the others.  Its layout rule (core_shard on the mesh axis) is
  the split strategies' one: when it picks one of them and the layout
  lacks the rule, it adds it to the model's mtf.LayoutRules
  (add_layout_rules), the object the mesh implementation lowers with.  On
  a mesh without that axis, or a model built without a layout, it runs
  heads_parallel.  The default strategy of every attention layer.

  Args:
    mesh_axis: the axis the split strategies use.
    shard_dim: their shard dim (the layout must map it to mesh_axis).
    candidates: names (keys of registry.STRATEGIES) to choose from, in
      order of preference on ties (strategy_table.AUTO_CANDIDATES).
    hardware: the hardware.py hardware whose step time and device memory it
      predicts (None: "cpu", the logical CPU devices `mtf_th train` runs
      the mesh on here; launch/tpu.py binds the slice's, e.g. "tpu_v3").
  """

  name = strategy_table.AUTO

  def __init__(self, mesh_axis="model", shard_dim=spec.CORE_SHARD,
               candidates=strategy_table.AUTO_CANDIDATES, hardware=None):
    auto_pricing.check_arguments(candidates, hardware)
    self.mesh_axis = mesh_axis
    self.shard_dim = shard_dim
    self.candidates = tuple(candidates)
    self.hardware = hardware or "cpu"
    self.picked = None  # the name of the strategy last run
    self.note = None  # the line saying nothing fits, if nothing did
    self.priced = None  # [planner.Priced] of the last choice (None: one)

  def layout_rules(self):
    return [(self.shard_dim, self.mesh_axis)]

  def kernel(self):
    """The core kernel this layer's memory is priced with
    (core_kernel.memory_kernel on this strategy's hardware)."""
    from mtf_talking_heads.nn import core_kernel  # pylint: disable=g-import-not-at-top
    return core_kernel.memory_kernel(self.hardware)

  def _make(self, name):
    strategy = registry.STRATEGIES[name]()
    if isinstance(strategy, split.SplitCore):
      strategy.mesh_axis = self.mesh_axis
      strategy.shard_dim = self.shard_dim
    return strategy

  def with_rule(self, mesh):
    """`mesh` plus this strategy's rule (shard_dim on mesh_axis), when the
    mesh has that axis and the layout puts shard_dim on no axis yet."""
    if (not mesh.has_axis(self.mesh_axis) or
        mesh.axis_of(self.shard_dim) is not None):
      return mesh
    return mesh_layout.MeshLayout(mesh.mesh_shape_string,
                                  validation.parse_layout(mesh.rules) +
                                  [(self.shard_dim, self.mesh_axis)])

  def _choice(self, dims, mesh, batch, length, d_model, dynamic,
              memory_length, model, layer_class):
    """auto_pricing.choose on `mesh` (a MeshLayout); sets note and priced."""
    def check(name):
      self._make(name)._check(dims, mesh, batch, length)  # pylint: disable=protected-access
    choice = auto_pricing.choose(
        self.candidates, check, dims, mesh, batch, length, d_model, dynamic,
        memory_length, self.mesh_axis, self.hardware, model, layer_class,
        self.kernel())
    self.note, self.priced = choice.note, choice.priced
    return choice

  def choose(self, dims, mesh, batch, length, d_model, dynamic=(),
             memory_length=None, add_rule=True, model=None, layer_class=None):
    """(strategy, predicted bytes per device, {name: bytes or reason}).

    Args:
      dims: attention.AttentionDims.
      mesh: a MeshLayout (mesh shape and layout).
      batch, length, d_model, dynamic, memory_length: as
        prices.ring_elements.
      add_rule: price the split strategies as if the layout had this
        strategy's rule (with_rule), which _chosen then adds.
      model: the whole model.Model (live_gin.model_from_live_gin), or None:
        memory not predicted.
      layer_class: the layer's class name (planner.attention_of).
    Raises:
      ValueError: if no candidate applies (the first one's reason).
    """
    if add_rule:
      mesh = self.with_rule(mesh)
    choice = self._choice(dims, mesh, batch, length, d_model, dynamic,
                          memory_length, model, layer_class)
    return self._make(choice.name), choice.predicted, choice.table

  def check(self, dims, mesh_shape, layout, batch, length):
    """See Strategy.check: raises if no candidate applies."""
    self.choose(dims, mesh_layout.MeshLayout(mesh_shape, layout), batch,
                length, 1)

  def core_layout(self, dims, mesh, batch, length):
    """See Strategy.core_layout: that of the strategy choose() picks
    (priced without the model's memory)."""
    strategy, _, _ = self.choose(dims, mesh, batch, length, 1)
    return strategy.core_layout(dims, self.with_rule(mesh), batch, length)

  def _chosen(self, call, memory_length):
    context = call.context
    mesh = mesh_layout.model_layout(context)
    if mesh is None:
      return heads_parallel.HeadsParallel()
    batch = mesh_layout.size_of(call.x, mesh_layout.BATCH) or 1
    length = context.length_dim.size
    layout = context.model.layout
    # the rule can be added where the layout lacks it and is the object
    # the mesh implementation lowers with (an mtf.LayoutRules)
    ruled = self.with_rule(mesh)
    can_add = isinstance(layout, mtf.LayoutRules) and ruled is not mesh
    vocab = getattr(getattr(context.model, "output_vocab_dim", None) or
                    getattr(context.model, "input_vocab_dim", None), "size",
                    None)  # an encoder's stack has no output vocabulary
    d_model, name = context.model.model_dim.size, call.layer_name
    model = vocab and live_gin.model_for_layer(
        vocab, batch, planner.attention_of(call.dims, call.dynamic, name),
        d_model, length)
    choice = self._choice(call.dims, ruled if can_add else mesh, batch,
                          length, d_model, call.dynamic, memory_length,
                          model or None, name)
    strategy = self._make(choice.name)
    added = (add_layout_rules(layout, strategy.layout_rules()) if can_add
             else [])
    line = auto_pricing.log_line(call.layer_name, mesh, batch, length,
                                 choice, self.hardware, memory_length,
                                 with_memory=model is not None)
    if added:
      line += "; added %s to the layout" % ";".join("%s:%s" % r for r in added)
    self.picked = strategy.name
    if line not in _LOGGED:
      _LOGGED.add(line)
      tf.logging.info(line)
    if self.note and self.note not in _LOGGED:
      _LOGGED.add(self.note)
      tf.logging.warning(self.note)
    return strategy

  def frame(self, call):
    """The chosen strategy's frame (see Strategy.frame)."""
    memory_length = (None if call.memory is None
                     else mesh_layout.size_of(call.memory,
                                              mesh_layout.MEMORY_LENGTH))
    return self._chosen(call, memory_length).frame(call)
