"""The sharding strategies, named once: what every other module reads.

One row per named strategy: its gin class (nn/strategies), the class's
keyword arguments, what it does to the n x m x heads core for memory.py, and
when it applies.  sharding (nn/strategies), Auto, the planner, memory, prices
and `mtf_th comm` all read this table; none of them lists the names again.

Example:
  ROWS["query_split_allgather"].gin_class == "QuerySplit"
  ROWS["query_split_allgather"].kwargs == (("reduce_scatter", False),)
  NAMES[0] == "heads_parallel"
"""
import collections

HEADS_PARALLEL = "heads_parallel"
AUTO = "auto"


class Row(collections.namedtuple("Row", [
    "name", "gin_class", "kwargs", "memory_core", "needs"])):
  """One strategy.

  Attributes:
    name: the strategy's name (`--strategy`, Auto's candidates).
    gin_class: its class in nn/strategies, gin name `mtf_th.<gin_class>`.
    kwargs: ((argument, value), ...) the class is built with.
    memory_core: what it does to the core (memory.py): "heads" keeps the
      heads layout, "split" cuts every core tensor P ways, "gather" (the
      query splits) also keeps K and V whole, "layer" splits the whole layer
      over the batch.
    needs: when it applies on a model axis of P > 1 devices: "any" (always),
      "batch" (batch % P == 0), "length" (length % P == 0) or "batch_query"
      (length divisible by what the batch leaves of P).
  """


# In the order `mtf_th comm --strategy all` and the planner list them.
TABLE = (
    Row(HEADS_PARALLEL, "HeadsParallel", (), "heads", "any"),
    Row("query_split_allgather", "QuerySplit", (("reduce_scatter", False),),
        "gather", "length"),
    Row("query_split", "QuerySplit", (), "gather", "length"),
    Row("batch_split", "BatchSplit", (), "split", "batch"),
    Row("batch_split_gathered", "GatheredBatchSplit", (), "layer", "batch"),
    Row("batch_query_split", "BatchQuerySplit", (), "split", "batch_query"),
)
ROWS = collections.OrderedDict((row.name, row) for row in TABLE)
NAMES = tuple(ROWS)
# Auto's default candidates, in its order of preference on equal prices.
AUTO_CANDIDATES = (HEADS_PARALLEL, "batch_split_gathered", "batch_split",
                   "batch_query_split", "query_split", "query_split_allgather")

