"""Which mesh, layout and strategy: memory.py's fit, step_time.py's time.

Pure Python (no TensorFlow): `mtf_th plan`, the pre-flight checks of
`mtf_th train` and launch/tpu.py (fit_check.py) and strategies.Auto's choice
(price_layer and pick, by the same strategy_seconds as plan()'s step time)
use it.

For N devices, plan() enumerates

  * mesh shapes batch:B,model:P with B * P = N (the batch divisible by B,
    the split dims by P: step_time.py's checks);
  * for P > 1, the sharding strategies of strategy_table that apply (each
    row's `needs`: a condition on batch or length; grouped talking heads
    and general bilinear run heads-parallel);
  * heads-parallel with the attention core recomputed in the backward pass
    (strategies.RecomputeCore: mtf.recompute_grad around the core; not with
    attention dropout, not around the split strategies' cores, whose
    custom gradients mtf cannot recompute).

Each candidate's memory per device is memory.predict's; it fits if that is
at most (1 - margin) of the device's memory (memory.DEVICE_MEMORY).  Its
step time is step_time.predict's (heads-parallel) with, for another
strategy, the attention layers' ring bytes replaced by that strategy's
(prices.attention_elements: docs/sharding.md, "The strategies, on paper")
and the softmax of the variants that mix heads no longer replicated;
recomputing adds the forward einsums and softmax of the core once more.
"""
import collections

from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import step_time
from mtf_talking_heads.estimate import strategy_table

DEFAULT_MARGIN = 0.1

Candidate = collections.namedtuple("Candidate", [
    "mesh_shape", "strategy", "recompute", "memory", "step_s", "network_s",
    "fits", "gin"])


