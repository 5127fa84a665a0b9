"""auto_mtf.layout_and_mesh_shape's choice vs mtf_th plan's, on the paper's rows.

  nice -n 19 .venv/bin/python benchmarks/auto_mtf_layout.py \\
      --ortools /work/cache/ortools --csv benchmarks/auto_mtf_layout.csv

Needs ortools (auto_mtf's CP-SAT layout optimizer), which the pinned stack
does not install; ortools 9.7.2996 installs beside it without changing any
pin (`pip install --no-deps --target /work/cache/ortools ortools==9.7.2996`,
then give that directory as --ortools; docs/costs.md says why it is not in
requirements.lock).

For each row of ROWS (the paper's T5 Table 1 and its 768-head BERT row, as
the gin files of gin/experiments build them at the paper's batch, with
bfloat16 activations as on a TPU) and each device count of DEVICES, the
training step's mtf graph (loss, gradients and the optimizer's update; not
lowered) is built once per row and shared by both device counts, and
auto_mtf searches it the way layout_and_mesh_shape does: for every mesh
shape of at most two axes it asks its LayoutOptimizer (CP-SAT) for the
layout minimising its own peak-memory estimate and keeps the smallest.
Its scheduler's result (which tensors are live at each op) does not depend
on the mesh, so it is computed once per row, not once per mesh shape; the
optimizer's memory constraints are written as coefficient rows
(memory_rows: the constraints ortools would build, implied ones left out)
instead of one ortools expression per live tensor; the CP-SAT solve runs
with one worker and a deterministic time limit per mesh shape
(--time_limit; the solver_status column says whether every solve proved
its optimum, OPTIMAL, or stopped at the limit, FEASIBLE, or found nothing
there, UNKNOWN: that mesh shape is then left out).  --search_layers N
searches the graph of N layers per stack instead of the row's own depth
(the choices are still priced at the row's depth; search_layers says
which).

Each CSV row gives auto_mtf's choice (mesh, layout, its own estimate on the
searched graph), the same choice priced by memory.py and step_time.py (the
planner's predictors) on HARDWARE when memory.py models its layout (batch
on one axis; on the other the heads dims with d_ff and vocab, as
gin/layouts lay them out), and the planner's first candidate (planner.plan:
the fastest that fits), with the CPU seconds each stage took (building the
graph, scheduling, the search; the search's CP-SAT model building and
solving) and the CP-SAT deterministic units the solves used.  Finished
cases are appended to --csv one line at a time and skipped when the command
runs again, so it can run niced in the background in pieces.
"""
import argparse
import collections
import csv
import math
import os
import sys
import time

from mtf_talking_heads.core import compat  # noqa: F401  pylint: disable=unused-import

ROWS = tuple("t5_heads/%s" % name for name in (
    "01_multi_head_6_128", "02_multi_head_12_64", "03_multi_head_24_32",
    "04_multi_head_48_16", "05_talking_heads_6_128", "06_talking_heads_12_64",
    "07_talking_heads_24_32", "08_talking_heads_48_16",
    "09_multi_head_24_64", "10_general_bilinear_12", "11_raffel2019")) + (
        "bert_heads/10_talking_heads_768_1",)
DEVICES = (8, 32)
HARDWARE = "tpu_v3"
# the graph is built as a TPU runs it (gin/mtf_th.gin's float32 default is
# for CPU): hardware.py's "mtf_th" implementation
BUILD_PARAMS = ("activation_dtype = 'bfloat16'", "mesh_shape = 'model:1'")
IMPLEMENTATION = "mtf_th"
TIME_LIMIT = 600.0  # CP-SAT deterministic time units per mesh shape
COLUMNS = ("row", "devices", "search_layers", "auto_mesh", "auto_layout", "auto_estimate_gib",
           "auto_memory_gib", "auto_step_s", "auto_fits", "plan_mesh",
           "plan_strategy", "plan_memory_gib", "plan_step_s", "plan_fits",
           "build_s", "schedule_s", "search_s", "model_s", "solve_s",
           "solve_units", "time_limit_s", "solver_status")
