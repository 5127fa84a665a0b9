"""The package's architecture, read from its import graph (docs/architecture.md).

Every `import` and `from ... import` of every module counts, at the top of a
file or inside a function (imports inside functions are how cycles and
upward arrows hid before).  Pure ast (and estimate/strategy_table.py loaded
by path, standard library only): well under a second.  The rules:

* no import cycle among the package's modules;
* packages import only the packages below them (ALLOWED; a package not
  listed there fails until it is);
* core/, runtime/ and estimate/ never import TensorFlow or its stack, not
  even inside a function (core/compat.py, the stack's mends, only inside
  the hooks it installs); the light modules above them (the sweep, the
  comparison, the commands) not at module level, nor any module of a
  package that does (nn, data, measure, training, ...) at module level;
* the top level holds only __init__.py, cli.py and commands/; no source
  file over 700 lines;
* strategy names are listed once (estimate/strategy_table.py): no literal
  collection of two names or more anywhere else in the package, benchmarks
  or launch (the tests' expected values may name several).
"""
import ast
import collections
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mtf_talking_heads"
# TensorFlow and what imports it.
HEAVY = ("tensorflow", "mesh_tensorflow", "t5", "seqio", "tensorflow_datasets",
         "tensorflow_text", "tensorflow_hub")
# package -> the packages it may import (itself included).  "" is the
# package's own __init__.py; cli and commands may import anything.
# (docs/architecture.md draws the same arrows).
ALLOWED = {
    "": {"core", "nn"},
    "core": {"core"},
    "runtime": {"core", "runtime"},
    "estimate": {"core", "estimate"},
    "nn": {"core", "estimate", "nn"},
    "data": {"core", "data"},
    "measure": {"core", "estimate", "nn", "measure"},
    "training": {"core", "runtime", "nn", "data", "training"},
    "experiments": {"core", "runtime", "estimate", "data", "training",
                    "experiments"},
}
ANYTHING = ("cli", "commands")
# Never TensorFlow, not even inside a function.
NO_TENSORFLOW = ("core", "runtime", "estimate")
# No TensorFlow at module level: what the light commands import.
LIGHT = ("cli", "commands", "experiments.sweep", "experiments.comparison")
# Imports TensorFlow only inside the hooks it installs (the stack's mends).
MENDS = PACKAGE + ".core.compat"
MAX_LINES = 700
TOP_LEVEL = {"__init__.py", "cli.py", "commands"}


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


Import = collections.namedtuple("Import", ["name", "line", "in_function"])


def _all_imports(name, path):
  """[Import] of every module name `name` imports (relative ones resolved)."""
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inner = in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, ast.Import):
        found.extend(Import(a.name, child.lineno, inner) for a in child.names)
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:  # relative: from the module's package upwards
          parts = name.split(".")[:None if path.endswith("__init__.py")
                                  else -1]
          parts = parts[:len(parts) - child.level + 1]
          base = ".".join(parts + ([base] if base else []))
        found.extend(Import(base + "." + a.name, child.lineno, inner)
                     for a in child.names)
      visit(child, inner)

  with open(path) as f:
    visit(ast.parse(f.read()), False)
  return found


def _resolve(imported, modules):
  """The module an imported name is: itself, or (`from pkg import name` of
  a name that is not a module) the module it comes from."""
  while imported and imported not in modules:
    imported = imported.rpartition(".")[0]
  return imported


def _imports(name, path, modules):
  """The package modules that the module `name` imports anywhere."""
  found = {_resolve(i.name, modules) for i in _all_imports(name, path)}
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


def package_of(module):
  """"nn" for mtf_talking_heads.nn.layers; "" for the package itself."""
  parts = module.split(".")[1:]
  if not parts:
    return ""
  return parts[0]


def _within(module, prefix):
  return module == PACKAGE + "." + prefix or module.startswith(
      PACKAGE + "." + prefix + ".")


def upward_imports():
  """["a.py:3 nn -> training (mtf_talking_heads.training)", ...]."""
  modules = _modules()
  bad = []
  for name, path in sorted(modules.items()):
    if package_of(name) in ANYTHING:
      continue
    allowed = ALLOWED.get(package_of(name), set())
    for i in _all_imports(name, path):
      target = _resolve(i.name, modules)
      if target and target not in (name, PACKAGE):
        to = package_of(target)
        if to not in allowed:
          bad.append("%s:%d %s -> %s (%s)" % (
              os.path.relpath(path, ROOT), i.line, package_of(name) or
              "__init__", to, target))
  return bad


def _heavy(i):
  return i.name.split(".")[0] in HEAVY


def _light_target(module):
  """Whether a light module may import `module` at module level."""
  return any(_within(module, p) for p in NO_TENSORFLOW + LIGHT) or (
      module == PACKAGE)


