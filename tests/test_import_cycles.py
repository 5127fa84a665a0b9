"""No import cycle among the package's modules (issue 18), read as text.

Every `import` and `from ... import` of a mtf_talking_heads module counts,
at the top of a file or inside a function (an import inside a function is
how the cycles of the past hid: training/errors.py -> training/cluster.py
-> training/errors.py).  Pure ast, no module is imported: well under a
second.
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mtf_talking_heads"


def _modules():
  """{dotted module name: file path} of every module of the package."""
  modules = {}
  for directory, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(directory, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        modules[name[:-len(".__init__")] if name.endswith(".__init__")
                else name] = path
  return modules


def _imports(name, path, modules):
  """The package modules that the module `name` imports anywhere."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the module's package upwards
        parts = name.split(".")[:None if path.endswith("__init__.py") else -1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      for a in node.names:
        full = base + "." + a.name
        found.add(full if full in modules else base)
  return found & set(modules) - {name}


def import_cycles():
  """The strongly connected components of more than one module."""
  modules = _modules()
  graph = {m: _imports(m, p, modules) for m, p in modules.items()}
  index, low, stack, cycles = {}, {}, [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = stack[stack.index(v):]
      del stack[stack.index(v):]
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return cycles


def test_no_import_cycle():
  assert len(_modules()) > 50
  assert import_cycles() == []


def test_a_cycle_through_a_function_import_is_found(tmp_path, monkeypatch):
  package = tmp_path / PACKAGE
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "a.py").write_text("from mtf_talking_heads import b\n")
  (package / "b.py").write_text(
      "def f():\n  from mtf_talking_heads import a\n  return a\n")
  (package / "c.py").write_text("from mtf_talking_heads import a\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  assert import_cycles() == [[PACKAGE + ".a", PACKAGE + ".b"]]