HEADS_DIMS = ("heads", "heads_k", "heads_v", "groups")
# the relative position bias' [buckets, heads] (32 x heads floats): auto_mtf
# may split it anywhere; memory.py keeps it whole
NEGLIGIBLE = ("buckets",)
GiB = 2.0 ** 30


def done_cases(path):
  """{(row, devices, search_layers)} already in the CSV at `path`."""
  if not os.path.exists(path):
    return set()
  with open(path) as f:
    return {(r["row"], int(r["devices"]), r["search_layers"])
            for r in csv.DictReader(f)}


def append_row(path, values):
  """Appends one CSV line (the header first if the file is new)."""
  new = not os.path.exists(path) or os.path.getsize(path) == 0
  with open(path, "a") as f:
    writer = csv.writer(f, lineterminator="\n")
    if new:
      writer.writerow(COLUMNS)
    writer.writerow(values)
    f.flush()
    os.fsync(f.fileno())


def gin_files(row):
  return ["experiments/%s.gin" % row.split(" [")[0]]


def gin_params(row):
  """The bindings a case name carries: "ROW [a = 1; b = 2]" (a smaller
  model than the paper's, to check the benchmark itself)."""
  return row.split(" [")[1][:-1].split("; ") if " [" in row else []


def row_depth(row):
  """The row's layers per stack (its num_layers), read from its gin text."""
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  config = gin_text.GinConfig(gin_files(row), gin_params(row))
  return config.require("num_layers", row)


def case_name(row, params):
  return "%s [%s]" % (row, "; ".join(params)) if params else row


class StepGraph(object):
  """The training step of a row's gin files as one mtf graph, not lowered.

  Attributes: mtf_graph, loss (the final tensor), vocab, optimizer name.
  """

  def __init__(self, row, layers=None):
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads.training import model_size  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads.training import settings as settings_lib  # pylint: disable=g-import-not-at-top
    params = gin_params(row) + (["num_layers = %d" % layers] if layers
                                else [])
    settings_lib.parse_gin(gin_files(row), list(BUILD_PARAMS) + params)
    settings = settings_lib.Settings()
    self.vocab = settings_lib.vocab_size()
    self.optimizer = model_lib.model_from_gin(gin_files(row), params,
                                              vocab=self.vocab).optimizer
    model = model_size.build_model(settings, settings.layout,
                                   settings.mesh_shape)
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.mtf_graph = mtf.Graph()
      _, self.loss = model_size.call_model(
          model, settings, mtf.Mesh(self.mtf_graph, "mesh"))
      variables = self.mtf_graph.trainable_variables
      grads = mtf.gradients([self.loss], [v.outputs[0] for v in variables])
      tf.train.get_or_create_global_step()
      memory_measure.OPTIMIZERS[self.optimizer]().apply_grads(grads,
                                                              variables)


