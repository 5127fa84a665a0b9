"""Which mesh, layout and strategy: memory.py's fit, perf.py's step time.

Pure Python (no TensorFlow): `mtf_th plan`, the pre-flight checks of
`mtf_th train` and launch/tpu.py (fit_check.py) and sharding.Auto's choice
(price_layer and pick, by the same strategy_seconds as plan()'s step time)
use it.

For N devices, plan() enumerates

  * mesh shapes batch:B,model:P with B * P = N (the batch divisible by B,
    the split dims by P: perf.py's checks);
  * for P > 1, the sharding strategies of sharding.py that apply
    (STRATEGIES: heads_parallel, batch_split_gathered, batch_split,
    batch_query_split, query_split, query_split_allgather: Auto's
    candidates, with their own conditions on batch and length; grouped
    talking heads and general bilinear run heads-parallel);
  * heads-parallel with the attention core recomputed in the backward pass
    (recompute.RecomputeCore: mtf.recompute_grad around the core; not with
    attention dropout, not around the split strategies' cores, whose
    custom gradients mtf cannot recompute).

Each candidate's memory per device is memory.predict's; it fits if that is
at most (1 - margin) of the device's memory (memory.DEVICE_MEMORY).  Its
step time is perf.predict's (heads-parallel) with, for another strategy,
the attention layers' ring bytes replaced by that strategy's
(docs/sharding.md, "The strategies, on paper") and the softmax of the
variants that mix heads no longer replicated; recomputing adds the
forward einsums and softmax of the core once more.
"""
import collections

from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import perf
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.core import spec as spec_lib

STRATEGIES = prices.STRATEGY_NAMES
DEFAULT_MARGIN = 0.1
# sharding.STRATEGIES' classes (gin names) by strategy name
# (tests/test_plan.py checks them against sharding.py).
_STRATEGY_CLASSES = {
    "heads_parallel": "HeadsParallel", "batch_split": "BatchSplit",
    "batch_split_gathered": "GatheredBatchSplit",
    "batch_query_split": "BatchQuerySplit", "query_split": "QuerySplit",
    "query_split_allgather": "QuerySplit",
}

Candidate = collections.namedtuple("Candidate", [
    "mesh_shape", "strategy", "recompute", "memory", "step_s", "network_s",
    "fits", "gin"])


def attentions(model):
  """[(placement, Attention, n, m)] of every attention placement."""
  return [(placement, getattr(model, placement), n, m)
          for _, n, placements in memory.stacks(model)
          for placement, m in placements]


def layout(model, model_axis):
  """The layout rules (a string) of the candidate meshes."""
  rules = ["batch:batch"]
  if model_axis > 1:
    heads = []
    for _, att, _, _ in attentions(model):
      heads += [r for r in _heads_rules(att, model.d_model)
                if r not in heads]
    if "heads" in heads and {"heads_k", "heads_v"} & set(heads):
      heads.remove("heads")  # P_l[heads_k, heads] may not put both on model
    rules += ["%s:model" % r for r in heads] + ["d_ff:model", "vocab:model"]
  return ",".join(rules)


def _heads_rules(att, d_model):
  """The heads dims prices.heads_parallel_layout puts on `model` (what perf.py
  times and comm.default_layout chooses)."""
  dims = prices.named_dims(att, d_model)
  return [d for d, _ in prices.heads_parallel_layout(dims)]


def split_only_heads(att):
  """True if `att` runs heads-parallel only: grouped talking heads and
  general bilinear (no formula or strategy of theirs splits the core)."""
  return att.variant in (spec_lib.GROUPED, spec_lib.BILINEAR)


def applies(strategy, att, b, n, p):
  """Whether `strategy` can run `att` on b examples, length n, model axis p."""
  if strategy == "heads_parallel":
    return True
  if p == 1 or split_only_heads(att):
    return False
  if strategy in ("batch_split", "batch_split_gathered"):
    return b % p == 0
  if strategy.startswith("query_split"):
    return n % p == 0
  return n % prices.batch_query_factors(
      prices.Layout("model:%d" % p, ""), "model", b)[1] == 0


def ring_elements(strategy, att, d_model, n, m, b, p, batch_axis=1):
  """Elements one device sends for one attention layer: prices.predict on
  mesh batch:<batch_axis>,model:<p> with the heads-parallel layout (b: the
  examples of one data-parallel group)."""
  if strategy == "heads_parallel" or p == 1:
    return perf.attention_ring_elements(att, d_model, n, m, b, p)
  dims = prices.named_dims(att, d_model)
  mesh = prices.Layout("batch:%d;model:%d" % (batch_axis, p),
                       [(prices.BATCH, "batch")] +
                       prices.heads_parallel_layout(dims))
  return prices.predict(strategy, dims, mesh, b * batch_axis, n, d_model,
                        att.dynamic, "model", m)