def attentions(model):
  """[(placement, Attention, n, m)] of every attention placement."""
  return [(placement, getattr(model, placement), n, m)
          for _, n, placements in model_lib.stacks(model)
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
  """The heads dims prices.heads_parallel_layout puts on `model` (what
  step_time.py times and comm.default_layout chooses)."""
  dims = prices.named_dims(att, d_model)
  return [d for d, _ in prices.heads_parallel_layout(dims)]


def split_only_heads(att):
  """True if `att` runs heads-parallel only: grouped talking heads and
  general bilinear (no formula or strategy of theirs splits the core)."""
  return att.variant in (spec_lib.GROUPED, spec_lib.BILINEAR)


def applies(strategy, att, b, n, p):
  """Whether `strategy` can run `att` on b examples, length n, model axis p
  (its strategy_table row's `needs`)."""
  needs = strategy_table.ROWS[strategy].needs
  if needs == "any":
    return True
  if p == 1 or split_only_heads(att):
    return False
  if needs == "batch":
    return b % p == 0
  if needs == "length":
    return n % p == 0
  if needs != "batch_query":
    raise ValueError("strategy %r: unknown need %r in strategy_table"
                     % (strategy, needs))
  return n % prices.batch_query_factors(
      prices.Layout("model:%d" % p, ""), "model", b)[1] == 0


def _op_s(op, hw, eff):
  return max(step_time.op_seconds(op, hw, eff))


def _core_forward(ops):
  """The forward ops of the core (J, L*, U*, O einsums and the softmax)."""
  return [op for op in ops if op.name == "J" or op.name == "O" or (
      op.name[:1] in ("L", "U") and op.name[1:].isdigit())]


def strategy_seconds(strategy, ring, att, d_model, n, m, b, p, hw, impl,
                     recompute=False, placement="layer"):
  """(seconds, network seconds) of one attention layer's strategy-dependent
  part: what separates the strategies' predicted step times.

  Args:
    strategy: a strategy_table name.
    ring: elements one device sends for the layer under `strategy`
      (prices.attention_elements).
    att: a model.Attention.
    d_model, n, m: model size, query and memory lengths.
    b: examples of one group of the strategy's axis.
    p: the size of that axis.
    hw: a hardware.Hardware; impl: a hardware.Implementation.
    recompute: the core is recomputed in the backward pass.
    placement: a label for step_time.attention_ops.
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
    ops = step_time.attention_ops(att, d_model, n, m, b, impl, placement)
    softmax = sum(_op_s(op, hw, eff) for op in ops if op.name == "softmax")
    if strategy != "heads_parallel" and att.mixes_heads:
      compute -= softmax * (1 - 1.0 / p)
    if recompute:
      whole = att.mixes_heads and strategy == "heads_parallel"
      compute += sum(_op_s(op, hw, eff) for op in _core_forward(ops)) / p
      compute += softmax * 3.0 / 8 / (1 if whole else p)  # 3 of 8 passes
  return network + compute, network


def _adjust(model, hw, impl, b, p, batch_axis, strategy, recompute):
  """(seconds added to step_time's step, of which network) by the
  strategy."""
  total = network = 0.0
  for placement, att, n, m in attentions(model):
    s = strategy if applies(strategy, att, b, n, p) else "heads_parallel"
    base = strategy_seconds(
        "heads_parallel", prices.attention_elements(
            "heads_parallel", att, model.d_model, n, m, b, p), att,
        model.d_model, n, m, b, p, hw, impl, placement=placement)
    mine = strategy_seconds(
        s, prices.attention_elements(s, att, model.d_model, n, m, b, p,
                                     batch_axis), att,
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

  The chooser of strategies.Auto (plan() ranks whole candidates the same
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
                model=None, mesh_shape=None, layout=None, kernel="einsum"):
  """[Priced] of one attention layer's candidates (strategies.Auto's).

  Args:
    rings: {strategy: elements one device sends for the layer} of the
      candidates that apply (prices.predict on the layer's mesh), in order
      of preference.
    att: the layer's model.Attention; d_model, n, m: sizes.
    b: examples of one group of the strategy's axis; p: its size.
    hardware: a hardware.py name.
    impl: a hardware.py implementation (None: as plan()).
    model: the whole model.Model being built, or None: memory not predicted.
    mesh_shape: "batch:B,model:P" (memory.predict's) when model is given.
    layout: the layout rules the model runs with (memory.predict's).
    kernel: the attention core's kernel the run uses (memory.predict's;
      with the packed batches `mtf_th train` builds, as plan() prices).
  Returns:
    [Priced]: seconds by strategy_seconds (step_time.py's ops and
    hardware.py's figures, the planner's), memory by memory.predict with
    every attention layer on that strategy.
  """
  hw = hardware_lib.get_hardware(hardware)
  impl = hardware_lib.implementation(
      impl or ("mtf_th_float32" if hw.name == "cpu" else "mtf_th"))
  out = []
  for name, ring in rings.items():
    seconds = strategy_seconds(name, ring, att, d_model, n, m, b, p, hw,
                               impl)[0]
    total = None
    if model is not None:
      total = memory.predict(model, mesh_shape, impl, name, layout=layout,
                             kernel=kernel, packed=True)["total"]
    out.append(Priced(name, seconds, total))
  return out


def attention_of(dims, dynamic=(), layer_class=None):
  """The model.Attention of a layer's attention.AttentionDims.

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
  return model_lib.make_attention(
      variant, dims.heads.size * g, dims.d_k.size, dims.d_v.size,
      dims.heads_k.size * g if v.project_logits else None,
      dims.heads_v.size * g if v.project_weights else None,
      tuple(dynamic), dims.groups.size if dims.groups is not None else None)


def gin_bindings(model, mesh_shape, strategy, recompute):
  """The gin bindings that run a candidate (to pass as --gin_param)."""
  mesh = model_lib.parse_mesh(mesh_shape)
  rules = layout(model, mesh["model"])
  if strategy != "heads_parallel":
    rules += ",core_shard:model"
  out = ["mesh_shape = '%s'" % mesh_shape.replace(",", ";"),
         "layout = '%s'" % rules]
  row = strategy_table.ROWS[strategy]
  inner = "@mtf_th.%s()" % row.gin_class
  out += ["mtf_th.%s.%s = %s" % (row.gin_class, name, value)
          for name, value in row.kwargs]
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
         dropout=False, recompute_options=(False, True), kernel="einsum"):
  """Every candidate, those that fit first, each group by step time.

  Args:
    model: a model.Model (its batch is the whole slice's).
    hardware: a hardware.py name.
    devices: the number of mtf devices.
    impl: a hardware.py implementation name (None: mtf_th on TPUs,
      mtf_th_float32 on cpu).
    margin: the fraction of device memory left free.
    dropout: attention dropout on.
    recompute_options: which recompute settings to enumerate.
    kernel: the attention core's kernel (memory.predict's; "fused": where
      it applies, with packed batches, as `mtf_th train` runs it).
  Returns:
    [Candidate], sorted: fitting ones by step time, then the others by
    memory.
  Raises:
    ValueError: naming the bad argument.
  """
  hw = hardware_lib.get_hardware(hardware)
  spec_lib.positive_int("--devices", devices)
  if devices > hardware_lib.MAX_CPU_DEVICES:  # before enumerating divisors
    raise ValueError("--devices %d: the planner enumerates meshes of at most "
                     "%d devices" % (devices, hardware_lib.MAX_CPU_DEVICES))
  if not 0 <= margin < 1:
    raise ValueError("--margin must be in [0, 1), got %r" % (margin,))
  impl = hardware_lib.implementation(
      impl or ("mtf_th_float32" if hw.name == "cpu" else "mtf_th"))
  usable = usable_bytes(hw.name, devices, margin)
  out, why = [], []
  for shape in mesh_shapes(devices):
    mesh = model_lib.parse_mesh(shape)
    b, p = model.batch // mesh["batch"], mesh["model"]
    try:  # step_time's checks: batch divisible by B, split dims by P
      base = step_time.predict(model, hw, shape, impl)
    except ValueError as e:
      why.append("%s: %s" % (shape, str(e).split("; choose")[0]))
      continue
    rules = layout(model, p)
    for strategy in strategy_table.NAMES:
      if not all(applies(strategy, att, b, n, p)
                 for _, att, n, _ in attentions(model)
                 if not split_only_heads(att)):
        continue
      if strategy != "heads_parallel" and all(
          split_only_heads(att) for _, att, _, _ in attentions(model)):
        continue
      for recompute in recompute_options:
        if recompute and (strategy != "heads_parallel" or dropout):
          continue  # strategies.RecomputeCore: heads-parallel, no dropout
        mem = memory.predict(model, shape, impl, strategy, recompute,
                             dropout, rules, kernel, packed=True)
        extra, network = _adjust(model, hw, impl, b, p, mesh["batch"],
                                 strategy, recompute)
        out.append(Candidate(
            shape, strategy, recompute, mem, base["step_s"] + extra,
            base["network_s"] + network, mem["total"] <= usable,
            gin_bindings(model, shape, strategy, recompute)))
  if not out:
    raise ValueError("no mesh of %d devices splits this model (%s); choose "
                     "another --devices or --batch"
                     % (devices, "; ".join(why[:3] + (
                         ["%d more" % (len(why) - 3)] if len(why) > 3
                         else []))))
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
  for more in hardware_lib.larger_devices(
      hardware_lib.get_hardware(hardware).name, devices, 6):
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