class Search(object):
  """layout_and_mesh_shape's search, timed, its schedule computed once.

  auto_mtf.api.layout_and_mesh_shape builds a MemoryEstimator and a
  LayoutOptimizer per mesh shape; each runs the scheduler over the whole
  graph, whose result does not depend on the mesh (tensor sizes unsplit).
  Here the graph interface and its memory contents are computed once and
  handed to every mesh shape's optimizer, and the optimizer's memory
  constraints are built from memory_rows (the same linear constraints,
  coefficient for coefficient, without ortools' per-term Python
  expressions); the layouts and values are the same as the library's.
  """

  def __init__(self, mtf_graph, outputs, time_limit):
    from mesh_tensorflow.auto_mtf import graph_interface  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.auto_mtf import layout_optimizer  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.auto_mtf import scheduler  # pylint: disable=g-import-not-at-top
    from ortools.sat.python import cp_model  # pylint: disable=g-import-not-at-top
    start = time.process_time()
    self.interface = graph_interface.GraphInterface(mtf_graph)
    for t in outputs:
      self.interface.set_tensor_final(t.name)
    schedule = scheduler.minimize_peak_memory(self.interface, "LIST")
    self.contents = maximal(
        self.interface.compute_memory_contents_under_schedule(schedule))
    self.schedule_s = time.process_time() - start
    self.mtf_graph, self.outputs = mtf_graph, outputs
    # what a tensor's size depends on: dtype and mtf shape
    self.shapes = {t.name: (t.dtype.size, str(t.shape))
                   for op in mtf_graph.operations for t in op.outputs}
    self.statuses, self.model_s, self.solve_s, self.units = [], 0.0, 0.0, 0.0
    search = self

    class LimitedSolver(cp_model.CpSolver):
      """CpSolver with a time limit and one worker; records its status."""

      def Solve(self, model, *args, **kwargs):  # pylint: disable=invalid-name
        # deterministic time: the same work whatever else loads the cores
        self.parameters.max_deterministic_time = time_limit
        self.parameters.num_workers = 1
        begin = time.process_time()
        status = super().Solve(model, *args, **kwargs)
        search.solve_s += time.process_time() - begin
        search.statuses.append(self.StatusName(status))
        search.units += self.ResponseProto().deterministic_time
        return status

    class NoTensors(object):
      """A GraphInterface listing no tensors (its ops as they are)."""

      def __init__(self, interface):
        self.interface = interface

      def __getattr__(self, name):
        return getattr(self.interface, name)

      def get_all_tensor_names(self):  # pylint: disable=invalid-name
        return []

    class Optimizer(layout_optimizer.LayoutOptimizer):
      """LayoutOptimizer with the memory constraints from memory_rows."""

      def __init__(self, estimator):
        begin = time.process_time()
        super().__init__(estimator)
        search.model_s += time.process_time() - begin

      def _get_memory_contents(self):
        return search.contents

      def _add_constraints(self):
        # the library's constraints but the memory ones: over no tensors it
        # sizes none and adds no memory constraint
        self._graph, contents = NoTensors(self._graph), search.contents
        search.contents = []
        try:
          super()._add_constraints()
        finally:
          self._graph, search.contents = self._graph.interface, contents
        columns, rows = memory_rows(contents, self._tensor_terms())
        # each row as AddLinearExpressionInDomain writes sum(...) <= z:
        # its variables and coefficients, then z's -1, at most 0
        z = self._memory_var.Index()
        for row in rows:
          nonzero = row.nonzero()[0]
          linear = self._model.Proto().constraints.add().linear
          linear.vars.extend([columns[j] for j in nonzero] + [z])
          linear.coeffs.extend([int(row[j]) for j in nonzero] + [-1])
          linear.domain.extend([cp_model.INT_MIN, 0])

      def _tensor_terms(self):
        """{tensor: {local variable index: its size under that
        assignment}}."""
        mesh = self._layout_validator.mesh_dimension_name_to_size
        terms, sizes = {}, {}
        for name in self._graph.get_all_tensor_names():
          if not self._graph.is_tensor_on_canonical_device(name):
            continue
          dims = self._tensor_name_to_mtf_dimension_set[name]
          key = (dims, search.shapes[name])
          if key not in sizes:  # the sizes depend on these alone
            sizes[key] = {
                self._local_vars[dims][layout_optimizer._local_var_name(  # pylint: disable=protected-access
                    dims, a)].Index(): self._graph.get_tensor_size(
                        name, a, mesh)
                for a in self._assignments[dims]}
          terms[name] = sizes[key]
        return terms

    layout_optimizer.cp_model.CpSolver = LimitedSolver
    self.optimizer_class = Optimizer
    self.solver_error = layout_optimizer.SolverError

  def run(self, devices):
    """(layout string, mtf.Shape, its estimate in bytes) of `devices`."""
    import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.auto_mtf import api  # pylint: disable=g-import-not-at-top
    from mesh_tensorflow.auto_mtf import memory_estimator  # pylint: disable=g-import-not-at-top
    best = None
    for sizes in api._mesh_shape_iterator(devices, 2):  # pylint: disable=protected-access
      mesh = mtf.Shape([mtf.Dimension("mesh_%d" % i, s)
                        for i, s in enumerate(sizes)])
      estimator = memory_estimator.MemoryEstimator(self.mtf_graph, mesh,
                                                   self.outputs)
      estimator._graph_interface = self.interface  # pylint: disable=protected-access
      optimizer = self.optimizer_class(estimator)
      try:
        layout = optimizer.solve()
      except self.solver_error:  # no layout within the limit (UNKNOWN)
        continue
      value = optimizer.evaluate_layout(layout)
      if best is None or value < best[2]:
        best = (layout, mesh, value)
    return best