def _op_s(op, hw, eff):
  return max(perf.op_seconds(op, hw, eff))


def _core_forward(ops):
  """The forward ops of the core (J, L*, U*, O einsums and the softmax)."""
  return [op for op in ops if op.name == "J" or op.name == "O" or (
      op.name[:1] in ("L", "U") and op.name[1:].isdigit())]


def strategy_seconds(strategy, ring, att, d_model, n, m, b, p, hw, impl,
                     recompute=False, placement="layer"):
  """(seconds, network seconds) of one attention layer's strategy-dependent
  part: what separates the strategies' predicted step times.

  Args:
    strategy: a key of STRATEGIES.
    ring: elements one device sends for the layer under `strategy`
      (ring_elements, prices.predict).
    att: a perf.Attention.
    d_model, n, m: model size, query and memory lengths.
    b: examples of one group of the strategy's axis.
    p: the size of that axis.
    hw: a perf.Hardware; impl: a perf.Implementation.
    recompute: the core is recomputed in the backward pass.
    placement: a label for perf.attention_ops.
  Returns:
    the ring's seconds, less the softmax a split strategy no longer
    replicates (the variants that mix heads keep `heads` whole under
    heads-parallel), plus the recomputed core's forward ops; and the
    ring's seconds alone.
  """
  eff = hw.efficiency
  network = ring * impl.activation_bytes / (hw.ici_bytes_per_s * eff.network)
  compute = 0.0
  if (strategy != "heads_parallel" and att.mixes_heads) or recompute:
    ops = perf.attention_ops(att, d_model, n, m, b, impl, placement)
    softmax = sum(_op_s(op, hw, eff) for op in ops if op.name == "softmax")
    if strategy != "heads_parallel" and att.mixes_heads:
      compute -= softmax * (1 - 1.0 / p)
    if recompute:
      whole = att.mixes_heads and strategy == "heads_parallel"
      compute += sum(_op_s(op, hw, eff) for op in _core_forward(ops)) / p
      compute += softmax * 3.0 / 8 / (1 if whole else p)  # 3 of 8 passes
  return network + compute, network


def _adjust(model, hw, impl, b, p, batch_axis, strategy, recompute):
  """(seconds added to perf's step, of which network) by the strategy."""
  total = network = 0.0
  for placement, att, n, m in attentions(model):
    s = strategy if applies(strategy, att, b, n, p) else "heads_parallel"
    base = strategy_seconds(
        "heads_parallel",
        ring_elements("heads_parallel", att, model.d_model, n, m, b, p), att,
        model.d_model, n, m, b, p, hw, impl, placement=placement)
    mine = strategy_seconds(
        s, ring_elements(s, att, model.d_model, n, m, b, p, batch_axis), att,
        model.d_model, n, m, b, p, hw, impl, recompute, placement)
    total += mine[0] - base[0]
    network += mine[1] - base[1]
  layers = model.num_layers
  return total * layers, network * layers


Priced = collections.namedtuple("Priced", ["name", "seconds", "memory"])
Priced.__doc__ = """One candidate of Auto: its strategy-dependent seconds
(strategy_seconds) and the step's bytes per device (None: not predicted)."""


def pick(priced, usable):
  """The candidate to run: the fastest that fits, else the smallest.

  The chooser of sharding.Auto (plan() ranks whole candidates the same
  way: fitting ones by step time, then the others by memory).

  Args:
    priced: [Priced], in order of preference on ties.
    usable: bytes of one device a step may use (usable_bytes).
  Returns:
    (the chosen Priced, True if it fits).  A candidate whose memory is
    None counts as fitting.  Ties: the faster, then the earlier.

  Example (bytes and time disagree, the slower one does not fit):
    pick([Priced("a", 1.0, 9e9), Priced("b", 2.0, 5e9)], 8e9)
    == (Priced("b", 2.0, 5e9), True)
  """
  if not priced:
    raise ValueError("no candidate to pick from")
  fitting = [c for c in priced if c.memory is None or c.memory <= usable]
  if fitting:
    return min(fitting, key=lambda c: (c.seconds, priced.index(c))), True
  return min(priced, key=lambda c: (c.memory, c.seconds,
                                    priced.index(c))), False


