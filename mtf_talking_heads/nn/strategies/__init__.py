"""Sharding strategies for the n x m x heads core of the attention layers.

A strategy decides where an attention layer's tensors live; the layer
computes them.  The layer calls its strategy once per call and the strategy
never calls the layer back: the layer (layers.AttentionLayer.call) tells its
strategy what it is about to compute in an ``AttentionCall`` (its dims,
dynamic terms, context, X and the encoder output M), and
``strategy.frame(call)`` returns a ``Frame``: where the layer runs its
projections (``gather_weights``, ``to_core`` for X, M and the bias,
``from_core`` for Y), the heads dims they carry (``dims``) and the ``core``
the layer calls with Q, K, V (J, L, W, U, O; see attention.attention_core).
The default Frame keeps Q, K, V and Y as the layout lays them out, and the
strategy moves only the core (``strategy.core(...)``); GatheredBatchSplit's
moves the whole layer; Auto returns the frame of the strategy it picks.  A
strategy may rename dims (each rename is an mtf reshape: free, an all-gather
or an all-to-all, depending on the layout) as long as the result equals the
unsharded one.

Select one per layer class with gin, and add the rules it names
(``strategy.layout_rules()``) to the layout::

  mtf_th.TalkingHeadsAttention.strategy = @mtf_th.BatchSplit()
  layout = "heads_k:model;heads_v:model;core_shard:model"

Strategies (docs/sharding.md derives what each moves, per device, under ring
costs; P = size of the mesh axis, S = elements of one tensor):

  HeadsParallel   the core keeps the layer's heads dims as laid out.  With
                  heads_k and heads_v split, L = J P_l and dW = dU P_w^T
                  all-reduce whole n x m x h tensors: 2 (P-1)/P b n m h each.
  QuerySplit      Q goes heads-split -> query-split (all-to-all), K and V are
                  gathered (all-gather; with reduce_scatter=True written as
                  broadcast + all-to-all so that their gradients are
                  all-to-all + local sum, i.e. reduce-scatters), O goes back.
                  Needs length % P == 0.  Every n x m x heads slice is 1/P.
  BatchSplit      Q, K, V go heads-split -> batch-split (all-to-all), O goes
                  back: 4 all-to-alls, (P-1)/P^2 b n h d_k per device each,
                  forward and backward.  Needs batch % P == 0 (per group of
                  the other mesh axes).
  BatchQuerySplit the core split gcd(batch, P) ways over the batch and the
                  rest over queries (batches below P); BatchSplit and
                  QuerySplit are its two ends.
  GatheredBatchSplit
                  the whole layer split over the batch (X cut for free), the
                  weights gathered and their gradients reduce-scattered, Y
                  all-gathered: 0.875x multi-head at t5.1.th.base, any P.
  Auto            the default: prices every strategy that applies with
                  prices.predict (the strategies' ring-cost formulas,
                  TensorFlow-free in prices.py) and runs the fastest of
                  those predicted to fit (estimate/auto_pricing.py:
                  planner.price_layer, pick).

All of them compute the core with kernels.ordered_core: the paper's J, L, W,
U, O with the n x m x heads tensors heads-major, the projections as batched
matmuls with P-first gradients (project_heads) and a fused softmax
(softmax_last); HeadsParallel(ordered=False) keeps attention.attention_core
as the paper lays it out, the reference the tests compare with.  Where
mtf_th.core_kernel.kind allows and the call fits, ordered_core is instead one
fused op per device slice (nn/core_kernel.py: no n x m x heads tensor kept;
RecomputeCore then runs it without recomputation), whatever the strategy.

The split strategies read the layout from ``context.model.layout`` and
``context.model.mesh_shape`` (t5's utils.build_model and the test harness
pass them to the model, as mtf's MoE layers require too) and run
``check(...)`` before building anything, so a layout they cannot serve fails
with a ValueError naming the dim and the mesh axis.  Every rename is written
so that mtf lowers it to the collective named above (no allconcat hides in a
reshape), see ``split.SplitCore``.

The modules: mesh_layout (MeshLayout, the layout checks, the dim names),
frame (AttentionCall, Frame, Strategy), heads_parallel, split (SplitCore,
QuerySplit, BatchSplit, BatchQuerySplit) with plans (their renames),
gathered (GatheredBatchSplit), auto (Auto, applying what
estimate/auto_pricing.py prices), recompute (RecomputeCore) and registry
(STRATEGIES: one entry per row of estimate/strategy_table.py, its gin
class and arguments).  The package exports the public names and
make_strategy (a name of STRATEGIES, or "auto").
"""
from mtf_talking_heads.nn.strategies.auto import Auto
from mtf_talking_heads.nn.strategies.frame import AttentionCall
from mtf_talking_heads.nn.strategies.frame import Frame
from mtf_talking_heads.nn.strategies.frame import Strategy
from mtf_talking_heads.nn.strategies.gathered import GatheredBatchSplit
from mtf_talking_heads.nn.strategies.heads_parallel import HeadsParallel
from mtf_talking_heads.nn.strategies.mesh_layout import CORE_SCOPE
from mtf_talking_heads.nn.strategies.mesh_layout import is_core_activation
from mtf_talking_heads.nn.strategies.mesh_layout import MeshLayout
from mtf_talking_heads.nn.strategies.recompute import RecomputeCore
from mtf_talking_heads.nn.strategies.registry import STRATEGIES
from mtf_talking_heads.nn.strategies.split import BatchQuerySplit
from mtf_talking_heads.nn.strategies.split import BatchSplit
from mtf_talking_heads.nn.strategies.split import QuerySplit

__all__ = [
    "AttentionCall", "Auto", "BatchQuerySplit", "BatchSplit", "CORE_SCOPE",
    "Frame", "GatheredBatchSplit", "HeadsParallel", "MeshLayout",
    "QuerySplit", "RecomputeCore", "STRATEGIES", "Strategy",
    "is_core_activation", "make_strategy",
]


def make_strategy(name):
  """The strategy registered as `name` (a key of STRATEGIES, or "auto")."""
  if name == Auto.name:
    return Auto()
  if name not in STRATEGIES:
    raise ValueError("strategy: unknown %r; choose from %s, auto"
                     % (name, ", ".join(STRATEGIES)))
  return STRATEGIES[name]()