def memory_rows(contents, terms):
  """auto_mtf's memory constraints as coefficient rows, implied ones left out.

  LayoutOptimizer adds, for each set of `contents` (the tensors live at one
  op), the constraint sum over its tensors t of sum over t's assignments a
  of size(t, a) * y_a <= z, and ortools flattens it into one coefficient per
  local variable y_a: the sum of size(t, a) over the live tensors whose
  dims have that assignment.  Those coefficients are computed here as
  numbers: a tensor is live over consecutive sets (from the op making it to
  its last reader), so each tensor adds its sizes at its first set and
  takes them off after its last.  A row that is another's or whose every
  coefficient is at most another's is implied by it (the y_a are 0 or 1)
  and left out; what remains has the library's feasible layouts and peak.

  Args:
    contents: list of sets of tensor names, as LayoutOptimizer's
      _get_memory_contents.
    terms: {tensor name: {column: bytes}}, e.g. {"x": {y0: 64, y1: 32}}:
      the local variables of the tensor's dims and its size under each.

  Returns:
    (columns, rows): the list of columns, and an int64 array
    [constraints, len(columns)] of coefficients.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  first, last = {}, {}
  for i, names in enumerate(contents):
    for name in names:
      first.setdefault(name, i)
      last[name] = i
  if sum(last[t] - first[t] + 1 for t in first) != sum(map(len, contents)):
    raise ValueError("a tensor is live over sets that are not consecutive")
  columns, index = [], {}
  for name in first:
    for column in terms.get(name, {}):
      if column not in index:
        index[column] = len(columns)
        columns.append(column)
  delta = np.zeros((len(contents) + 1, len(columns)), np.int64)
  for name in first:
    for column, size in terms.get(name, {}).items():
      delta[first[name], index[column]] += size
      delta[last[name] + 1, index[column]] -= size
  rows = np.unique(np.cumsum(delta, axis=0)[:-1], axis=0)
  kept, count = np.zeros_like(rows), 0
  for row in rows[np.argsort(-rows.sum(axis=1), kind="stable")]:
    if not (kept[:count] >= row).all(axis=1).any():
      kept[count], count = row, count + 1
  return columns, kept[:count]


def maximal(contents):
  """The sets of `contents` that are not subsets of a neighbour (of equal
  neighbours, the first is kept).

  contents[i] is what is live at op i of the schedule; a tensor is live
  over an interval of ops, so a set inside another set is inside its
  neighbour.  auto_mtf puts one constraint sum(sizes of a set) <= peak per
  set: a subset's constraint is implied by its superset's (sizes are not
  negative), and the peak evaluate_layout takes over the sets is the same.
  """
  last = len(contents) - 1
  return [s for i, s in enumerate(contents)
          if not ((i < last and s < contents[i + 1]) or
                  (i > 0 and s <= contents[i - 1]))]


def planner_mesh(layout, mesh):
  """auto_mtf's (layout, mtf.Shape) as ("batch:B,model:P", model-axis dims).

  Dims of NEGLIGIBLE are left out.  None when memory.py has no model of
  it: the batch shares its axis with
  another dim, two axes split non-batch dims, or the model axis splits a
  dim other than the heads dims or leaves d_ff or vocab whole.
  """
  sizes = collections.OrderedDict((d.name, d.size) for d in mesh.dims)
  on = collections.defaultdict(list)
  for pair in filter(None, layout.split(";")):
    dim, axis = pair.split(":")
    if dim not in NEGLIGIBLE:
      on[axis].append(dim)
  batch = [a for a in sizes if "batch" in on[a]]
  if batch and len(on[batch[0]]) > 1:
    return None
  rest = [a for a in sizes if a not in batch and sizes[a] > 1]
  if len(rest) > 1:
    return None
  b = sizes[batch[0]] if batch else 1
  p = math.prod(sizes[a] for a in rest)
  dims = sorted(on[rest[0]]) if rest else []
  if p > 1 and (not {"d_ff", "vocab"} <= set(dims) or any(
      d not in HEADS_DIMS + ("d_ff", "vocab") for d in dims)):
    return None
  return "batch:%d,model:%d" % (b, p), dims


def price(model, mesh_shape, dims, dropout=False):
  """(memory.py bytes, step_time.py seconds or None) of a heads-parallel
  model on mesh_shape with `dims` on its model axis, with attention
  dropout's mask if `dropout`; the step time only when that is the
  planner's layout (step_time.py prices no other)."""
  from mtf_talking_heads.estimate import hardware  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  p = model_lib.parse_mesh(mesh_shape)["model"]
  rules = ",".join(["batch:batch"] + ["%s:model" % d for d in dims])
  total = memory.predict(model, mesh_shape, IMPLEMENTATION, dropout=dropout,
                         layout=rules)["total"]
  planned = {r for r in planner.layout(model, p).split(",")}
  step = None
  if p == 1 or set(rules.split(",")) == planned:
    step = step_time.predict(model, hardware.get_hardware(HARDWARE),
                             mesh_shape,
                             hardware.implementation(IMPLEMENTATION))["step_s"]
  return total, step


