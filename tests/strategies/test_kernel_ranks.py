"""No op of an attention core gets a tensor TF's CPU kernels refuse.

TF 2.15's oneDNN kernels (the default on recent Intel CPUs; anywhere on x86
with TF_ENABLE_ONEDNN_OPTS=1) limit the rank of some ops: Softmax takes at
most 5 dims ("Input dims must be <= 5 and >=1", an AbortedError when the
graph runs, which TF's Estimator retries forever).  The split strategies add
dims to the n x m x heads slices: BatchSplit on batch:2;model:4 cuts the
batch into [batch, core_shard, batch_per_shard], so L is 6-D.

Here the graphs are only built and lowered (no session, so oneDNN need not
be on): training (forward and backward, harness.Harness) and greedy decoding
(mtf's first_part and incremental modes, _strategy_util.GreedyDecode) of
multi-head and talking-heads layers under HeadsParallel, QuerySplit,
BatchSplit, GatheredBatchSplit (training only: it decodes as BatchSplit)
and BatchQuerySplit (training, talking heads, batch:2;model:4) on
batch:2;model:4 and model:8, and the static rank of every
input of every rank-limited op is checked, in the while loop's body too.
RANK_LIMITS lists the op types that failed under oneDNN on TF 2.15.1 when
probed once with inputs of 6 to 8 dims; BatchMatMulV2, Einsum, Transpose,
Reshape, broadcasting Add/Sub/Mul/RealDiv/Maximum, AddN, Sum, Max, Exp,
Rsqrt, Square, SquaredDifference, Relu, Tanh, LogSoftmax, Cast, ConcatV2
and StridedSlice all ran.  tests/strategies/test_onednn.py (part of `make test`) runs the
split strategies' tests themselves with TF_ENABLE_ONEDNN_OPTS=1 (its
SELECT).
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import pytest

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import strategies
import _strategy_util as su

RANK_LIMITS = {"Softmax": 5}  # op type: most dims a oneDNN kernel accepts


@pytest.fixture(scope="module", autouse=True)
def einsum_core():
  """The ranks checked are the einsum core's ops: the einsum core's (mtf_th.core_kernel.kind = "einsum"; the fused
  core's are tests/strategies/test_fused_core.py's)."""
  with su.core_kernel("einsum"):
    yield

# Every named strategy but query_split_allgather (QuerySplit's kernels, only
# its collectives differ).
STRATEGIES = {name: make for name, make in strategies.STRATEGIES.items()
              if name != "query_split_allgather"}
MESHES = {"batch2xmodel4": "batch:2;model:4", "model8": "model:8"}


def _train_graph(layer, mesh_shape, layout):
  """Forward and backward of a one-layer model, lowered."""
  return harness.Harness(
      [layer], d_model=su.D_MODEL, vocab=su.VOCAB, batch=su.BATCH,
      length=su.LENGTH, mesh_shape=mesh_shape, layout=layout, run=False,
      mesh_impl_cls=su.impl_cls(mesh_shape)).graph


def _decode_graph(layer, mesh_shape, layout):
  """Greedy decoding (first_part + incremental) of a one-layer model."""
  return su.GreedyDecode([layer], mesh_shape, layout,
                         su.impl_cls(mesh_shape)).graph


# graph builder, and how many parts (outside a while loop, inside one) hold
# the core's ops: decoding has first_part outside, incremental inside
GRAPHS = {"train": (_train_graph, 1), "decode": (_decode_graph, 2)}


def ops_by_part(graph, in_loop=False):
  """(ops outside any while loop, ops inside one) of graph, nested.

  With control flow v2 (TF 2's default) a loop's body is a function graph
  of its own; with v1 (what `mtf_th train` selects by
  tf.disable_v2_behavior(), so any test that ran its main in this process
  leaves it on) the body's ops stay in the graph, in a while context.
  """
  outside, inside = [], []
  for op in graph.get_operations():
    looped = in_loop or op._control_flow_context is not None  # pylint: disable=protected-access
    (inside if looped else outside).append(op)
  for function in graph._functions.values():  # pylint: disable=protected-access
    _, body = ops_by_part(function.graph, in_loop=True)
    inside.extend(body)
  return outside, inside


def limited_inputs(ops):
  """(op name, op type, rank) of every input of a rank-limited op."""
  return [(op.name, op.type, x.shape.rank)
          for op in ops if op.type in RANK_LIMITS for x in op.inputs]


def _cases():
  """Every model x strategy x mesh x graph; in `make test-fast` the split
  strategies on batch:2 x model:4 (their cores have the most dims)."""
  cases = []
  for model in ("mha", "th"):
    for strategy in STRATEGIES:
      for mesh in MESHES:
        for graph in GRAPHS:
          if strategy == "batch_split_gathered" and graph == "decode":
            continue  # decodes as batch_split (its caches are heads-split)
          if strategy == "batch_query_split" and (
              model, mesh, graph) != ("th", "batch2xmodel4", "train"):
            continue  # one path: the core's dims are batch_split's
          fast = strategy != "heads_parallel" and mesh == "batch2xmodel4"
          cases.append(pytest.param(
              model, strategy, mesh, graph,
              id="%s-%s-%s-%s" % (model, strategy, mesh, graph),
              marks=() if fast else (pytest.mark.slow,)))
  return cases


@pytest.mark.parametrize("model, strategy_name, mesh, graph", _cases())
def test_no_rank_limited_op_gets_too_many_dims(model, strategy_name, mesh,
                                               graph):
  strategy = STRATEGIES[strategy_name]()
  layer = su.make_layer(model, strategy)
  mesh_shape = MESHES[mesh]
  layout = su.layout_for(layer, mesh_shape, strategy)
  build, parts = GRAPHS[graph]
  seen = [limited_inputs(ops)
          for ops in ops_by_part(build(layer, mesh_shape, layout))]
  assert len([s for s in seen if s]) == parts, "a core's softmax is missing"
  bad = [(name, rank) for inputs in seen for name, op_type, rank in inputs
         if rank is None or rank > RANK_LIMITS[op_type]]
  assert not bad, "%d inputs beyond the oneDNN rank limit, e.g. %s" % (
      len(bad), bad[:2])