def price_layer(rings, att, d_model, n, m, b, p, hardware, impl=None,
                model=None, mesh_shape=None, layout=None):
  """[Priced] of one attention layer's candidates (sharding.Auto's).

  Args:
    rings: {strategy: elements one device sends for the layer} of the
      candidates that apply (prices.predict on the layer's mesh), in order
      of preference.
    att: the layer's perf.Attention; d_model, n, m: sizes.
    b: examples of one group of the strategy's axis; p: its size.
    hardware: a perf hardware name.
    impl: a perf implementation (None: as plan()).
    model: the whole perf.Model being built, or None: memory not predicted.
    mesh_shape: "batch:B,model:P" (memory.predict's) when model is given.
    layout: the layout rules the model runs with (memory.predict's).
  Returns:
    [Priced]: seconds by strategy_seconds (perf.py's ops and hardware, the
    planner's), memory by memory.predict with every attention layer on
    that strategy.
  """
  hw = perf.get_hardware(hardware)
  impl = memory.implementation(
      impl or ("mtf_th_float32" if hw.name == "cpu" else "mtf_th"))
  out = []
  for name, ring in rings.items():
    seconds = strategy_seconds(name, ring, att, d_model, n, m, b, p, hw,
                               impl)[0]
    total = None
    if model is not None:
      total = memory.predict(model, mesh_shape, impl, name,
                             layout=layout)["total"]
    out.append(Priced(name, seconds, total))
  return out


def attention_of(dims, dynamic=(), layer_class=None):
  """The perf.Attention of a layer's attention.AttentionDims.

  Args:
    dims: attention.AttentionDims (heads sizes per group) or alike.
    dynamic: the layer's dynamic terms.
    layer_class: the mtf_th layer class name (None: the variant its dims
      imply; general bilinear needs its class).

  Example:
    attention_of(layers.TalkingHeadsAttention(heads_k=8, heads=4,
                 heads_v=8).dims).variant == "talking_heads"
  """
  variant = None
  for name in spec_lib.VARIANTS:
    if layer_class in spec_lib.layer_class_names(name):
      variant = name
  if variant is None:
    variant = (spec_lib.GROUPED if dims.groups is not None else
               spec_lib.variant_with(dims.project_logits,
                                     dims.project_weights))
  v = spec_lib.VARIANT[variant]
  g = dims.groups.size if dims.groups is not None else 1
  return perf.make_attention(
      variant, dims.heads.size * g, dims.d_k.size, dims.d_v.size,
      dims.heads_k.size * g if v.project_logits else None,
      dims.heads_v.size * g if v.project_weights else None,
      tuple(dynamic), dims.groups.size if dims.groups is not None else None)


def model_from_live_gin(vocab, batch=None):
  """The perf.Model of gin's current configuration, or None.

  What sharding.Auto reads while `mtf_th train` (or any command that
  parsed the gin files) builds the graph: perf.model_from_gin's macros,
  from the bindings gin holds now.  None when they do not describe a model
  perf.py reads (a test harness building layers by hand).

  Args:
    vocab: the model's vocabulary size.
    batch: the batch the graph is built with (None: batch_size).
  """
  try:
    model = perf.model_from_config(_LiveGin(), "the gin configuration", vocab)
  except (ValueError, TypeError, KeyError):
    return None
  return model if batch is None else model._replace(batch=batch)


def model_for_layer(vocab, batch, att, d_model, n):
  """model_from_live_gin's Model if it holds this layer, else None.

  The layer's attention, d_model and length must be the model's: gin may
  still hold another configuration than the graph being built (a test
  building layers by hand after a command parsed a model).
  """
  model = model_from_live_gin(vocab, batch)
  if model is None or model.d_model != d_model or n not in (
      model.inputs_length, model.targets_length) or all(
          a != att for _, a, _, _ in attentions(model)):
    return None
  return model


class _LiveGin(object):
  """gin_text.GinConfig's questions answered by gin's current bindings."""

  def __init__(self):
    from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
    self._query = models.query

  def _convert(self, value):
    import gin  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
    if isinstance(value, gin.config.ConfigurableReference):
      return gin_text.Reference(value.selector, value.evaluate)
    return value

  def binding(self, key, default=None):
    return self._convert(self._query(key, default))

  def __contains__(self, name):
    return self._query(name) is not None

  def get(self, name, default=None):
    return self._convert(self._query(name, default))

  def require(self, name, where):
    if name not in self:
      raise ValueError("%s does not define the gin macro %r" % (where, name))
    return self.get(name)


