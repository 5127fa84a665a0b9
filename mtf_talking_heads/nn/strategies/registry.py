"""STRATEGIES: every named strategy, one per row of estimate/strategy_table.

The class of each row by its gin class name, with the row's arguments
bound.  Auto (auto.py) builds its candidates from it; the package's
__init__ re-exports it with make_strategy, which adds "auto".  (It sits
below both so that no import cycle runs through the package.)
"""
import functools

from mtf_talking_heads.estimate import strategy_table
from mtf_talking_heads.nn.strategies import gathered
from mtf_talking_heads.nn.strategies import heads_parallel
from mtf_talking_heads.nn.strategies import split

_CLASSES = {cls.__name__: cls for cls in (
    heads_parallel.HeadsParallel, split.QuerySplit, split.BatchSplit,
    gathered.GatheredBatchSplit, split.BatchQuerySplit)}


def _factory(row):
  """The class of a strategy_table.Row, with the row's arguments bound."""
  cls = _CLASSES[row.gin_class]
  return functools.partial(cls, **dict(row.kwargs)) if row.kwargs else cls


# Every named strategy (what `mtf_th comm --strategy all` measures), in the
# table's order: {name: fn() -> Strategy}.
STRATEGIES = {row.name: _factory(row) for row in strategy_table.TABLE}