def case_row(row, devices, layers, graph, search, build_s, time_limit):
  """The CSV values of one (row, devices) case, auto_mtf's search on the
  graph of `layers` layers per stack ("all": the row's own), both choices
  priced on the row's own model."""
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  start, search.statuses = time.process_time(), []
  search.model_s = search.solve_s = search.units = 0.0
  found = search.run(devices)
  search_s = time.process_time() - start
  from mtf_talking_heads.commands import plan as plan_command  # pylint: disable=g-import-not-at-top
  model = model_lib.model_from_gin(gin_files(row), gin_params(row),
                                   vocab=graph.vocab)
  # as `mtf_th plan` reads it: dropout keeps a mask and rules out
  # recomputing the core (BERT's 0.1)
  dropout = plan_command.dropout_on(gin_files(row), gin_params(row))
  auto = ("n/a",) * 6  # no mesh shape solved within the limit
  if found is not None:
    layout, mesh, estimate = found
    auto = (";".join("%s:%d" % (d.name, d.size) for d in mesh.dims), layout,
            "%.2f" % (estimate / GiB), "n/a", "n/a", "n/a")
    translated = planner_mesh(layout, mesh)
    if translated is not None:
      total, step = price(model, *translated, dropout=dropout)
      auto = auto[:3] + (
          "%.2f" % (total / GiB), "n/a" if step is None else "%.4f" % step,
          "yes" if total <= planner.usable_bytes(HARDWARE, devices)
          else "no")
  best = planner.plan(model, HARDWARE, devices, IMPLEMENTATION,
                      dropout=dropout)[0]
  return (row, devices, layers) + auto + (
      best.mesh_shape, best.strategy + ("+recompute" if best.recompute
                                        else ""),
      "%.2f" % (best.memory["total"] / GiB), "%.4f" % best.step_s,
      "yes" if best.fits else "no", "%.0f" % build_s,
      "%.0f" % search.schedule_s, "%.0f" % search_s,
      "%.0f" % search.model_s, "%.0f" % search.solve_s,
      "%.1f" % search.units, "%.0f" % time_limit,
      "/".join(sorted(set(search.statuses))))


