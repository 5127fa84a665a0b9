"""Auto's choice, priced: which candidate runs, without TensorFlow.

mtf_th.Auto (nn/strategies/auto.py) reads the mesh, layout, batch and
lengths of the layer being built and applies what choose() returns here:
every candidate that applies is priced with prices.predict (ring bytes
per device, the formulas tests/strategies/test_auto.py checks against mtf's
counters), then planner.price_layer (those bytes over the hardware's
network, plus the softmax a split strategy stops replicating; memory.py's
step memory for the whole model, when the live gin describes one) and
planner.pick run the fastest of those predicted to fit one device of the
hardware, or the smallest if none fits (Choice.note says so).
describe_choice writes the one line Auto logs.

Whether a candidate applies is the strategy's own check (its errors name
the dim and the mesh axis), so choose() takes it as a function.

Example (docs/sharding.md's: talking heads 24 x 32, batch 2, length 512,
d_model 768 on model:8; three candidates, all applying):
  dims = prices.named_dims(spec.make_spec("talking_heads", 24, 32, 32,
                                          heads_k=24, heads_v=24), 768)
  choose(("heads_parallel", "query_split", "batch_query_split"),
         lambda name: None, dims,
         prices.Layout("model:8", "heads_k:model;heads_v:model;"
                       "core_shard:model"), 2, 512, 768)
  == Choice("batch_query_split", 17899392.0, {"heads_parallel":
            187170816.0, "query_split": 23404416.0, "batch_query_split":
            17899392.0}, [planner.Priced, ...], None)
"""
import collections

from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import strategy_table

BYTES_PER_ELEMENT = 4  # ring bytes are priced in float32 elements


class Choice(collections.namedtuple("Choice", [
    "name", "predicted", "table", "priced", "note"])):
  """What choose() picked.

  Attributes:
    name: the strategy to run (a candidate's name).
    predicted: its ring bytes per device.
    table: {candidate: ring bytes per device, or the reason (a str) it does
      not apply}, in the candidates' order.
    priced: [planner.Priced] of the candidates that apply (None: only one
      applies, nothing to weigh).
    note: the line saying no candidate is predicted to fit, else None.
  """


def check_arguments(candidates, hardware):
  """Auto's arguments: known hardware (None: cpu), known candidates.

  Raises:
    ValueError: naming the bad one and the valid names.
  """
  if hardware is not None:
    # a bad name fails naming the valid ones
    hardware_lib.get_hardware(hardware)
  for c in candidates:
    if c not in strategy_table.ROWS:
      raise ValueError("candidates: unknown strategy %r; choose from %s"
                       % (c, ", ".join(strategy_table.NAMES)))
  if not candidates:
    raise ValueError("candidates must name at least one strategy")


def choose(candidates, check, dims, mesh, batch, length, d_model, dynamic=(),
           memory_length=None, mesh_axis="model", hardware="cpu", model=None,
           layer_class=None, kernel="einsum"):
  """The Choice of one attention layer.

  Args:
    candidates: strategy names (strategy_table.NAMES), in order of
      preference on ties.
    check: fn(name) that raises ValueError if the candidate cannot run on
      `mesh` (the strategy's own check, e.g. Strategy._check).
    dims: attention.AttentionDims or prices.NamedDims of the layer.
    mesh: a prices.Layout (mesh shape and layout rules, the split
      strategies' rule included).
    batch, length, d_model: the layer's sizes (n = m unless memory_length).
    dynamic: its dynamic terms.
    memory_length: m, if not the length (attention over the encoder output).
    mesh_axis: the split strategies' mesh axis.
    hardware: a hardware.py name.
    model: the whole model.Model being built (memory predicted), or None.
    layer_class: the layer's class name (planner.attention_of).
    kernel: the attention core's kernel of the run (memory.predict's:
      "fused" prices the fused core where it applies).
  Returns:
    a Choice.
  Raises:
    ValueError: if no candidate applies (the first one's reason).
  """
  table, first_error = {}, None
  for name in candidates:
    try:
      check(name)
    except ValueError as e:
      table[name] = str(e)
      first_error = first_error or e
      continue
    table[name] = BYTES_PER_ELEMENT * prices.predict(
        name, dims, mesh, batch, length, d_model, dynamic, mesh_axis,
        memory_length)
  priced = [n for n in candidates if not isinstance(table[n], str)]
  if not priced:
    raise first_error
  rings = {n: table[n] / BYTES_PER_ELEMENT for n in priced}
  if len(rings) == 1:
    return Choice(priced[0], table[priced[0]], table, None, None)
  batch_axis = mesh.axis_of(prices.BATCH)
  groups = mesh.axis_size(batch_axis) if batch_axis else 1
  p = mesh.axis_size(mesh_axis)
  axes = {n for n, _ in mesh.mesh_pairs}
  shape = rules = None
  if model is not None and axes <= {batch_axis, mesh_axis}:
    shape = "batch:%d,model:%d" % (groups, p)
    names = {batch_axis: "batch", mesh_axis: "model"}
    rules = ";".join("%s:%s" % (d, names[a]) for d, a in mesh.pairs
                     if a in names)
  else:
    model = None
  priced = planner.price_layer(
      rings, planner.attention_of(dims, dynamic, layer_class), d_model,
      length, memory_length or length, batch // groups, p, hardware,
      model=model, mesh_shape=shape, layout=rules, kernel=kernel)
  usable = planner.usable_bytes(hardware, groups * p)
  best, fits = planner.pick(priced, usable)
  note = None
  if not fits:
    note = (
        "mtf_th.Auto: no strategy is predicted to fit %s (%.2f GiB usable "
        "per device): running %s, the smallest (%.2f GiB per device); see "
        "mtf_th plan" % (hardware, usable / 2 ** 30, best.name,
                         best.memory / 2 ** 30))
  return Choice(best.name, table[best.name], table, priced, note)


def describe_choice(layer_name, mesh, batch, length, name, predicted, table,
                    memory_length=None):
  """The one line Auto logs: its pick, predicted bytes, the others'."""
  memory = ("" if memory_length in (None, length)
            else ", memory length %d" % memory_length)
  return ("mtf_th.Auto: %s on %s, batch %d, length %d%s: %s, %d bytes/device "
          "predicted (%s)" % (
              layer_name, mesh.mesh_shape_string, batch, length, memory, name,
              predicted, ", ".join(
                  "%s %s" % (n, "n/a" if isinstance(v, str) else int(v))
                  for n, v in table.items() if n != name)))


def log_line(layer_name, mesh, batch, length, choice, hardware,
             memory_length=None, with_memory=False):
  """describe_choice's line for a Choice, saying why when Auto did not
  pick the fewest bytes (with_memory: the model's memory was predicted)."""
  line = describe_choice(layer_name, mesh, batch, length, choice.name,
                         choice.predicted, choice.table, memory_length)
  if choice.predicted > min(v for v in choice.table.values()
                            if not isinstance(v, str)):
    line += "; the fastest predicted on %s%s" % (
        hardware, " that fits" if with_memory else "")
  return line
