"""benchmarks/auto_mtf_layout.py builds auto_mtf's memory constraints as
coefficient rows (memory_rows) instead of ortools expressions: the rows it
keeps are the library's, and the ones it leaves out are implied by them, so
every layout's peak is the same.  Needs no ortools.  And docs/costs.md
shows what the benchmark's --table prints from its committed CSVs."""
import collections
import itertools
import os
import shlex

import mesh_tensorflow as mtf
import numpy as np
import pytest

import _cli_util
from mtf_talking_heads.measure import memory_measure


def _benchmark():
  return _cli_util.load_script("benchmarks/auto_mtf_layout.py",
                               "auto_mtf_layout")


def test_rows_by_hand():
  bench = _benchmark()
  contents = [{"a"}, {"a", "b"}, {"b"}, {"b", "c"}]
  terms = {"a": {"y0": 4, "y1": 2}, "b": {"y0": 8, "y1": 4}, "c": {"y2": 1}}
  columns, rows = bench.memory_rows(contents, terms)
  assert columns == ["y0", "y1", "y2"]
  # [4, 2, 0], [12, 6, 0], [8, 4, 0], [8, 4, 1]: the first and third are
  # implied by the second
  assert rows.tolist() == [[12, 6, 0], [8, 4, 1]]
  with pytest.raises(ValueError, match="not consecutive"):
    bench.memory_rows([{"a"}, {"b"}, {"a"}], terms)


def _step_graph():
  """A two-layer relu MLP's forward pass and gradients, as an mtf graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch, d, h = (mtf.Dimension("batch", 4), mtf.Dimension("d", 8),
                 mtf.Dimension("h", 16))
  x = mtf.ones(mesh, [batch, d])
  w1 = mtf.ones(mesh, [d, h]) * 0.5
  w2 = mtf.ones(mesh, [h, d]) * 0.25
  y = mtf.einsum([mtf.relu(mtf.einsum([x, w1], [batch, h])), w2], [batch, d])
  loss = mtf.reduce_sum(mtf.square(y))
  grads = mtf.gradients([loss], [w1, w2])
  return graph, [loss] + grads


def test_rows_keep_every_layouts_peak():
  bench = _benchmark()
  graph_interface = memory_measure.load_auto_mtf("graph_interface")
  scheduler = memory_measure.load_auto_mtf("scheduler")
  graph, outputs = _step_graph()
  interface = graph_interface.GraphInterface(graph)
  for t in outputs:
    interface.set_tensor_final(t.name)
  contents = interface.compute_memory_contents_under_schedule(
      scheduler.minimize_peak_memory(interface, "LIST"))
  mesh = {"m0": 2, "m1": 4}
  # LayoutOptimizer's local variables: per set of tensor dims, each way of
  # putting some of them on distinct mesh axes
  terms = {}
  for name in interface.get_all_tensor_names():
    dims = frozenset(interface.get_tensor_mtf_dimension_names(name))
    terms[name] = {}
    for k in range(min(len(dims), len(mesh)) + 1):
      for chosen in itertools.combinations(sorted(dims), k):
        for axes in itertools.permutations(mesh, k):
          a = dict(zip(chosen, axes))
          terms[name][(dims, frozenset(a.items()))] = (
              interface.get_tensor_size(name, a, mesh))
  columns, rows = bench.memory_rows(contents, terms)
  # the library's constraint of each set, its coefficients merged per
  # local variable as ortools flattens it
  library = []
  for names in contents:
    merged = collections.Counter()
    for name in names:
      merged.update(terms[name])
    library.append([merged[c] for c in columns])
  library = np.array(library)
  # 22 sets, 19 distinct constraints, 6 of them not implied by another
  assert len(contents) == 22 and len({tuple(r) for r in library}) == 19
  assert len(rows) == 6
  assert {tuple(r) for r in rows} <= {tuple(r) for r in library}
  assert all((rows >= r).all(axis=1).any() for r in library)
  # every layout of the dims on the two axes: the same peak from both
  dims = sorted({d for name in terms for d in next(iter(terms[name]))[0]})
  peaks = set()
  for axes in itertools.product([None, "m0", "m1"], repeat=len(dims)):
    layout = {d: a for d, a in zip(dims, axes) if a}
    if len(set(layout.values())) < len(layout):
      continue
    chosen = np.array([c[1] == frozenset((d, a) for d, a in layout.items()
                                         if d in c[0]) for c in columns])
    peak = (library @ chosen).max()
    assert (rows @ chosen).max() == peak
    peaks.add(int(peak))
  assert len(peaks) > 3  # the layouts do differ


def test_costs_md_shows_what_table_prints(capsys, monkeypatch):
  """docs/costs.md's auto_mtf tables are what --table prints from the
  committed CSVs (the cases, their figures and the pending ones)."""
  bench = _benchmark()
  repo = os.path.join(os.path.dirname(__file__), "..", "..")
  monkeypatch.chdir(repo)
  with open("docs/costs.md") as f:
    lines = f.read().splitlines()
  found = [i for i, line in enumerate(lines)
           if "benchmarks/auto_mtf_layout.py" in line and "--table" in line]
  assert len(found) == 2
  for i in found:
    assert bench.main(shlex.split(lines[i])[2:]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.strip()]
    shown = [l for l in lines[i + 1:] if l.strip()][:len(printed)]
    assert shown == printed, lines[i]


def test_search_layers_must_be_fewer_than_the_rows(capsys):
  """--search_layers at or above a row's depth searches nothing smaller:
  refused before any graph is built, naming the row and the fix."""
  bench = _benchmark()
  assert bench.row_depth("t5_heads/01_multi_head_6_128") == 12
  assert bench.row_depth(
      "t5_heads/01_multi_head_6_128 [num_layers = 3]") == 3
  with pytest.raises(SystemExit) as e:
    bench.main(["--csv", "unused.csv", "--search_layers", "12",
                "t5_heads/01_multi_head_6_128"])
  assert e.value.code == 2
  err = capsys.readouterr().err.splitlines()[-1]
  assert err.endswith("--search_layers 12 is not fewer than "
                      "t5_heads/01_multi_head_6_128's 12 layers per stack; "
                      "leave --search_layers out to search the row's own "
                      "depth")
  assert not os.path.exists("unused.csv")
