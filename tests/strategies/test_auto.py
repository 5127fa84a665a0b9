"""strategies.Auto: it picks the strategy that mtf's counters say is cheapest.

For each point of a grid of meshes x batches (tiny layers: talking heads
h_k = h_v = 8, h = 4, multi-head 4 heads; d_k = 2, d_v = 3, d_model 8,
length 8) every strategy that applies is lowered in `mtf_th comm`'s unit
(comm.measure) and

  1. Auto's pick has the fewest measured ring bytes per device;
  2. measured minus predicted (prices.ring_elements, what Auto
     ranks by) is one constant per grid point: the formulas price every
     strategy's own traffic exactly, and leave out only what all of them
     send alike (data-parallel gradients of the rest of the model);
  3. a model built with Auto runs the strategy it logged (comm.measure with
     "auto" lowers the real layer, whose counters equal the pick's).

Plus: Auto is every attention layer's default strategy and gin-selectable,
a mesh without its axis (or a layout without core_shard) leaves it
heads-parallel, and `mtf_th comm --strategy auto` prints the choice and the
predictions.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import re

import gin
import numpy as np
import pytest

from mtf_talking_heads import training
from mtf_talking_heads.commands import comm as comm_command
from mtf_talking_heads.estimate import auto_pricing
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import strategy_table
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import live_gin
from mtf_talking_heads.nn import strategies
import _strategy_util as su

DIMS = dict(d_k=2, d_v=3, d_model=8, length=8)
HEADS = {"talking_heads": dict(heads_k=8, heads=4, heads_v=8),
         "multi_head": dict(heads=4)}
# (variant, mesh, batch) -> what Auto must pick (the measured cheapest)
GRID = {
    ("talking_heads", "model:2", 8): "batch_split_gathered",
    ("talking_heads", "model:8", 2): "batch_query_split",
    ("talking_heads", "batch:2;model:4", 8): "batch_split_gathered",
    ("multi_head", "model:4", 2): "heads_parallel",
    ("multi_head", "model:2", 8): "batch_split_gathered",
}


def _config(variant, batch):
  return comm.make_config(variant, batch=batch, **dict(DIMS,
                                                       **HEADS[variant]))


@pytest.mark.parametrize("variant, mesh, batch", sorted(GRID),
                         ids=["%s-%s-b%d" % k for k in sorted(GRID)])
def test_auto_picks_the_measured_cheapest(variant, mesh, batch):
  config = _config(variant, batch)
  # the layer built with Auto runs its pick: its counters are the pick's
  auto = comm.measure(config, "auto", mesh)
  picked = auto["strategy"].split(":")[1]
  assert picked == GRID[variant, mesh, batch]
  measured = {picked: auto["ring_bytes_per_device"]}
  work = {picked: (auto["einsum"], auto["einsum_unique"])}
  for name in strategies.STRATEGIES:
    if name == picked:
      continue
    try:
      result = comm.measure(config, name, mesh)
    except ValueError:
      continue  # does not apply (Auto's table says why)
    measured[name] = result["ring_bytes_per_device"]
    work[name] = (result["einsum"], result["einsum_unique"])
  assert measured[picked] == min(measured.values()), measured
  # every strategy does the same einsum work (total and unique) to 1% (the
  # query splits' masks and broadcasts add 0.1-0.8%), so ranking by time
  # (bytes / bandwidth + work) ranks as bytes do unless two strategies'
  # bytes are that close
  base = work["heads_parallel"]
  for name, (total, unique) in work.items():
    assert abs(total / base[0] - 1) < 0.01, (name, work)
    assert abs(unique / base[1] - 1) < 0.01, (name, work)
  offsets = {measured[name] - round(comm.predict(config, name, mesh))
             for name in measured}
  assert len(offsets) == 1, (offsets, measured)


def test_auto_is_the_default_and_gin_selectable():
  assert isinstance(layers.TalkingHeadsAttention().strategy, strategies.Auto)
  assert isinstance(layers.MultiHeadEncoderAttention().strategy,
                    strategies.Auto)
  with gin.unlock_config():
    gin.parse_config(
        "auto_test/mtf_th.TalkingHeadsAttention.strategy = @mtf_th.Auto()\n"
        "auto_test/mtf_th.Auto.candidates = ['heads_parallel', "
        "'query_split']\n")
  with gin.config_scope("auto_test"):
    layer = layers.TalkingHeadsAttention()
  assert layer.strategy.candidates == ("heads_parallel", "query_split")
  assert layer.strategy.layout_rules() == [("core_shard", "model")]


def test_auto_without_its_axis_or_rule_stays_heads_parallel():
  dims = layers.TalkingHeadsAttention(heads_k=4, heads=8, heads_v=4).dims
  auto = strategies.Auto()
  for mesh_shape, layout, add_rule in [
      ("batch:8", "batch:batch;core_shard:model", True),
      # a layout Auto may not add to (not an mtf.LayoutRules of the model)
      ("model:4", "heads_k:model;heads_v:model", False),
      # gin/mtf_th.gin's defaults (the demo's one-device mesh), with the rule
      ("model:1", "batch:batch;d_ff:model;heads:model;vocab:model;"
       "core_shard:model", True)]:
    chosen, predicted, table = auto.choose(
        dims, strategies.MeshLayout(mesh_shape, layout), 8, 8, 8,
        add_rule=add_rule)
    assert chosen.name == "heads_parallel", table
    if mesh_shape == "model:4":
      assert "core_shard:model" in table["batch_split_gathered"]
    else:
      assert predicted == 0  # ties go to the first candidate


def test_auto_prices_with_its_rule_added():
  dims = layers.TalkingHeadsAttention(heads_k=4, heads=8, heads_v=4).dims
  auto = strategies.Auto()
  plain = strategies.MeshLayout("model:4", "heads_k:model;heads_v:model")
  ruled = strategies.MeshLayout("model:4",
                              "heads_k:model;heads_v:model;core_shard:model")
  assert auto.with_rule(plain).rules._pairs == ruled.rules._pairs  # pylint: disable=protected-access
  assert auto.with_rule(ruled) is ruled
  # core_shard already on another axis: left as the user wrote it
  other = strategies.MeshLayout("batch:2;model:2", "core_shard:batch")
  assert auto.with_rule(other) is other
  assert (auto.choose(dims, plain, 8, 8, 8)[2] ==
          auto.choose(dims, ruled, 8, 8, 8)[2])


def test_auto_adds_its_rule_to_the_model_layout_and_matches_one_device():
  """Built on model:2 with a layout that lacks core_shard, Auto picks
  batch_split_gathered, adds core_shard:model to the model's LayoutRules
  (the object the mesh lowers with) and computes what one device does."""
  def layer(strategy):
    return layers.TalkingHeadsAttention(heads_k=4, heads=2, heads_v=4, d_k=2,
                                        d_v=2, strategy=strategy)
  auto = strategies.Auto()
  kwargs = dict(d_model=8, vocab=16, batch=8, length=8,
                config=su.session_config())
  split_layer = layer(auto)
  sharded = harness.Harness([split_layer], mesh_shape="model:2",
                            layout="heads_k:model;heads_v:model", **kwargs)
  one = harness.Harness([layer(strategies.HeadsParallel(ordered=False))],
                        **kwargs)
  try:
    assert auto.picked == "batch_split_gathered"
    assert ("core_shard", "model") in sharded.model.layout._pairs  # pylint: disable=protected-access
    # lowered with the rule: each device holds half of every core tensor
    largest, whole = comm.core_activation_slices(sharded.lowering,
                                                 split_layer.dims)
    assert whole and largest * 2 == whole, (largest, whole)
    one.assign(sharded.variable_values())
    names = ["loss"] + ["grad:" + n for n in sharded.grads]
    got, want = sharded.fetch(names), one.fetch(names)
    for name in names:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                                 err_msg=name)
  finally:
    sharded.close()
    one.close()


def test_auto_refuses_bad_candidates():
  with pytest.raises(ValueError, match="candidates.*'no_such'"):
    strategies.Auto(candidates=("no_such",))
  with pytest.raises(ValueError, match="candidates"):
    strategies.Auto(candidates=())


def test_cli_auto_prints_choice_and_predictions(capsys):
  rc = comm_command.main(
      ["--variant", "talking_heads", "--heads_k", "8", "--heads", "4",
       "--heads_v", "8", "--d_k", "2", "--d_v", "3", "--d_model", "8",
       "--length", "8", "--batch", "2", "--mesh_shape", "model:8",
       "--strategy", "auto"])
  captured = capsys.readouterr()
  assert rc == 0
  rows = captured.out.splitlines()
  assert rows[1].split(",")[1] == "auto:batch_query_split"
  err = captured.err
  assert "batch_split_gathered does not apply" in err and "'batch'" in err
  assert "query_split predicts" in err
  assert "auto picks batch_query_split" in err


def test_log_line_names_a_different_memory_length():
  mesh = strategies.MeshLayout("model:2", "core_shard:model")
  table = {"heads_parallel": 8.0, "batch_split": "n/a reason"}
  line = auto_pricing.describe_choice("TalkingHeadsEncoderAttention", mesh,
                                      8, 14, "heads_parallel", 8.0, table, 64)
  assert line == ("mtf_th.Auto: TalkingHeadsEncoderAttention on model:2, "
                  "batch 8, length 14, memory length 64: heads_parallel, 8 "
                  "bytes/device predicted (batch_split n/a)")
  assert "memory length" not in auto_pricing.describe_choice(
      "TalkingHeadsAttention", mesh, 8, 14, "heads_parallel", 8.0, table, 14)


def _project_logits(heads, d_k, mesh_shape, hardware):
  auto = strategies.Auto(hardware=hardware)
  layer = layers.ProjectLogitsAttention(heads_k=heads, heads=heads, d_k=d_k,
                                        d_v=d_k, strategy=auto)
  mesh = strategies.MeshLayout(mesh_shape, comm.full_layout(
      comm.default_layout(layer, mesh_shape), auto.layout_rules()))
  return auto, layer, mesh


def test_auto_picks_by_time_then_memory_as_the_planner_does():
  """tests/estimate/test_plan.py's chooser cases, through Auto.choose (its own
  applicability checks and bytes): time beats bytes; memory beats time."""
  auto, layer, mesh = _project_logits(4, 64, "model:4", "tpu_v3")
  chosen, _, table = auto.choose(layer.dims, mesh, 2, 64, 256,
                                 layer_class="ProjectLogitsAttention")
  fewest = min((v, n) for n, v in table.items() if not isinstance(v, str))
  assert (fewest[1], chosen.name) == ("heads_parallel", "batch_query_split")
  auto, layer, mesh = _project_logits(24, 64, "model:8", "tpu_v2")
  att = planner.attention_of(layer.dims)
  for layers_, picked, note in [(25, "batch_query_split", None),
                                (60, "batch_query_split", "smallest")]:
    model = model_lib.make_model("lm", layers_, 768, 3072, 32128, 2, 2048,
                                 2048, dec_self=att, relative_bias=False)
    chosen, _, _ = auto.choose(layer.dims, mesh, 2, 2048, 768, model=model)
    assert chosen.name == picked
    if note is None:  # query_split is faster but does not fit
      assert auto.note is None
    else:
      assert re.fullmatch(
          r"mtf_th\.Auto: no strategy is predicted to fit tpu_v2 \(7\.20 "
          r"GiB usable per device\): running batch_query_split, the "
          r"smallest \(\d+\.\d\d GiB per device\); see mtf_th plan",
          auto.note), auto.note
  with pytest.raises(ValueError, match="tpu_v9"):
    strategies.Auto(hardware="tpu_v9")


def test_auto_prices_memory_with_the_core_kernel_the_run_builds(monkeypatch):
  """Auto.kernel(): "fused" on CPU where mtf_th.core_kernel.kind lets the
  fused op run (it loads here), "einsum" when the gin says so or on a TPU;
  its choice's memory is priced with it (tests/estimate/test_plan.py; two
  threads, whatever this machine has)."""
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import core_kernel  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, "cpu_threads", lambda: 2)
  assert core_kernel.load()[0] is not None
  for kind, hardware, expected in [("auto", None, "fused"),
                                   ("fused", None, "fused"),
                                   ("einsum", None, "einsum"),
                                   ("auto", "tpu_v3", "einsum")]:
    with core_kernel.bound(kind):
      assert strategies.Auto(hardware=hardware).kernel() == expected, kind
  auto, layer, mesh = _project_logits(8, 32, "model:2", "cpu")
  att = planner.attention_of(layer.dims)
  model = model_lib.make_model("lm", 2, 256, 1024, 512, 4, 1024, 1024,
                               dec_self=att, relative_bias=False)
  priced = {}
  for kind in ("einsum", "auto"):
    with core_kernel.bound(kind):
      auto.choose(layer.dims, mesh, 4, 1024, 256, model=model)
    priced[kind] = {c.name: c.memory for c in auto.priced}
  assert priced["auto"]["batch_split"] < priced["einsum"]["batch_split"]


def test_auto_reads_the_model_from_the_parsed_gin_files():
  files = ["experiments/t5_heads/07_talking_heads_24_32.gin",
           "models/t5_tiny.gin"]
  training.parse_gin(files, ["batch_size = 4"])
  try:
    assert live_gin.model_from_live_gin(32128) == model_lib.model_from_gin(
        files, ["batch_size = 4"])
    assert live_gin.model_from_live_gin(32128, batch=2).batch == 2
    # Auto uses it only for a layer of that model
    model = live_gin.model_from_live_gin(32128)
    att, d, n = model.enc_self, model.d_model, model.inputs_length
    assert live_gin.model_for_layer(32128, 4, att, d, n) == model
    assert live_gin.model_for_layer(32128, 4, att, d + 1, n) is None
    assert live_gin.model_for_layer(32128, 4, att._replace(heads=3), d,
                                    n) is None
  finally:  # training.parse_gin cleared mtf's defaults: as conftest does
    with gin.unlock_config():
      gin.clear_config()
    harness.parse_mtf_defaults.done = False
  assert live_gin.model_from_live_gin(32128) is None  # nothing parsed


def test_each_registered_strategy_answers_to_its_table_name():
  assert tuple(strategies.STRATEGIES) == strategy_table.NAMES
  for name, make in strategies.STRATEGIES.items():
    assert make().name == name
    assert type(make()).__name__ == strategy_table.ROWS[name].gin_class
  assert strategies.make_strategy("auto").name == strategy_table.AUTO