def print_table(path, rows, devices, layers):
  """The CSV's cases (columns auto_* and plan_*) as markdown, then the
  cases of rows x devices searched at `layers` not in it."""
  from mtf_talking_heads import commands  # pylint: disable=g-import-not-at-top
  shown = COLUMNS[:14] + ("search_s", "solve_units", "solver_status")
  cells = []
  if os.path.exists(path):
    with open(path) as f:
      cells = [[r[c] for c in shown] for r in csv.DictReader(f)]
  sys.stdout.write(commands.format_table(shown, cells, "md", text_columns=(
      "row", "auto_mesh", "auto_layout", "plan_mesh", "plan_strategy",
      "solver_status")))
  done = done_cases(path)
  pending = ["%s at %d" % (r, d) for r in rows for d in devices
             if (r, d, layers) not in done]
  print("\n%d of %d cases with search_layers %s measured; pending: %s" % (
      len(rows) * len(devices) - len(pending), len(rows) * len(devices),
      layers, ", ".join(pending) or "none"))
  return 0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("rows", nargs="*", metavar="ROW",
                      help="only these ROWS, e.g. t5_heads/07_talking_heads_"
                      "24_32 (default: all)")
  parser.add_argument("--csv", required=True, metavar="FILE",
                      help="append one line per finished case; cases "
                      "already there are skipped")
  parser.add_argument("--devices", type=int, action="append",
                      help="device counts (powers of two; default 8 and 32)")
  parser.add_argument("--gin_param", action="append", default=[],
                      metavar="BINDING", help="a binding for every row, e.g. "
                      "\"num_layers = 1\" (the case is named ROW [BINDING])")
  parser.add_argument("--search_layers", type=int, metavar="N",
                      help="auto_mtf searches the graph with N layers per "
                      "stack (num_layers = N), both choices priced on the "
                      "row's own depth (default: the row's own depth)")
  parser.add_argument("--table", action="store_true",
                      help="print the CSV's cases as a markdown table and "
                      "name the pending ones; run nothing")
  parser.add_argument("--ortools", metavar="DIR",
                      help="a directory holding ortools (pip --target), put "
                      "first on sys.path")
  parser.add_argument("--time_limit", type=float, default=TIME_LIMIT,
                      metavar="T", help="CP-SAT deterministic time limit "
                      "per mesh shape (its work units, the solve_units "
                      "column; not wall time, which a loaded machine "
                      "stretches; default %g)" % TIME_LIMIT)
  args = parser.parse_args(argv)
  if args.ortools:
    sys.path.insert(0, args.ortools)
  for row in args.rows:
    if row not in ROWS:
      parser.error("unknown row %r; choose from %s" % (row, ", ".join(ROWS)))
  if args.search_layers is not None and args.search_layers < 1:
    parser.error("--search_layers must be a positive integer, got %d" %
                 args.search_layers)
  if args.search_layers is not None:
    for row in args.rows or ROWS:
      try:
        depth = row_depth(case_name(row, args.gin_param))
      except ValueError as e:
        parser.error(str(e))
      if args.search_layers >= depth:
        parser.error("--search_layers %d is not fewer than %s's %d layers "
                     "per stack; leave --search_layers out to search the "
                     "row's own depth" % (args.search_layers, row, depth))
  devices = tuple(args.devices or DEVICES)
  for d in devices:  # auto_mtf's mesh shapes are powers of two
    if d < 1 or d & (d - 1):
      parser.error("--devices must be a power of two, got %d" % d)
  layers = str(args.search_layers or "all")
  if args.table:
    return print_table(args.csv, [case_name(r, args.gin_param)
                                  for r in args.rows or ROWS], devices,
                       layers)
  done = done_cases(args.csv)
  for row in args.rows or ROWS:
    row = case_name(row, args.gin_param)
    todo = [d for d in devices if (row, d, layers) not in done]
    if not todo:
      continue
    start = time.process_time()
    graph = StepGraph(row, args.search_layers)
    build_s = time.process_time() - start
    search = Search(graph.mtf_graph, [graph.loss], args.time_limit)
    print("%s: graph built in %.0f s, scheduled in %.0f s" % (
        row, build_s, search.schedule_s), flush=True)
    for d in todo:
      values = case_row(row, d, layers, graph, search, build_s,
                        args.time_limit)
      append_row(args.csv, values)
      print(",".join(str(v) for v in values), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