def gin_bindings(model, mesh_shape, strategy, recompute):
  """The gin bindings that run a candidate (to pass as --gin_param)."""
  mesh = perf.parse_mesh(mesh_shape)
  rules = layout(model, mesh["model"])
  if strategy != "heads_parallel":
    rules += ",core_shard:model"
  out = ["mesh_shape = '%s'" % mesh_shape.replace(",", ";"),
         "layout = '%s'" % rules]
  inner = "@mtf_th.%s()" % _STRATEGY_CLASSES[strategy]
  if strategy == "query_split_allgather":
    out.append("mtf_th.QuerySplit.reduce_scatter = False")
  if recompute:  # its default inner strategy: HeadsParallel(ordered=False)
    inner = "@mtf_th.RecomputeCore()"
  names = []
  for placement, att, _, _ in attentions(model):
    classes = spec_lib.layer_class_names(
        spec_lib.DYNAMIC if att.dynamic else att.variant)
    name = classes[1] if placement == "encdec" else classes[0]
    if name not in names:
      names.append(name)
  if strategy != "heads_parallel" or recompute or mesh["model"] > 1:
    out += ["mtf_th.%s.strategy = %s" % (n, inner) for n in names]
  return out


def mesh_shapes(devices):
  """batch:B,model:P for every B * P = devices, data parallel first."""
  return ["batch:%d,model:%d" % (devices // p, p)
          for p in range(1, devices + 1) if devices % p == 0]


def plan(model, hardware, devices, impl=None, margin=DEFAULT_MARGIN,
         dropout=False, recompute_options=(False, True)):
  """Every candidate, those that fit first, each group by step time.

  Args:
    model: a perf.Model (its batch is the whole slice's).
    hardware: a perf hardware name.
    devices: the number of mtf devices.
    impl: a perf implementation name (None: mtf_th on TPUs,
      mtf_th_float32 on cpu).
    margin: the fraction of device memory left free.
    dropout: attention dropout on.
    recompute_options: which recompute settings to enumerate.
  Returns:
    [Candidate], sorted: fitting ones by step time, then the others by
    memory.
  Raises:
    ValueError: naming the bad argument.
  """
  hw = perf.get_hardware(hardware)
  spec_lib.positive_int("--devices", devices)
  if not 0 <= margin < 1:
    raise ValueError("--margin must be in [0, 1), got %r" % (margin,))
  impl = memory.implementation(
      impl or ("mtf_th_float32" if hw.name == "cpu" else "mtf_th"))
  usable = usable_bytes(hw.name, devices, margin)
  out = []
  for shape in mesh_shapes(devices):
    mesh = perf.parse_mesh(shape)
    b, p = model.batch // mesh["batch"], mesh["model"]
    try:  # perf's checks: batch divisible by B, split dims by P
      base = perf.predict(model, hw, shape, impl)
    except ValueError:
      continue
    rules = layout(model, p)
    for strategy in STRATEGIES:
      if not all(applies(strategy, att, b, n, p)
                 for _, att, n, _ in attentions(model)
                 if not split_only_heads(att)):
        continue
      if strategy != "heads_parallel" and all(
          split_only_heads(att) for _, att, _, _ in attentions(model)):
        continue
      for recompute in recompute_options:
        if recompute and (strategy != "heads_parallel" or dropout):
          continue  # recompute.RecomputeCore: heads-parallel, no dropout
        mem = memory.predict(model, shape, impl, strategy, recompute,
                             dropout, rules)
        extra, network = _adjust(model, hw, impl, b, p, mesh["batch"],
                                 strategy, recompute)
        out.append(Candidate(
            shape, strategy, recompute, mem, base["step_s"] + extra,
            base["network_s"] + network, mem["total"] <= usable,
            gin_bindings(model, shape, strategy, recompute)))
  if not out:
    raise ValueError("no mesh of %d devices splits this model: the batch "
                     "(%d) and the split dims must divide by its axes; "
                     "choose another --devices or --batch"
                     % (devices, model.batch))
  out.sort(key=lambda c: (not c.fits, c.step_s if c.fits
                          else c.memory["total"]))
  return out


def usable_bytes(hardware, devices, margin=DEFAULT_MARGIN):
  """Bytes of one device of `hardware` a step may use: `margin` left free."""
  return (1 - margin) * memory.device_memory(hardware, devices)


def what_would_fit(model, hardware, devices, impl=None, margin=DEFAULT_MARGIN,
                   dropout=False):
  """Hints when nothing fits: [text], e.g. "--batch 64 (2 per device)"."""
  hints = []
  batch = model.batch
  while batch > 1:
    batch //= 2
    smaller = model._replace(batch=batch)
    try:
      if any(c.fits for c in plan(smaller, hardware, devices, impl, margin,
                                  dropout)):
        hints.append("--batch %d (%s per device)" % (
            batch, _per_device(batch, devices)))
        break
    except ValueError:
      continue
  more = devices
  for _ in range(6):
    more *= 2
    try:
      if any(c.fits for c in plan(model, hardware, more, impl, margin,
                                  dropout)):
        hints.append("--devices %d (a larger slice)" % more)
        break
    except ValueError:
      continue
  return hints


def _per_device(batch, devices):
  per = batch / devices
  return ("%d" % per) if per == int(per) else ("%.2g" % per)
