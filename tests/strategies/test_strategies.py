"""Sharding strategies (nn/strategies): sharded == unsharded, clear errors.

1. Every strategy of strategies.STRATEGIES, for multi-head, talking heads
   (h_k != h), logits-only and dynamic projections, on model:2, model:4,
   model:8 and batch:2 x model:4 (batch_split_gathered: one model per mesh,
   each model's path once; batch_query_split: one model per mesh at a
   batch below the axis, BATCH_QUERY), against one unsharded reference per model
   built with HeadsParallel(ordered=False), i.e. attention.attention_core
   exactly as the paper lays it out: loss, logits, every gradient, and after
   one SGD step every weight, loss and logits.  A representative subset
   (each strategy, each mesh, each model at least once) runs in `make test-fast`;
   the full matrix is slow.  8-device meshes are built with
   comm.PointToPointMeshImpl (mtf's point-to-point all-to-all: the same mtf
   graph, half the build time); smaller ones with mtf's default ring.
   The code paths are the strategy's core for each model (which projections
   and dynamic terms it moves) and the mesh's collectives (mtf's ring on a
   1-D mesh, PointToPointMeshImpl on model:8, the ring on the 2-D
   batch:2 x model:4); model:2 and model:4 differ only in the split count.
   So each (model, strategy) runs on batch:2 x model:4 and on one 1-D mesh
   (ONE_D_MESH: each strategy meets model:2, model:4 and model:8, each
   model too), and gets the pre-flight alone (strategy.check accepts the
   layout; no graph) on the two other 1-D meshes.
2. The 768-heads, d_k = d_v = 1 model of the paper's BERT table, tiny (64
   heads, batch 1, length 16): QuerySplit on 8 logical CPUs trains with the
   losses of the unsharded model, step by step, with every n x m x heads
   slice 1/8 of the whole.
3. A strategy that cannot apply to a layout raises a ValueError naming the
   dim and the mesh axis: from check() (no graph) and, as a net, while the
   graph is built.
4. gin selects strategies (Auto is the default); greedy decoding
   (first_part + incremental) under BatchSplit, QuerySplit and
   GatheredBatchSplit on model:2 and batch:2 x model:4, and under
   BatchQuerySplit at batch 2 on batch:2 x model:4, equals the unsharded
   model's.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import numpy as np
import pytest

from mtf_talking_heads.estimate import prices
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies
from _equiv_util import relative_error
import _strategy_util as su

D_MODEL, VOCAB, BATCH, LENGTH = su.D_MODEL, su.VOCAB, su.BATCH, su.LENGTH
TOL = 2e-5  # max |sharded - unsharded| / max |unsharded|; the core is float32

MODELS = su.MODELS
MESHES = {
    "model2": "model:2",
    "model4": "model:4",
    "model8": "model:8",
    "batch2xmodel4": "batch:2;model:4",
}
# each split strategy at least once, and the batch x model mesh (the
# outer-dim path of a split); model:8 is covered by the 768-heads test below
# and the ordered heads-parallel core by every case (the reference is the
# paper's layout)
FAST = {
    "th-query_split-model4", "th-batch_split-batch2xmodel4",
    "mha-batch_split-model2", "dynamic-query_split_allgather-model2",
    "mha-batch_split_gathered-batch2xmodel4",
}


# strategies whose every path is one of the matrix's: run once per mesh,
# each model's path (dynamic R_X / R_M, P_l only, multi-head) at least once
ONCE_PER_MESH = {
    "batch_split_gathered": {"model2": "th", "model4": "logits",
                             "model8": "dynamic", "batch2xmodel4": "mha"},
    "batch_query_split": {},  # see BATCH_QUERY
}


# (model, strategy) -> the 1-D mesh it runs on (the other two: pre-flight);
# model:8 once per strategy and once per model (an 8-device graph costs
# about four 2-device ones to build)
ONE_D_MESH = {
    ("mha", "heads_parallel"): "model8", ("th", "heads_parallel"): "model2",
    ("logits", "heads_parallel"): "model4",
    ("dynamic", "heads_parallel"): "model2",
    ("mha", "query_split_allgather"): "model4",
    ("th", "query_split_allgather"): "model8",
    ("logits", "query_split_allgather"): "model2",
    ("dynamic", "query_split_allgather"): "model2",
    ("mha", "query_split"): "model4", ("th", "query_split"): "model4",
    ("logits", "query_split"): "model2", ("dynamic", "query_split"): "model8",
    ("mha", "batch_split"): "model2", ("th", "batch_split"): "model2",
    ("logits", "batch_split"): "model8", ("dynamic", "batch_split"): "model4",
}


def _matrix():
  """Every (model, strategy, mesh) and whether it runs (else pre-flight)."""
  for model in MODELS:
    for strategy in strategies.STRATEGIES:
      for mesh in MESHES:
        once = ONCE_PER_MESH.get(strategy)
        if once is not None and once.get(mesh) != model:
          continue
        yield (model, strategy, mesh), (
            once is not None or mesh == "batch2xmodel4" or
            ONE_D_MESH[model, strategy] == mesh)


def _cases(runs=True):
  return su.matrix_cases(_matrix(), FAST, runs)


def _run(run):
  """Forward + gradients, one SGD step, then weights, loss and logits.

  Three session runs (each new set of fetches costs seconds of graph
  optimisation over 8 devices).
  """
  names = ["loss", "logits"] + ["grad:" + n for n in sorted(run.grads)]
  out = run.fetch(names)
  run.step()
  after = run.session.run(dict(run.variables, **run.outputs))
  out.update({"after:" + k: v for k, v in after.items()})
  return out


@pytest.fixture(scope="module")
def references():
  cache = {}

  def get(model, batch=BATCH):
    if (model, batch) not in cache:
      run = harness.Harness(
          [su.make_layer(model, strategies.HeadsParallel(ordered=False))],
          d_model=D_MODEL, vocab=VOCAB, batch=batch, length=LENGTH,
          optimizer_step=True, config=su.session_config())
      initial = run.variable_values()
      cache[model, batch] = (initial, _run(run))
      run.close()
    return cache[model, batch]
  return get


@pytest.mark.parametrize("model, strategy_name, mesh", _cases())
def test_sharded_equals_unsharded(references, model, strategy_name, mesh):
  _check_sharded(references, model, strategy_name, mesh, BATCH)


@pytest.mark.parametrize("model, strategy_name, mesh", _cases(runs=False))
def test_preflight_accepts_the_other_1d_meshes(model, strategy_name, mesh):
  """The strategy's core of the ONE_D_MESH run, on another 1-D mesh (whose
  collectives other models' runs cover): the strategy's check() (what comm,
  Auto and train's pre-flight call) accepts it without a graph."""
  assert ONE_D_MESH[model, strategy_name] != mesh != "batch2xmodel4"
  _checked(model, strategy_name, mesh, BATCH)


# BatchQuerySplit with a batch per group below the axis: (model, mesh,
# batch) -> (p_b, p_q); each path once per mesh (at batch 8 it is BatchSplit)
BATCH_QUERY = {
    ("logits", "model2", 1): (1, 2),
    ("th", "model4", 2): (2, 2),
    ("dynamic", "model8", 4): (4, 2),
    ("mha", "batch2xmodel4", 4): (2, 2),
}


@pytest.mark.parametrize(
    "model, mesh, batch", sorted(BATCH_QUERY),
    ids=["%s-batch_query_split-%s-b%d" % k for k in sorted(BATCH_QUERY)])
def test_sharded_equals_unsharded_batch_query_split(references, model, mesh,
                                                   batch):
  mesh_shape = MESHES[mesh]
  assert prices.batch_query_factors(
      strategies.MeshLayout(mesh_shape, "batch:batch"), "model",
      batch) == BATCH_QUERY[model, mesh, batch]
  _check_sharded(references, model, "batch_query_split", mesh, batch)


def _checked(model, strategy_name, mesh, batch):
  """(strategy, layer, layout) for a case, which strategy.check accepts."""
  mesh_shape = MESHES[mesh]
  strategy = strategies.make_strategy(strategy_name)
  layer = su.make_layer(model, strategy)
  layout = su.layout_for(layer, mesh_shape, strategy)
  strategy.check(layer.dims, mesh_shape, layout, batch, LENGTH)
  return strategy, layer, layout


def _check_sharded(references, model, strategy_name, mesh, batch):
  """Loss, logits, gradients and one SGD step equal the unsharded model's."""
  mesh_shape = MESHES[mesh]
  strategy, layer, layout = _checked(model, strategy_name, mesh, batch)
  initial, want = references(model, batch)

  run = harness.Harness([layer], d_model=D_MODEL, vocab=VOCAB, batch=batch,
                        length=LENGTH, mesh_shape=mesh_shape, layout=layout,
                        optimizer_step=True, config=su.session_config(),
                        mesh_impl_cls=su.impl_cls(mesh_shape))
  try:
    assert sorted(run.variables) == sorted(initial)
    run.assign(initial)
    got = _run(run)
    summary = comm.summarize_counters(run.lowering.counters, mesh_shape)
    max_slice, max_size = comm.core_activation_slices(run.lowering,
                                                      layer.dims)
  finally:
    run.close()

  errors = {k: relative_error(got[k], want[k]) for k in want}
  bad = {k: e for k, e in errors.items() if not e <= TOL}
  assert not bad, "sharded differs from unsharded: %s" % bad
  assert any(relative_error(want["after:" + k], v) > 1e-4
             for k, v in initial.items())  # the step changed the weights
  if strategy_name != "heads_parallel":
    # the core really moved: heads-split -> S-split all-to-alls, and every
    # n x m x heads slice is 1/P of the whole
    assert summary["alltoall"] > 0
    assert max_slice * strategies.MeshLayout(
        mesh_shape, "").mesh_shape.size == max_size


# ----------------------------------------------- 768 heads, d_k = d_v = 1
def test_768_heads_tiny_trains_query_split_on_8_devices():
  """The BERT row's shape (h >> d_k = d_v = 1), small: 64 heads, batch 1."""
  def make(strategy):
    layer = layers.TalkingHeadsAttention(heads_k=64, heads=64, heads_v=64,
                                         d_k=1, d_v=1, strategy=strategy)
    layer.set_name("attention")
    return layer
  kwargs = dict(d_model=16, vocab=VOCAB, batch=1, length=16,
                optimizer_step=True, learning_rate=0.5,
                config=su.session_config())
  ref = harness.Harness([make(strategies.HeadsParallel(ordered=False))],
                        **kwargs)
  layer = make(strategies.QuerySplit())
  layout = "heads_k:model;heads_v:model;core_shard:model"
  run = harness.Harness([layer], mesh_shape="model:8", layout=layout,
                        mesh_impl_cls=su.impl_cls("model:8"), **kwargs)
  try:
    run.assign(ref.variable_values())
    want, got = [], []
    for _ in range(3):
      want.append(ref.fetch(["loss"])["loss"])
      got.append(run.fetch(["loss"])["loss"])
      ref.step()
      run.step()
    max_slice, max_size = comm.core_activation_slices(run.lowering,
                                                      layer.dims)
  finally:
    ref.close()
    run.close()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert want[-1] < want[0] - 0.05  # it trains
  assert max_size == 1 * 16 * 16 * 64 and max_slice * 8 == max_size


# ------------------------------------------------------------- errors
TH = attention.make_dims(8, 8, 8, 2, 2)
MHA = attention.make_dims(("heads", 8), ("heads", 8), ("heads", 8), 2, 2)
TH_LAYOUT = "heads_k:model;heads_v:model;core_shard:model"


@pytest.mark.parametrize("strategy, dims, mesh_shape, layout, batch, length, "
                         "words", [
    pytest.param(strategies.QuerySplit(), TH, "model:8", TH_LAYOUT, 8, 12,
                 ["'length'", "'model'", "12"], id="query_split-length"),
    pytest.param(strategies.BatchSplit(), TH, "model:8", TH_LAYOUT, 4, 8,
                 ["'batch'", "'model'", "4"], id="batch_split-batch"),
    pytest.param(strategies.BatchSplit(), TH, "batch:2;model:4",
                 "batch:batch;" + TH_LAYOUT, 4, 8,
                 ["'batch'", "'model'", "'batch' (size 2)"],
                 id="batch_split-batch-within-batch-axis"),
    pytest.param(strategies.QuerySplit(), TH, "model:8",
                 "heads_k:model;heads_v:model", 8, 8,
                 ["'core_shard'", "'model'", "core_shard:model"],
                 id="missing-shard-rule"),
    pytest.param(strategies.QuerySplit(), TH, "batch:8",
                 "core_shard:batch", 8, 8, ["'model'", "batch:8"],
                 id="mesh-lacks-axis"),
    pytest.param(strategies.QuerySplit(), TH, "model:8",
                 TH_LAYOUT + ";length:model", 8, 8, ["'length'", "'model'"],
                 id="split-dim-on-axis"),
    pytest.param(strategies.BatchSplit(), MHA, "batch:2;model:4",
                 "heads:batch;core_shard:model", 8, 8,
                 ["'heads'", "'batch'"], id="heads-on-other-axis"),
    pytest.param(strategies.HeadsParallel(), TH, "model:8",
                 "heads_k:model;heads:model", 8, 8,
                 ["'heads_k'", "'heads'", "'model'", "P_l"],
                 id="heads_parallel-obstacle-1"),
    pytest.param(strategies.HeadsParallel(), MHA, "model:3", "heads:model", 8,
                 8, ["'heads'", "'model'", "size 3"],
                 id="heads_parallel-indivisible-heads"),
])
def test_check_names_dim_and_axis(strategy, dims, mesh_shape, layout, batch,
                                  length, words):
  with pytest.raises(ValueError) as e:
    strategy.check(dims, mesh_shape, layout, batch, length)
  for word in words:
    assert word in str(e.value), (word, str(e.value))


def test_measure_fails_before_building_a_graph(monkeypatch):
  def no_graph(*args, **kwargs):
    raise AssertionError("a graph was built")
  monkeypatch.setattr(harness, "Harness", no_graph)
  config = comm.make_config("talking_heads", 8, 2, 2, D_MODEL, 12, BATCH)
  with pytest.raises(ValueError, match="'length'.*'model'"):
    comm.measure(config, "query_split", "model:8")


def test_graph_build_fails_on_a_layout_the_strategy_cannot_serve():
  """Without check(): the strategy reads the layout from the model."""
  layer = su.make_layer("th", strategies.QuerySplit())
  with pytest.raises(ValueError, match="'length'.*'model'"):
    harness.Harness([layer], d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
                    length=12, mesh_shape="model:8", layout=TH_LAYOUT,
                    run=False)
  with pytest.raises(ValueError, match="layout="):
    # no layout given to the model at all
    strategies.QuerySplit().core(
        context=type("C", (), {"model": None})(), dims=TH,
        q=_FakeTensor(["batch", "length"]), k=None, v=None,
        memory_length=None, p_l=None, p_w=None, dynamic_l=[], dynamic_w=[],
        bias=None, dropout_fn=None)


class _FakeTensor(object):
  """Just enough of an mtf.Tensor for core() to look for its split dim."""

  def __init__(self, names):
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    self.shape = mtf.Shape([mtf.Dimension(n, 8) for n in names])


def test_strategies_are_selected_by_gin():
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.parse_config(
        "strategy_test/mtf_th.TalkingHeadsAttention.strategy = "
        "@mtf_th.QuerySplit()\n"
        "strategy_test/mtf_th.QuerySplit.reduce_scatter = False\n"
        "strategy_test/mtf_th.MultiHeadAttention.strategy = "
        "@mtf_th.BatchSplit()\n")
  with gin.config_scope("strategy_test"):
    th = layers.TalkingHeadsAttention()
    mha = layers.MultiHeadAttention()
  assert isinstance(th.strategy, strategies.QuerySplit)
  assert th.strategy.name == "query_split_allgather"
  assert isinstance(mha.strategy, strategies.BatchSplit)
  assert mha.strategy.layout_rules() == [("core_shard", "model")]
  assert isinstance(layers.TalkingHeadsAttention().strategy,
                    strategies.Auto)  # outside the scope: the default


def _greedy_decode(strategy, mesh_shape, layout, values=None):
  """Greedy decoding (first_part + incremental) of a two-layer model.

  Two layers, so that first_part's core runs (see su.GreedyDecode).
  """
  stack = [su.make_layer("th", strategy) for _ in range(2)]
  for i, layer in enumerate(stack):
    layer.set_name("attention_%d" % i)
  return su.GreedyDecode(stack, mesh_shape, layout,
                         su.impl_cls(mesh_shape)).run(values)


@pytest.fixture(scope="module")
def unsharded_decode():
  """(decoded ids, weights) of the unsharded talking-heads model."""
  return _greedy_decode(strategies.HeadsParallel(ordered=False), "", "")


@pytest.mark.parametrize("mesh_shape, layout", [
    pytest.param("model:2", TH_LAYOUT, id="model2"),
    pytest.param("batch:2;model:4", "batch:batch;" + TH_LAYOUT,
                 id="batch2xmodel4"),
])
def test_greedy_decoding_under_split_strategies_equals_unsharded(
    unsharded_decode, mesh_shape, layout):
  """first_part (split core) and incremental steps (QuerySplit falls back to
  heads-parallel, BatchSplit stays split, GatheredBatchSplit runs as
  BatchSplit: its caches are the layer's heads-split K, V) decode as the
  unsharded model.  (tests/nn/test_decode.py checks that the unsharded model's
  decoding is its teacher-forced argmax.)

  On batch:2 x model:4 BatchSplit's first_part slices are 6-D (batch,
  core_shard, batch_per_shard, heads, n, m), as in training.
  """
  want, values = unsharded_decode
  for strategy in (strategies.BatchSplit(), strategies.QuerySplit(),
                   strategies.GatheredBatchSplit()):
    got, _ = _greedy_decode(strategy, mesh_shape, layout, values)
    np.testing.assert_array_equal(got, want)


def test_greedy_decoding_under_batch_query_split_equals_unsharded():
  """Batch 2 on batch:2 x model:4: first_part's core is split 1 x 4 over
  (batch, query) per batch group, incremental steps run heads-parallel."""
  stack = lambda s: [su.make_layer("th", s) for _ in range(2)]  # noqa: E731
  decoded = []
  for strategy, mesh_shape, layout in [
      (strategies.HeadsParallel(ordered=False), "", ""),
      (strategies.BatchQuerySplit(), "batch:2;model:4",
       "batch:batch;" + TH_LAYOUT)]:
    layers_ = stack(strategy)
    for i, layer in enumerate(layers_):
      layer.set_name("attention_%d" % i)
    decode = su.GreedyDecode(layers_, mesh_shape, layout,
                             su.impl_cls(mesh_shape), batch=2)
    decoded.append(decode.run(decoded[0][1] if decoded else None))
  np.testing.assert_array_equal(decoded[1][0], decoded[0][0])