def tensorflow_imports():
  """["estimate/x.py:3 tensorflow", ...] that break NO_TENSORFLOW / LIGHT."""
  modules = _modules()
  bad = []
  for name, path in sorted(modules.items()):
    anywhere = any(_within(name, p) for p in NO_TENSORFLOW)
    light = any(_within(name, p) for p in LIGHT)
    for i in _all_imports(name, path):
      ours = _resolve(i.name, modules)
      if light and not i.in_function and ours and not _light_target(ours):
        bad.append("%s:%d %s" % (os.path.relpath(path, ROOT), i.line, ours))
      if not _heavy(i):
        continue
      if (anywhere and not (name == MENDS and i.in_function)) or (
          light and not i.in_function):
        bad.append("%s:%d %s" % (os.path.relpath(path, ROOT), i.line,
                                 i.name))
  return sorted(set(bad))


def _strategy_names():
  """strategy_table.NAMES, the module loaded by path (no package import)."""
  spec = importlib.util.spec_from_file_location(
      "_strategy_table", os.path.join(ROOT, PACKAGE, "estimate",
                                      "strategy_table.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return set(module.NAMES)


def _sources():
  """Every .py file of the package, the tests, benchmarks and launch."""
  for directory in (PACKAGE, "tests", "benchmarks", "launch"):
    for root, _, files in os.walk(os.path.join(ROOT, directory)):
      for f in sorted(files):
        if f.endswith(".py"):
          yield os.path.join(root, f)


def strategy_name_lists():
  """Literal tuples, lists, sets or dicts naming two strategies or more
  outside estimate/strategy_table.py: a second list of the names."""
  names = _strategy_names()
  table = os.path.join(ROOT, PACKAGE, "estimate", "strategy_table.py")
  bad = []
  for path in sorted(_sources()):
    if path == table or os.path.relpath(path, ROOT).startswith("tests"):
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
      elif isinstance(node, ast.Dict):
        items = node.keys
      else:
        continue
      strings = {e.value for e in items
                 if isinstance(e, ast.Constant) and e.value in names}
      if len(strings) >= 2:
        bad.append("%s:%d" % (os.path.relpath(path, ROOT), node.lineno))
  return bad


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


def test_packages_import_only_downwards():
  assert upward_imports() == []


def test_an_upward_import_inside_a_function_is_found(tmp_path, monkeypatch):
  package = tmp_path / PACKAGE
  for sub in ("estimate", "nn"):
    (package / sub).mkdir(parents=True)
    (package / sub / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  (package / "nn" / "layers.py").write_text("x = 1\n")
  (package / "estimate" / "planner.py").write_text(
      "def f():\n  from mtf_talking_heads.nn import layers\n  return layers\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  assert upward_imports() == [
      "mtf_talking_heads/estimate/planner.py:2 estimate -> nn "
      "(mtf_talking_heads.nn.layers)"]


def test_estimators_and_runtime_never_import_tensorflow():
  assert tensorflow_imports() == []


def test_a_tensorflow_import_inside_a_function_is_found(tmp_path,
                                                         monkeypatch):
  package = tmp_path / PACKAGE
  (package / "runtime").mkdir(parents=True)
  (package / "commands").mkdir()
  (package / "__init__.py").write_text("")
  (package / "runtime" / "__init__.py").write_text("")
  (package / "commands" / "__init__.py").write_text("")
  (package / "runtime" / "lock.py").write_text(
      "def f():\n  import tensorflow.compat.v1 as tf\n  return tf\n")
  (package / "commands" / "train.py").write_text(
      "import mesh_tensorflow as mtf\n"
      "def f():\n  import tensorflow\n  return tensorflow\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  assert tensorflow_imports() == [
      "mtf_talking_heads/commands/train.py:1 mesh_tensorflow",
      "mtf_talking_heads/runtime/lock.py:2 tensorflow.compat.v1"]


def test_top_level_holds_only_the_cli():
  top = {f for f in os.listdir(os.path.join(ROOT, PACKAGE))
         if f.endswith(".py") or f == "commands"}
  assert top == TOP_LEVEL


def test_no_source_file_over_700_lines():
  long_files = []
  for path in _sources():
    with open(path) as lines:
      n = sum(1 for _ in lines)
    if n > MAX_LINES:
      long_files.append("%s: %d" % (os.path.relpath(path, ROOT), n))
  assert long_files == []


def _gin_include_heads():
  """The first folder of every gin include path a user may write: this
  repository's gin/ folders and t5's (found without importing t5)."""
  heads = set()
  t5 = importlib.util.find_spec("t5")
  for gin_dir in (os.path.join(ROOT, "gin"), os.path.join(
      os.path.dirname(t5.origin), "models", "gin")):
    heads.update(d for d in os.listdir(gin_dir)
                 if os.path.isdir(os.path.join(gin_dir, d)))
  return heads


def test_no_test_folder_is_named_like_a_gin_include_folder():
  # tests/ is on sys.path under pytest, so tests/<name>/ is a namespace
  # package `name`; gin resolves `include 'name/x.gin'` by
  # importlib.util.find_spec(name) first and fails on a namespace package
  # (no origin: "expected str, bytes or os.PathLike object, not NoneType").
  folders = {d for d in os.listdir(os.path.join(ROOT, "tests"))
             if os.path.isdir(os.path.join(ROOT, "tests", d))}
  assert "experiments" in _gin_include_heads()
  assert folders & _gin_include_heads() == set()


def test_strategy_names_are_listed_once():
  assert len(_strategy_names()) == 6
  assert strategy_name_lists() == []

