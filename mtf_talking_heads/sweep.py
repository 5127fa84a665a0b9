"""Sweeps over attention configurations: the paper's tables, at any scale.

A sweep is a list of rows (attention configurations) times a number of seeds.
Rows come either from a paper table -- the gin experiment files under
``gin/experiments/<table>/``, one file per row, in file-name order, so the
grid is defined once, by the files the training uses -- or from explicit
values (``grid_rows``: ``heads=6,12,24,48`` with ``d_k=768/heads``).

Every row x seed is one training run through the training machinery: the
``mtf_th train`` and ``mtf_th eval`` commands, each in its own process (a
crash or a kill costs one run, never the sweep).  A run is finished when its
line is in ``<output_dir>/results.csv``; rerunning the same sweep skips
finished runs and continues the one that was in flight from its last
checkpoint.  After every run the
markdown table in the paper's layout (``results.md``) is rewritten, and at
the end the plots (``plot_heads.png``, ``plot_loss.png``,
``plot_step_time.png``).

Costs (params, multiplies per attention layer) come from costs.py: at base
scale with the paper's n = m = 512, at tiny scale with the model's actual
input length (the ``inputs_length`` macro), d_model from the configuration
(``d_model`` macro).  Dynamic projections are counted the paper's way
(folded, see docs/costs.md); the CSV also has the pseudocode's count, which
is what the layers execute.  Rows with talking heads in one placement only
have "various" costs, as in the paper.

Example:
  rows = paper_table_rows("t5_heads")
  sweep = Sweep(rows, output_dir="/tmp/t5_heads", scale="tiny", seeds=3,
                train_steps=1000, eval_steps=(250, 1000), table="t5_heads")
  sweep.run()          # or: print(sweep.dry_run_text())
"""
import collections
import csv
import glob
import itertools
import json
import math
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time

from gin import config_parser

from mtf_talking_heads import comparison
from mtf_talking_heads import costs
from mtf_talking_heads import gin_paths


class _LazyModule(object):
  """A module imported at its first attribute access.

  progress.py imports TensorFlow; `mtf_th sweep --list_paper_tables` and the
  plan of `--dry_run` must not pay for it.
  """

  def __init__(self, name):
    self._name = name

  def __getattr__(self, attr):
    import importlib  # pylint: disable=g-import-not-at-top
    return getattr(importlib.import_module(self._name), attr)


progress = _LazyModule("mtf_talking_heads.progress")

GIN_DIR = gin_paths.gin_dir()
EXPERIMENTS = "experiments"

# The macros every experiment file defines (docs/gin_guide.md).
ROW_MACROS = ("row_label", "variant", "heads_k", "heads", "heads_v", "d_k",
              "d_v", "dynamic", "placement")
VARIANTS = ("multi_head", "talking_heads", "project_logits",
            "project_weights", "general_bilinear", "dynamic_projections")
PLACEMENTS = ("all", "enc_self", "dec_self", "encdec")
SCALES = ("tiny", "small", "base")
# t5, bert, albert: the paper's models (models/<m>_base.gin, shrunk for CPU
# by models/<m>_tiny.gin).  lm, encdec: small models in the paper's regime
# (models/<m>_small.gin, h * d_k = d_model; shrunk for tests by
# models/<m>_tiny.gin); their tables run at scale "small".
MODELS = ("t5", "bert", "albert", "lm", "encdec")
SMALL_MODELS = ("lm", "encdec")
DIMS = ("heads_k", "heads", "heads_v", "d_k", "d_v")
GRID_KEYS = ("variant",) + DIMS
PAPER_LENGTH = costs.PAPER_LENGTH
# Paper: 65536 of 524288 steps for the early ln(PPL) column.
EARLY_FRACTION = 8
LABELS = {"multi_head": "multi-head", "talking_heads": "talking-heads",
          "project_logits": "project logits",
          "project_weights": "project weights",
          "general_bilinear": "general bilinear",
          "dynamic_projections": "dyn. proj."}

RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
MANIFEST = "sweep.json"
PLOTS = ("plot_heads.png", "plot_loss.png", "plot_step_time.png")
CURVES_PLOT = "plot_curves.png"  # held-out ln(PPL) vs steps and vs seconds
RESULT_COLUMNS = (
    "table", "row", "row_label", "variant", "heads_k", "heads", "heads_v",
    "d_k", "d_v", "dynamic", "placement", "scale", "seed", "early_step",
    "early_ln_ppl", "final_step", "final_ln_ppl", "step_time_sec", "params",
    "multiplies", "multiplies_executed", "d_model", "cost_length",
    "wall_sec", "cpu_sec", "model_dir")

Row = collections.namedtuple("Row", [
    "name", "label", "variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
    "dynamic", "placement", "gin_files", "gin_params"])
Row.__doc__ = """One attention configuration of a sweep.

Attributes:
  name: file-system id, unique in the sweep ("06_talking_heads_12_64").
  label: the paper's first column ("talking-heads").
  variant: one of VARIANTS.
  heads_k, heads, heads_v, d_k, d_v: ints (the experiment's macros).
  dynamic: tuple of dynamic-projection terms.
  placement: one of PLACEMENTS (where the variant is used; multi-head
    elsewhere).
  gin_files: gin files (relative to gin/) that configure the row at base
    scale, in order.
  gin_params: gin bindings applied after them.
"""


# ---------------------------------------------------------------------------
# Reading gin files with gin's parser but not its global configuration:
# macros only (no configurable is resolved, gin's state is left alone).

class _Reference(collections.namedtuple("_Reference", ["name", "evaluate"])):
  """A configurable reference (@name or @name()) met while reading macros."""

  def __str__(self):
    return "@" + self.name + ("()" if self.evaluate else "")


class _MacroRef(collections.namedtuple("_MacroRef", ["name"])):
  """A macro reference (%name), resolved after all files are read."""


class _Delegate(config_parser.ParserDelegate):

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _MacroRef(macro_name)


def _gin_path(name, including_file=None, gin_dir=GIN_DIR):
  """Resolves an include / --gin_file the way our gin search path does."""
  candidates = [name] if os.path.isabs(name) else [os.path.join(gin_dir, name)]
  if including_file and not os.path.isabs(name):
    candidates.append(os.path.join(os.path.dirname(including_file), name))
  for path in candidates:
    if os.path.isfile(path):
      return path
  raise ValueError("gin file %r not found (looked in %s)"
                   % (name, ", ".join(candidates)))


def _read_statements(text, filename):
  try:
    return list(config_parser.ConfigParser(text, _Delegate()))
  except SyntaxError as e:
    raise ValueError("%s: gin syntax error: %s" % (filename, e)) from None


def _collect(path, macros, gin_dir, includes, stack=()):
  if path in stack:
    raise ValueError("gin include cycle: %s" % " -> ".join(stack + (path,)))
  with open(path) as f:
    statements = _read_statements(f.read(), path)
  for statement in statements:
    if isinstance(statement, config_parser.IncludeStatement):
      included = _gin_path(statement.filename, path, gin_dir)
      includes.append(statement.filename)
      _collect(included, macros, gin_dir, includes, stack + (path,))
    elif (isinstance(statement, config_parser.BindingStatement)
          and not statement.scope and not statement.arg_name
          and "." not in statement.selector):
      macros[statement.selector] = statement.value


def _resolve(value, macros, seen=()):
  if isinstance(value, _MacroRef):
    if value.name in seen:
      raise ValueError("gin macro cycle: %s" % " -> ".join(seen + (value.name,)))
    if value.name not in macros:
      raise ValueError("gin macro %%%s is used but never defined" % value.name)
    return _resolve(macros[value.name], macros, seen + (value.name,))
  if isinstance(value, list) or type(value) is tuple:  # not _Reference
    return type(value)(_resolve(v, macros, seen) for v in value)
  if isinstance(value, dict):
    return {k: _resolve(v, macros, seen) for k, v in value.items()}
  return value


class GinConfig(object):
  """The macros of a list of gin files and bindings.

  Reads the files with gin's own parser but never touches gin's global
  configuration (training.parse_gin clears it; a sweep reads dozens of
  configurations, and tests share one process), and resolves no
  configurable.  Follows ``include`` statements (relative to gin/, like the
  training command's search path) and lets later bindings override earlier
  ones, as gin does.  Only macros (``name = value`` at top level) are kept.

  Attributes:
    includes: every file included, in reading order.
  """

  def __init__(self, gin_files=(), gin_params=(), gin_dir=GIN_DIR):
    self._macros = {}
    self.includes = []
    for name in gin_files:
      path = _gin_path(name, None, gin_dir)
      self.includes.append(name)
      _collect(path, self._macros, gin_dir, self.includes)
    for binding in gin_params:
      for statement in _read_statements(binding, "gin_param %r" % binding):
        if isinstance(statement, config_parser.IncludeStatement):
          path = _gin_path(statement.filename, None, gin_dir)
          self.includes.append(statement.filename)
          _collect(path, self._macros, gin_dir, self.includes)
        elif (not statement.scope and not statement.arg_name
              and "." not in statement.selector):
          self._macros[statement.selector] = statement.value

  def __contains__(self, name):
    return name in self._macros

  def get(self, name, default=None):
    """The value of macro `name` (macro references resolved)."""
    if name not in self._macros:
      return default
    return _resolve(self._macros[name], self._macros)

  def require(self, name, where):
    if name not in self._macros:
      raise ValueError("%s does not define the gin macro %r" % (where, name))
    return self.get(name)


# ---------------------------------------------------------------------------
# Rows from paper tables.

def paper_table_names(gin_dir=GIN_DIR):
  """The paper tables: the directories of gin/experiments/ with gin files."""
  root = os.path.join(gin_dir, EXPERIMENTS)
  if not os.path.isdir(root):
    return []
  return sorted(d for d in os.listdir(root)
                if os.path.isdir(os.path.join(root, d)) and any(
                    f.endswith(".gin") for f in os.listdir(os.path.join(root, d))))


def _positive_int(value, name, where):
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError("%s: %s must be a positive integer, got %r"
                     % (where, name, value))
  return value


def _check_row(row, where):
  """Validates a Row's macros; raises ValueError naming `where` and the macro."""
  if row.variant not in VARIANTS:
    raise ValueError("%s: variant=%r is not one of %s"
                     % (where, row.variant, ", ".join(VARIANTS)))
  for name in DIMS:
    _positive_int(getattr(row, name), name, where)
  if row.placement not in PLACEMENTS:
    raise ValueError("%s: placement=%r is not one of %s"
                     % (where, row.placement, ", ".join(PLACEMENTS)))
  if not isinstance(row.label, str) or not row.label:
    raise ValueError("%s: row_label must be a non-empty string, got %r"
                     % (where, row.label))
  if row.variant == "dynamic_projections" and not row.dynamic:
    raise ValueError("%s: variant 'dynamic_projections' needs a non-empty "
                     "dynamic list" % where)
  if row.variant != "dynamic_projections" and row.dynamic:
    raise ValueError("%s: dynamic=%r is only meaningful for variant "
                     "'dynamic_projections', not %r"
                     % (where, list(row.dynamic), row.variant))
  variant, hk, h, hv, dk, dv, _, _, dynamic = _cost_args(row, 1)
  try:  # the heads / dims / dynamic terms must fit the variant
    costs.resolve_config(variant, hk, h, hv, dk, dv, d_model=1, length=1,
                         dynamic=dynamic)
  except ValueError as e:
    raise ValueError("%s: %s" % (where, e)) from None
  return row


def paper_table_rows(table, gin_dir=GIN_DIR):
  """The rows of a paper table, from gin/experiments/<table>/*.gin.

  Args:
    table: a name from paper_table_names().
    gin_dir: the gin root.

  Returns:
    [Row] in file-name order (= the paper's row order).

  Raises:
    ValueError: unknown table, or a file missing / misdefining a macro.
  """
  names = paper_table_names(gin_dir)
  if table not in names:
    raise ValueError("paper_table=%r is unknown; choose one of: %s"
                     % (table, ", ".join(names) or "(no gin/experiments)"))
  folder = os.path.join(EXPERIMENTS, table)
  rows = []
  for filename in sorted(os.listdir(os.path.join(gin_dir, folder))):
    if not filename.endswith(".gin"):
      continue
    rel = os.path.join(folder, filename)
    config = GinConfig([rel], gin_dir=gin_dir)
    values = {m: config.require(m, rel) for m in ROW_MACROS}
    dynamic = values["dynamic"]
    if not isinstance(dynamic, (list, tuple)):
      raise ValueError("%s: dynamic must be a list, got %r" % (rel, dynamic))
    row = Row(name=filename[:-len(".gin")], label=values["row_label"],
              variant=values["variant"],
              **{d: values[d] for d in DIMS},
              dynamic=tuple(dynamic), placement=values["placement"],
              gin_files=(rel,), gin_params=())
    rows.append(_check_row(row, rel))
  return rows


def table_caption(table, gin_dir=GIN_DIR):
  """The paper table named in the first experiment file's header comment."""
  folder = os.path.join(gin_dir, EXPERIMENTS, table)
  first = sorted(f for f in os.listdir(folder) if f.endswith(".gin"))[0]
  with open(os.path.join(folder, first)) as f:
    for line in f:
      match = re.match(r"#\s*Paper table (.*), row \d+:", line)
      if match:
        return match.group(1)
  return table


def select_rows(rows, spec):
  """The rows numbered in `spec` ("1-8", "1,3,5-6"; 1-based, paper order)."""
  if not spec:
    return list(rows)
  chosen = []
  for part in spec.split(","):
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
    if not match:
      raise ValueError("rows=%r: expected numbers and ranges like 1-8,10"
                       % spec)
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if not 1 <= first <= last <= len(rows):
      raise ValueError("rows=%r: %r is outside 1-%d" % (spec, part, len(rows)))
    chosen.extend(range(first, last + 1))
  if len(set(chosen)) != len(chosen):
    raise ValueError("rows=%r names a row twice" % spec)
  return [rows[i - 1] for i in chosen]


# ---------------------------------------------------------------------------
# Rows from explicit values: --grid heads=6,12 --tie d_k=768/heads.

_TIE = re.compile(r"^\s*(?:(?P<n1>\d+)\s*(?P<op1>[*/])\s*(?P<d1>[a-z_]+)|"
                  r"(?P<d2>[a-z_]+)\s*(?P<op2>[*/])\s*(?P<n2>\d+)|"
                  r"(?P<d3>[a-z_]+)|(?P<n3>\d+))\s*$")


def parse_grid(specs):
  """{key: [values]} from ["heads=6,12,24", "variant=multi_head,talking_heads"].

  Raises:
    ValueError: unknown key (naming it and the known ones), a key given
      twice, or a value that is not a positive integer (dims) / a variant.
  """
  grid = collections.OrderedDict()
  for spec in specs:
    key, sep, values = spec.partition("=")
    key = key.strip()
    if not sep or not values.strip():
      raise ValueError("grid %r: expected NAME=V1,V2,... e.g. heads=6,12,24"
                       % spec)
    if key not in GRID_KEYS:
      raise ValueError("grid: unknown dim %r in %r; choose from %s"
                       % (key, spec, ", ".join(GRID_KEYS)))
    if key in grid:
      raise ValueError("grid: %r is given twice" % key)
    items = [v.strip() for v in values.split(",")]
    if key == "variant":
      for v in items:
        if v not in VARIANTS:
          raise ValueError("grid: variant %r is unknown; choose from %s"
                           % (v, ", ".join(VARIANTS)))
    else:
      parsed = []
      for v in items:
        if not v.isdigit() or int(v) <= 0:
          raise ValueError("grid: %s value %r is not a positive integer"
                           % (key, v))
        parsed.append(int(v))
      items = parsed
    if len(set(items)) != len(items):
      raise ValueError("grid: %s lists a value twice in %r" % (key, spec))
    grid[key] = items
  return grid


def parse_ties(specs):
  """{dim: (kind, number, other_dim)} from ["d_k=768/heads", "heads_v=heads"].

  kind is "div" (number / other), "rdiv" (other / number), "mul" (number *
  other), "same" (other) or "const" (number).

  Raises:
    ValueError: unknown dim on either side, malformed expression, or a dim
      tied twice.
  """
  ties = collections.OrderedDict()
  for spec in specs:
    key, sep, expr = spec.partition("=")
    key = key.strip()
    if not sep:
      raise ValueError("tie %r: expected DIM=EXPR, e.g. d_k=768/heads" % spec)
    if key not in DIMS:
      raise ValueError("tie: unknown dim %r in %r; choose from %s"
                       % (key, spec, ", ".join(DIMS)))
    if key in ties:
      raise ValueError("tie: %r is tied twice" % key)
    match = _TIE.match(expr)
    if not match:
      raise ValueError("tie %r: expected INT/DIM, DIM/INT, INT*DIM, DIM*INT, "
                       "DIM or INT on the right" % spec)
    g = match.groupdict()
    if g["d1"]:
      tie = ("div" if g["op1"] == "/" else "mul", int(g["n1"]), g["d1"])
    elif g["d2"]:
      tie = ("rdiv" if g["op2"] == "/" else "mul", int(g["n2"]), g["d2"])
    elif g["d3"]:
      tie = ("same", None, g["d3"])
    else:
      tie = ("const", int(g["n3"]), None)
    if tie[2] is not None and tie[2] not in DIMS:
      raise ValueError("tie %r: unknown dim %r on the right; choose from %s"
                       % (spec, tie[2], ", ".join(DIMS)))
    if tie[2] == key:
      raise ValueError("tie %r ties %s to itself" % (spec, key))
    if tie[1] == 0:
      raise ValueError("tie %r: the number must be positive" % spec)
    ties[key] = tie
  return ties


def _tie_text(key, tie):
  kind, number, other = tie
  return "%s=%s" % (key, {"div": "%s/%s" % (number, other),
                          "rdiv": "%s/%s" % (other, number),
                          "mul": "%s*%s" % (number, other),
                          "same": str(other), "const": str(number)}[kind])


def _apply_tie(key, tie, values):
  kind, number, other = tie
  if kind == "const":
    return number
  x = values[other]
  if kind == "same":
    return x
  if kind == "mul":
    return number * x
  num, den = (number, x) if kind == "div" else (x, number)
  if num % den:
    raise ValueError(
        "tie %s is inconsistent with %s=%d: %d/%d = %.4g is not an integer; "
        "choose %s values that divide evenly"
        % (_tie_text(key, tie), other, x, num, den, num / den, other))
  return num // den


def _attention_file(variant):
  return "attention/%s.gin" % variant


def _placement_binding(variant, placement, gin_dir):
  """The `<placement>_attention = @...` binding that puts `variant` there."""
  macro = placement + "_attention"
  value = GinConfig([_attention_file(variant)], gin_dir=gin_dir).get(macro)
  if not isinstance(value, _Reference):
    raise ValueError("%s does not bind the macro %r"
                     % (_attention_file(variant), macro))
  return "%s = %s" % (macro, value)


def grid_rows(grid, ties=None, variant=None, dynamic=(), placement="all",
              model="t5", gin_dir=GIN_DIR):
  """Rows for every combination of the grid's values.

  Dims neither in the grid nor tied default to: heads_k = heads_v = heads,
  d_v = d_k.  heads and d_k have no default (general_bilinear: d_k = d_v =
  d_model, ignored).

  Args:
    grid: {key: [values]} (parse_grid); keys from GRID_KEYS.
    ties: {dim: tie} (parse_ties); a tied dim may not also be in the grid.
    variant: the variant when "variant" is not a grid key.
    dynamic: dynamic-projection terms (variant dynamic_projections).
    placement: where the variant goes (multi-head elsewhere).
    model: t5, bert or albert (gin/models/<model>_base.gin), or lm or
      encdec (gin/models/<model>_small.gin; run them at scale "small").
    gin_dir: the gin root.

  Returns:
    [Row], the grid's first key varying slowest.

  Raises:
    ValueError: naming the grid key / tie / macro at fault, before any run.
  """
  ties = dict(ties or {})
  grid = collections.OrderedDict(grid)
  if model not in MODELS:
    raise ValueError("model=%r is unknown; choose from %s"
                     % (model, ", ".join(MODELS)))
  if placement not in PLACEMENTS:
    raise ValueError("placement=%r is unknown; choose from %s"
                     % (placement, ", ".join(PLACEMENTS)))
  if variant is not None and variant not in VARIANTS:
    raise ValueError("variant=%r is unknown; choose from %s"
                     % (variant, ", ".join(VARIANTS)))
  if "variant" in grid and variant is not None:
    raise ValueError("variant is both a grid key and --variant; give one")
  if "variant" not in grid:
    if variant is None:
      raise ValueError("variant is required (--variant NAME or --grid "
                       "variant=multi_head,talking_heads)")
    grid["variant"] = [variant]
    grid.move_to_end("variant", last=False)
  for key in ties:
    if key in grid:
      raise ValueError("%s is both a grid key and tied (%s); give one"
                       % (key, _tie_text(key, ties[key])))
  for key, default in (("heads_k", "heads"), ("heads_v", "heads"),
                       ("d_v", "d_k")):
    if key not in grid and key not in ties:
      ties[key] = ("same", None, default)
  for key in ("heads", "d_k"):
    if key not in grid and key not in ties:
      if key == "d_k" and grid["variant"] == ["general_bilinear"]:
        ties[key] = ("const", 1, None)  # unused: d_k = d_model
        continue
      raise ValueError("%s has no value: give --grid %s=... or --tie %s=..."
                       % (key, key, "d_k=768/heads" if key == "d_k" else
                          "heads=..."))
  order = _tie_order(ties, grid)
  dynamic = tuple(dynamic)
  if dynamic and "dynamic_projections" not in grid["variant"]:
    raise ValueError("dynamic=%s is only used by variant "
                     "'dynamic_projections', which the grid does not have"
                     % ",".join(dynamic))
  rows = []
  keys = list(grid)
  for combo in itertools.product(*(grid[k] for k in keys)):
    values = dict(zip(keys, combo))
    for key in order:
      values[key] = _apply_tie(key, ties[key], values)
    v = values["variant"]
    if v == "general_bilinear":
      values["d_k"] = values["d_v"] = 1
    name = "%s_hk%d_h%d_hv%d_dk%d_dv%d" % (
        v, values["heads_k"], values["heads"], values["heads_v"],
        values["d_k"], values["d_v"])
    if v == "general_bilinear":
      name = "%s_h%d" % (v, values["heads"])
    row_dynamic = dynamic if v == "dynamic_projections" else ()
    if v == "dynamic_projections" and not row_dynamic:
      row_dynamic = tuple(costs.DYNAMIC_TERMS)
    if row_dynamic and row_dynamic != tuple(costs.DYNAMIC_TERMS):
      name += "_" + "_".join(row_dynamic)
    size = "small" if model in SMALL_MODELS else "base"
    gin_files = ["models/%s_%s.gin" % (model, size), _attention_file(v)]
    used = _referenced_macros(gin_files, gin_dir)
    # only the dims the variant reads (training refuses a macro nothing uses)
    gin_params = ["%s = %d" % (d, values[d]) for d in DIMS if d in used
                  and not (v == "general_bilinear" and d in ("d_k", "d_v"))]
    if v == "dynamic_projections":
      gin_params.append("dynamic = %s" % json.dumps(list(row_dynamic)))
    label = LABELS[v]
    if placement != "all":
      gin_files.append(_attention_file("multi_head"))
      gin_params.append(_placement_binding(v, placement, gin_dir))
      name += "_" + placement
      label = "%s-%s" % ("DP" if v == "dynamic_projections" else "TH",
                         placement.replace("_", "-"))
    row = Row(name=name, label=label, variant=v,
              **{d: values[d] for d in DIMS}, dynamic=row_dynamic,
              placement=placement, gin_files=tuple(gin_files),
              gin_params=tuple(gin_params))
    rows.append(_check_row(row, "grid row %s" % name))
  names = [r.name for r in rows]
  if len(set(names)) != len(names):
    raise ValueError("grid: some combinations give the same configuration "
                     "(%s); remove the duplicate values"
                     % ", ".join(sorted({n for n in names
                                         if names.count(n) > 1})))
  return rows


def _referenced_macros(gin_files, gin_dir):
  """Names of the macros that gin files reference as %name (not includes)."""
  used = set()
  for name in gin_files:
    with open(_gin_path(name, gin_dir=gin_dir)) as f:
      used.update(re.findall(r"%([A-Za-z_][A-Za-z0-9_]*)", f.read()))
  return used


def _tie_order(ties, grid):
  """Tied dims in an order where each one's right-hand side is known."""
  order, known = [], set(grid)
  pending = dict(ties)
  while pending:
    ready = [k for k, t in pending.items() if t[2] is None or t[2] in known]
    if not ready:
      missing = sorted({t[2] for t in pending.values()} - known - set(pending))
      if missing:
        raise ValueError("tie refers to %s, which is neither a grid key nor "
                         "tied" % ", ".join(missing))
      raise ValueError("ties form a cycle: %s" % ", ".join(
          _tie_text(k, t) for k, t in pending.items()))
    for key in ready:
      order.append(key)
      known.add(key)
      del pending[key]
  return order


# ---------------------------------------------------------------------------
# Scale and costs.

def model_and_size(row, gin_dir=GIN_DIR):
  """(model, size): which models/<model>_<size>.gin the row includes, size
  "base" (the paper's models) or "small" (the small-regime models)."""
  config = GinConfig(row.gin_files, row.gin_params, gin_dir=gin_dir)
  found = [(m, size) for m in MODELS for size in ("base", "small")
           if "models/%s_%s.gin" % (m, size) in config.includes]
  if len(found) != 1:
    raise ValueError("row %s: cannot tell its model (it should include "
                     "exactly one of models/{%s}_base.gin or "
                     "models/{lm,encdec}_small.gin)"
                     % (row.name, ",".join(MODELS[:3])))
  return found[0]


def model_of(row, gin_dir=GIN_DIR):
  """'t5', 'bert', 'albert', 'lm' or 'encdec' (see model_and_size)."""
  return model_and_size(row, gin_dir)[0]


def scale_files(row, scale, gin_dir=GIN_DIR):
  """The gin files that put `row` at `scale` (after the row's own files).

  A row of a paper-size model runs at "base" (its own files) or "tiny"; a
  row of a small-regime model at "small" (its own files) or "tiny".
  """
  if scale not in SCALES:
    raise ValueError("scale=%r is unknown; choose from %s"
                     % (scale, ", ".join(SCALES)))
  model, size = model_and_size(row, gin_dir)
  if scale == "tiny":
    return ("models/%s_tiny.gin" % model,)
  if scale != size:
    raise ValueError("row %s is a %s model (models/%s_%s.gin): use --scale "
                     "%s or tiny, not %s" % (row.name, size, model, size,
                                             size, scale))
  return ()


def _cost_args(row, d_model):
  variant = row.variant
  dynamic = ()
  if variant == "dynamic_projections":
    variant, dynamic = "talking_heads", row.dynamic
  heads_k, heads_v, d_k, d_v = row.heads_k, row.heads_v, row.d_k, row.d_v
  if variant == "general_bilinear":
    d_k = d_v = None
  return (variant, heads_k, row.heads, heads_v, d_k, d_v, d_model, None,
          dynamic)


def row_costs(row, d_model, length):
  """(params, multiplies as the paper counts, multiplies executed) or Nones.

  One attention layer with n = m = length.  Rows whose variant is in one
  placement only have no single figure (the paper prints "various").
  """
  if row.placement != "all":
    return None, None, None
  variant, hk, h, hv, dk, dv, d, _, dynamic = _cost_args(row, d_model)
  folded = costs.attention_costs(variant, hk, h, hv, dk, dv, d, length,
                                 dynamic=dynamic, fold_dynamic=True)
  executed = costs.attention_costs(variant, hk, h, hv, dk, dv, d, length,
                                   dynamic=dynamic, fold_dynamic=False)
  return folded["params"], folded["multiplies"], executed["multiplies"]


# ---------------------------------------------------------------------------
# Runs.

Run = collections.namedtuple("Run", ["row", "seed", "model_dir", "commands"])
Run.__doc__ = """One row x seed: its directory and the mtf_th commands it runs."""


def _int_list(text, name):
  try:
    values = [int(v) for v in str(text).split(",") if v.strip()]
  except ValueError:
    raise ValueError("%s=%r: expected comma-separated integers" % (name, text))
  return values


class Sweep(object):
  """Rows x seeds, trained and evaluated through `mtf_th train` / `mtf_th eval`.

  Args:
    rows: [Row] (paper_table_rows or grid_rows).
    output_dir: where runs/, results.csv, results.md and the plots go.
    scale: "tiny" or "base".
    seeds: number of seeds (seed macro = 1, 2, ...).
    train_steps: steps per run; default: the configuration's `train_steps`
      macro (524288 at base, 2000 at tiny for T5).
    eval_steps: the two steps at which ln(PPL) is measured (ascending, the
      last = train_steps); default train_steps / 8 and train_steps, like the
      paper's 65536 / 524288.
    table: the paper table's name (or a label for a grid sweep).
    gin_files: extra gin files after the scale's (e.g. layouts/...).
    gin_params: extra bindings after everything (e.g. "mesh_shape='model:2'").
    launcher: argv prefix that runs `mtf_th` (default: this Python).
    tpu, tpu_zone, gcp_project: a Cloud TPU: every command gets --tpu etc.
      (see dry_run_text).
    gin_dir: the gin root.
    log: where progress lines go (default sys.stdout).

  Raises:
    ValueError: any bad argument, before anything runs.
  """

  def __init__(self, rows, output_dir, scale="tiny", seeds=1,
               train_steps=None, eval_steps=None, table="grid", gin_files=(),
               gin_params=(), launcher=None, tpu=None, tpu_zone=None,
               gcp_project=None, gin_dir=GIN_DIR, log=None):
    if not rows:
      raise ValueError("rows: the sweep has no rows")
    if scale not in SCALES:
      raise ValueError("scale=%r is unknown; choose from %s"
                       % (scale, ", ".join(SCALES)))
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
      raise ValueError("seeds must be a positive integer, got %r" % (seeds,))
    if not output_dir:
      raise ValueError("output_dir is required")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
      raise ValueError("rows: duplicate row names %s" % names)
    self.rows = list(rows)
    self.output_dir = output_dir
    self.scale = scale
    self.seeds = seeds
    self.table = table
    self.extra_files = tuple(gin_files)
    self.extra_params = tuple(gin_params)
    self.launcher = list(launcher or [sys.executable, "-m",
                                      "mtf_talking_heads.cli"])
    self.tpu_flags = []
    for flag, value in (("--tpu", tpu), ("--tpu_zone", tpu_zone),
                        ("--gcp_project", gcp_project)):
      if value:
        self.tpu_flags += [flag, value]
    if self.tpu_flags and not tpu:
      raise ValueError("tpu_zone / gcp_project need tpu (--tpu NAME)")
    self.gin_dir = gin_dir
    self.log = log or sys.stdout
    self._configs = {}
    for row in self.rows:  # also checks that every gin file exists
      self._configs[row.name] = GinConfig(self.row_files(row),
                                          self.row_params(row, seed=1),
                                          gin_dir=gin_dir)
    self.train_steps, self.eval_steps = self._steps(train_steps, eval_steps)
    self.d_model = {}
    self.cost_length = {}
    for row in self.rows:
      config = self._configs[row.name]
      self.d_model[row.name] = _positive_int(
          config.require("d_model", row.name), "d_model", row.name)
      self.cost_length[row.name] = (
          PAPER_LENGTH if scale == "base" else _positive_int(
              config.require("inputs_length", row.name), "inputs_length",
              row.name))

  # ------------------------------------------------------------ configuration
  def row_files(self, row):
    """Gin files of one run: the row's, the scale's, then the extra ones."""
    return (tuple(row.gin_files) + tuple(scale_files(row, self.scale,
                                                     self.gin_dir))
            + self.extra_files)

  def row_params(self, row, seed):
    """Gin bindings of one run (after all files)."""
    return tuple(row.gin_params) + ("seed = %d" % seed,) + self.extra_params

  def _steps(self, train_steps, eval_steps):
    if eval_steps is not None and not isinstance(eval_steps, (list, tuple)):
      eval_steps = _int_list(eval_steps, "eval_steps")
    if train_steps is None:
      if eval_steps:
        train_steps = max(eval_steps)
      else:
        defaults = {self._configs[r.name].require("train_steps", r.name)
                    for r in self.rows}
        if len(defaults) != 1:
          raise ValueError("train_steps: the rows' configurations disagree "
                           "(%s); give --train_steps" % sorted(defaults))
        train_steps, = defaults
    _positive_int(train_steps, "train_steps", "sweep")
    if eval_steps is None:
      eval_steps = [max(1, train_steps // EARLY_FRACTION), train_steps]
    eval_steps = list(eval_steps)
    if len(eval_steps) < 2:
      raise ValueError("eval_steps=%r: give at least two steps, an early one "
                       "and the last (like the paper's 65536,524288); more "
                       "give each run a held-out curve" % (eval_steps,))
    for s in eval_steps:
      _positive_int(s, "eval_steps", "sweep")
    if any(a >= b for a, b in zip(eval_steps, eval_steps[1:])):
      raise ValueError("eval_steps=%r must be ascending" % (eval_steps,))
    if eval_steps[-1] != train_steps:
      raise ValueError("eval_steps=%r: the last must equal train_steps=%d"
                       % (eval_steps, train_steps))
    return train_steps, tuple(eval_steps)

  def runs(self):
    """Every Run, seed-major: every row with seed 1 first, so that a sweep
    stopped early still has a whole table."""
    return [Run(row, seed, self.model_dir(row, seed),
                self.commands(row, seed))
            for seed in range(1, self.seeds + 1) for row in self.rows]

  def model_dir(self, row, seed):
    return os.path.join(self.output_dir, "runs", row.name, "seed_%d" % seed)

  def _gin_args(self, row, seed):
    args = []
    for f in self.row_files(row):
      args += ["--gin_file", f]
    for p in self.row_params(row, seed):
      args += ["--gin_param", p]
    args += ["--gin_param", "train_steps = %d" % self.train_steps]
    return args

  def train_gin(self, row, seed=1):
    """(gin_files, gin_params) that the run's first `mtf_th train` parses.

    Its --train_steps is included as the binding `mtf_th train` adds, so
    training.parse_gin(*sweep.train_gin(row)) then training.preflight()
    checks exactly what that command will check.
    """
    steps = self._train_segments(row)[0]
    params = self.row_params(row, seed) + (
        "train_steps = %d" % self.train_steps,
        "utils.run.train_steps = %d" % steps)
    return list(self.row_files(row)), list(params)

  def _train_segments(self, row):
    """The --train_steps of each `mtf_th train` call of a run.

    One call when every eval step falls on a regular checkpoint
    (save_checkpoints_steps divides it), else one call per eval step (each
    call ends with a checkpoint).
    """
    every = self._configs[row.name].get("save_checkpoints_steps")
    if isinstance(every, int) and every > 0 and all(
        s % every == 0 for s in self.eval_steps):
      return [self.eval_steps[-1]]
    return list(self.eval_steps)

  def commands(self, row, seed):
    """The argv lists (starting with "mtf_th") of one run, in order."""
    model_dir = self.model_dir(row, seed)
    gin = self._gin_args(row, seed)
    tpu = self.tpu_flags
    keep = ["--keep_checkpoint_steps", ",".join(map(str, self.eval_steps))]
    cmds = [["mtf_th", "train", "--model_dir", model_dir] + gin + tpu
            + keep + ["--train_steps", str(steps)]
            for steps in self._train_segments(row)]
    cmds.append(["mtf_th", "eval", "--model_dir", model_dir] + gin + tpu
                + ["--checkpoint_steps",
                   ",".join(str(s) for s in self.eval_steps)])
    return cmds

  def manifest(self):
    """What must not change between invocations sharing an output_dir."""
    return dict(
        table=self.table, scale=self.scale, train_steps=self.train_steps,
        eval_steps=list(self.eval_steps),
        extra_gin_files=list(self.extra_files),
        extra_gin_params=list(self.extra_params),
        rows=[dict(r._asdict(), dynamic=list(r.dynamic),
                   gin_files=list(r.gin_files), gin_params=list(r.gin_params))
              for r in self.rows])

  # ------------------------------------------------------------ results
  def cost_record(self, row):
    params, mults, executed = row_costs(row, self.d_model[row.name],
                                        self.cost_length[row.name])
    return dict(params=params, multiplies=mults, multiplies_executed=executed,
                d_model=self.d_model[row.name],
                cost_length=self.cost_length[row.name])

  def _row_record(self, row, seed):
    record = dict(table=self.table, row=row.name, row_label=row.label,
                  variant=row.variant, dynamic=",".join(row.dynamic),
                  placement=row.placement, scale=self.scale, seed=seed,
                  early_step=self.eval_steps[0],
                  final_step=self.eval_steps[-1],
                  model_dir=self.model_dir(row, seed))
    record.update({d: getattr(row, d) for d in DIMS})
    if row.variant == "general_bilinear":  # no d_k, d_v of its own
      record["d_k"] = record["d_v"] = self.d_model[row.name]
    record.update(self.cost_record(row))
    return record

  def results_path(self):
    return os.path.join(self.output_dir, RESULTS_CSV)

  def read_results(self):
    """Recorded runs: {(row name, seed): record} (strings as in the CSV)."""
    path = self.results_path()
    if not os.path.exists(path):
      return {}
    with open(path) as f:
      return {(r["row"], int(r["seed"])): r for r in csv.DictReader(f)}

  def _append_result(self, record):
    path = self.results_path()
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
      writer = csv.writer(f, lineterminator="\n")
      if new:
        writer.writerow(RESULT_COLUMNS)
      writer.writerow(["" if record[c] is None else record[c]
                       for c in RESULT_COLUMNS])
      f.flush()
      os.fsync(f.fileno())

  # ------------------------------------------------------------ running
  def _check_manifest(self):
    path = os.path.join(self.output_dir, MANIFEST)
    mine = self.manifest()
    if os.path.exists(path):
      with open(path) as f:
        theirs = json.load(f)
      different = sorted(k for k in mine if mine[k] != theirs.get(k))
      if different == ["rows"] and all(r in mine["rows"]
                                       for r in theirs["rows"]):
        different = []  # more rows: the sweep grows, recorded runs stay
      if different:
        raise ValueError(
            "output_dir=%r holds a sweep with other settings (%s differ; "
            "see %s); use a new --output_dir, or the same settings to resume "
            "(adding rows is allowed)"
            % (self.output_dir, ", ".join(different), path))
      if mine["rows"] != theirs["rows"]:
        with open(path, "w") as f:
          json.dump(mine, f, indent=1)
    else:
      os.makedirs(self.output_dir, exist_ok=True)
      with open(path, "w") as f:
        json.dump(mine, f, indent=1)

  def _say(self, text):
    self.log.write(text + "\n")
    self.log.flush()

  def _execute(self, run):
    """Runs one row x seed; returns its record.

    A run stopped in flight (killed, machine stopped) continues from its
    last checkpoint: `mtf_th train` resumes and skips the batches it has
    seen, so the run follows the same curve as an uninterrupted one.  Wall
    and CPU seconds add up over the pieces (RUN_TIME in the run directory).
    """
    if os.path.isdir(run.model_dir) and not glob.glob(
        os.path.join(run.model_dir, "model.ckpt-*.index")):
      shutil.rmtree(run.model_dir)  # nothing to resume from (e.g. only the
      # small files a commit carried to another machine): start over
    os.makedirs(run.model_dir, exist_ok=True)
    log_path = os.path.join(run.model_dir, "sweep.log")
    spent = _read_run_time(run.model_dir)
    start = time.time()
    cpu_start = _children_cpu_seconds()
    for argv in run.commands:
      argv = self.launcher + argv[1:]
      with open(log_path, "a") as log:
        log.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
        log.flush()
        began = time.time()
        try:  # an interrupted piece's time counts too (Ctrl-C, SIGTERM)
          code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
        finally:
          _write_run_time(run.model_dir, spent, time.time() - start,
                          _children_cpu_seconds() - cpu_start)
        log.write("# exit status %d after %.1f s\n" % (code,
                                                      time.time() - began))
      if code != 0:
        with open(log_path) as log:
          tail = "".join(log.readlines()[-15:])
        raise RuntimeError(
            "run %s seed %d failed (exit status %d) in `%s`; log %s ends:\n%s"
            % (run.row.name, run.seed, code, " ".join(argv[:len(
                self.launcher) + 1]), log_path, tail))
    wall, cpu = _read_run_time(run.model_dir)
    record = self._row_record(run.row, run.seed)
    evals = read_eval_results(run.model_dir)
    for key, step in (("early_ln_ppl", self.eval_steps[0]),
                      ("final_ln_ppl", self.eval_steps[-1])):
      if step not in evals:
        raise RuntimeError(
            "run %s seed %d: %s has no ln_ppl at step %d (has %s)"
            % (run.row.name, run.seed, os.path.join(
                run.model_dir, progress.EVAL_RESULTS), step, sorted(evals)))
      record[key] = evals[step]
    record["step_time_sec"] = comparison.median_step_time(run.model_dir)
    record["wall_sec"] = round(wall, 1)
    record["cpu_sec"] = round(cpu, 1)
    return record

  def run(self, train=True):
    """Trains and evaluates every unfinished run; writes results and plots.

    Args:
      train: False: only rewrite the tables and plots from the recorded
        runs (the output_dir must hold this sweep).
    Returns:
      the summary rows (summarize()) of all recorded runs.
    """
    if not train and not os.path.exists(os.path.join(self.output_dir,
                                                     MANIFEST)):
      raise ValueError("output_dir=%r holds no sweep to report on"
                       % self.output_dir)
    self._check_manifest()
    runs = self.runs()
    done = self.read_results()
    todo = [r for r in runs if (r.row.name, r.seed) not in done]
    if not train:
      todo = []
    self._say("sweep %s (%s scale, %d rows x %d seeds, %d steps, ln(PPL) at "
              "%s): %d runs, %d already recorded"
              % (self.table, self.scale, len(self.rows), self.seeds,
                 self.train_steps, ",".join(map(str, self.eval_steps)),
                 len(runs), len(runs) - len(todo)))
    walls = []
    for i, run in enumerate(todo):
      record = self._execute(run)
      self._append_result(record)
      walls.append(record["wall_sec"])
      eta = (len(todo) - i - 1) * sum(walls) / len(walls)
      self._say("[%d/%d] %s seed %d: ln(PPL) %.4f @%d, %.4f @%d; step %.4f "
                "s; %.0f s (%.0f s CPU); ETA %s"
                % (len(runs) - len(todo) + i + 1, len(runs), run.row.name,
                   run.seed, record["early_ln_ppl"], self.eval_steps[0],
                   record["final_ln_ppl"], self.eval_steps[-1],
                   record["step_time_sec"], record["wall_sec"],
                   record["cpu_sec"], progress.format_seconds(eta)))
      self.write_table()
    self.write_table()
    self.write_plots()
    self._say("wrote %s" % ", ".join(
        os.path.join(self.output_dir, f)
        for f in (RESULTS_CSV, RESULTS_MD, comparison.COMPARISON_MD)
        + PLOTS + (CURVES_PLOT,)))
    return self.summary()

  # ------------------------------------------------------------ reporting
  def summary(self):
    """One dict per row (sweep order): means and stds over recorded seeds."""
    recorded = self.read_results()
    return summarize(self.rows, [recorded.get((r.name, s))
                                 for r in self.rows
                                 for s in range(1, self.seeds + 1)],
                     {r.name: self.cost_record(r) for r in self.rows})

  def markdown(self, summary=None):
    """The paper-layout markdown table (empty quality cells when not run)."""
    return markdown_table(summary or self.summary(), self.eval_steps,
                          self.d_model.values(), self.cost_length.values(),
                          self.scale, self.seeds)

  def write_table(self):
    path = os.path.join(self.output_dir, RESULTS_MD)
    summary = self.summary()
    runs = sum(s["seeds"] for s in summary)
    wall = sum(s["wall"] or 0.0 for s in summary)
    cpu = sum(s["cpu"] or 0.0 for s in summary)
    title = (table_caption(self.table, self.gin_dir)
             if self.table in paper_table_names(self.gin_dir) else self.table)
    header = ("# Sweep `%s`: %s, %s scale\n\n%d seed%s per row, %d training "
              "steps; %d of %d runs recorded (wall %s, CPU %s); every run in "
              "`results.csv`, run directories in `runs/`.\n\n"
              % (self.table, title, self.scale, self.seeds,
                 "" if self.seeds == 1 else "s", self.train_steps,
                 runs, len(self.rows) * self.seeds,
                 progress.format_seconds(wall), progress.format_seconds(cpu)))
    with open(path, "w") as f:
      f.write(header + self.markdown(summary))
    comparison.write(self.output_dir, self.rows, self.seeds, self.model_dir,
                     {r.name: r.label for r in self.rows},
                     finished=set(self.read_results()))

  def write_plots(self):
    """plot_heads.png, plot_loss.png, plot_step_time.png in output_dir."""
    summary = self.summary()
    paths = [os.path.join(self.output_dir, p) for p in PLOTS]
    plot_heads(summary, self.eval_steps, paths[0], title=self.table)
    curves = {}
    for row in self.rows:
      curves[row.name] = [read_train_log(self.model_dir(row, s))
                          for s in range(1, self.seeds + 1)
                          if os.path.isdir(self.model_dir(row, s))]
    plot_loss(summary, curves, paths[1], title=self.table)
    plot_step_time(summary, paths[2], title=self.table)
    paths.append(comparison.plot_curves(
        self.rows, self.seeds, self.model_dir,
        os.path.join(self.output_dir, CURVES_PLOT), title=self.table,
        caption=self.command_line(),
        step_times=comparison.read_step_times(self.output_dir)))
    return paths

  def command_line(self):
    """An `mtf_th sweep` command that makes this sweep (for captions).

    Paper-table sweeps name their rows by number; grid sweeps are described
    by their table label only.
    """
    if self.table not in paper_table_names(self.gin_dir):
      return "mtf_th sweep (%s) --output_dir %s" % (self.table,
                                                     self.output_dir)
    all_rows = [r.name for r in paper_table_rows(self.table, self.gin_dir)]
    numbers = [str(all_rows.index(r.name) + 1) for r in self.rows
               if r.name in all_rows]
    rows = ("" if numbers == [str(i + 1) for i in range(len(all_rows))]
            else " --rows " + ",".join(numbers))
    return ("mtf_th sweep --paper_table %s%s --scale %s --seeds %d "
            "--train_steps %d --eval_steps %s --output_dir %s" % (
                self.table, rows, self.scale, self.seeds, self.train_steps,
                ",".join(map(str, self.eval_steps)), self.output_dir))

  def dry_run_text(self):
    """The commands every run would execute, then the table (costs only)."""
    lines = ["# %d runs (%d rows x %d seeds), %s scale, %d steps, ln(PPL) at "
             "%s" % (len(self.rows) * self.seeds, len(self.rows), self.seeds,
                     self.scale, self.train_steps,
                     ",".join(map(str, self.eval_steps)))]
    for run in self.runs():
      lines.append("# %s seed %d" % (run.row.name, run.seed))
      lines.extend(" ".join(shlex.quote(a) for a in argv)
                   for argv in run.commands)
    summary = summarize(self.rows, [], {r.name: self.cost_record(r)
                                        for r in self.rows})
    return "\n".join(lines) + "\n\n" + self.markdown(summary)


RUN_TIME = "sweep_time.json"


def _read_run_time(model_dir):
  """(wall, cpu) seconds the sweep has spent on a run so far."""
  path = os.path.join(model_dir, RUN_TIME)
  if not os.path.exists(path):
    return 0.0, 0.0
  with open(path) as f:
    data = json.load(f)
  return float(data["wall_sec"]), float(data["cpu_sec"])


def _write_run_time(model_dir, spent, wall, cpu):
  """Records spent + (wall, cpu) of this invocation (atomic rename)."""
  path = os.path.join(model_dir, RUN_TIME)
  with open(path + ".tmp", "w") as f:
    json.dump({"wall_sec": spent[0] + wall, "cpu_sec": spent[1] + cpu}, f)
  os.replace(path + ".tmp", path)


def _children_cpu_seconds():
  """User + system CPU seconds of this process's finished child processes."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------
# Reading what the training wrote (progress.py's files).

def read_train_log(model_dir):
  """[(step, loss, steps_per_sec)] from <model_dir>/train_log.csv."""
  return [(r["step"], r["loss"], r["steps_per_sec"])
          for r in progress.read_train_log(model_dir)]


def read_eval_results(model_dir, split="validation"):
  """{step: ln_ppl} of `split` from <model_dir>/eval_results.csv."""
  return {r["step"]: r["ln_ppl"] for r in progress.read_eval_results(model_dir)
          if r["split"] == split}


# ---------------------------------------------------------------------------
# Summaries, the markdown table, the plots.

def _mean_std(values):
  return comparison.mean_std(values)[:2]


def _float(value):
  if value is None or value == "":
    return None
  return float(value)


def summarize(rows, records, cost_records):
  """Per-row means / sample stds over seeds.

  Args:
    rows: [Row].
    records: result dicts (from results.csv; None entries are skipped).
    cost_records: {row name: Sweep.cost_record(row)}.

  Returns:
    [dict(row=Row, seeds=n, early=(mean, std), final=(mean, std),
          step_time=mean, wall=total, cpu=total, params, multiplies,
          multiplies_executed)] in row order.
  """
  by_row = collections.defaultdict(list)
  for record in records:
    if record:
      by_row[record["row"]].append(record)
  out = []
  for row in rows:
    recs = by_row.get(row.name, [])
    out.append(dict(
        row=row, seeds=len(recs),
        early=_mean_std([_float(r["early_ln_ppl"]) for r in recs]),
        final=_mean_std([_float(r["final_ln_ppl"]) for r in recs]),
        step_time=_mean_std([_float(r["step_time_sec"]) for r in recs])[0],
        wall=sum(_float(r["wall_sec"]) for r in recs) if recs else None,
        cpu=sum(_float(r["cpu_sec"]) for r in recs) if recs else None,
        **{k: cost_records[row.name][k]
           for k in ("params", "multiplies", "multiplies_executed")}))
  return out


def _heads_cells(row):
  """h_k, h, h_v as the paper prints them: blank where the variant ties them,
  24* where only some layers are talking heads."""
  star = "*" if row.placement != "all" else ""
  hk, h, hv = str(row.heads_k) + star, str(row.heads), str(row.heads_v) + star
  if row.variant in ("multi_head", "general_bilinear"):
    hk = hv = ""
  elif row.variant == "project_logits":
    hv = ""
  elif row.variant == "project_weights":
    hk = ""
  return hk, h, hv


def _sci(x):
  mantissa, exponent = ("%.3e" % x).split("e")
  return "%s·10^%d" % (mantissa, int(exponent))


def markdown_table(summary, eval_steps, d_models, cost_lengths, scale, seeds):
  """The paper's layout as markdown.

  Columns: label, h_k, h, h_v, d_k, d_v, ln(PPL) at both eval steps (mean,
  and (std) over seeds), step time, params and multiplies per attention
  layer; the best (lowest) ln(PPL) of each column and the fastest step time
  in bold.  Cells of runs not yet recorded stay empty.

  Args:
    summary: summarize() output.
    eval_steps: (early, final).
    d_models, cost_lengths: the d_model values and n = m lengths the costs
      were computed with (iterables of ints).
    scale: "tiny" or "base" (says where the length comes from).
    seeds: seeds per row (a std column needs two).

  Returns:
    the table and a one-line note on the costs, as a string.
  """
  lengths = sorted(set(cost_lengths))
  length_note = "n=m=" + "/".join(str(n) for n in lengths)
  std_note = " (std)" if seeds > 1 else ""
  header = ["", "h_k", "h", "h_v", "d_k", "d_v",
            "ln(PPL) %d steps%s" % (eval_steps[0], std_note),
            "ln(PPL) %d steps%s" % (eval_steps[-1], std_note),
            "step time (s)", "params per att. layer",
            "multiplies per att. layer (%s)" % length_note]

  def lowest(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return min(values) if len(values) > 1 else None

  best_early = lowest(s["early"][0] for s in summary)
  best_final = lowest(s["final"][0] for s in summary)
  best_time = lowest(s["step_time"] for s in summary)

  def number(value, best_value, fmt):
    if value is None or math.isnan(value):
      return ""
    text = fmt % value
    if best_value is not None and text == fmt % best_value:
      text = "**%s**" % text
    return text

  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
  for s in summary:
    row = s["row"]
    if row.variant == "general_bilinear":
      d_k = d_v = "d_model"
    else:
      d_k, d_v = str(row.d_k), str(row.d_v)
    early = number(s["early"][0], best_early, "%.3f")
    if early and s["early"][1] is not None:
      early += " (%.3f)" % s["early"][1]
    final = number(s["final"][0], best_final, "%.3f")
    if final and s["final"][1] is not None:
      final += " (%.3f)" % s["final"][1]
    various = row.placement != "all"
    cells = [row.label, *_heads_cells(row), d_k, d_v, early, final,
             number(s["step_time"], best_time, "%.4f"),
             "various" if various else str(s["params"]),
             "various" if various else _sci(s["multiplies"])]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines.append(
      "Params and multiplies per attention layer: costs.py with d_model = %s "
      "and %s (%s); dynamic projections counted folded, as the paper does."
      % ("/".join(str(d) for d in sorted(set(d_models))), length_note,
         "the paper's n=m=512" if scale == "base"
         else "the model's own input length"))
  return "\n".join(lines) + "\n"


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_heads(summary, eval_steps, path, title=""):
  """ln(PPL) vs number of heads h, one line per (variant, h_k*d_k) family.

  The paper's central claim: multi-head gets worse with many small heads,
  talking heads keeps improving.  Error bars: std over seeds; dashed: the
  early eval step.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  families = collections.OrderedDict()
  for s in summary:
    row = s["row"]
    if row.placement != "all" or s["final"][0] is None:
      continue
    key = (row.label, row.heads_k * row.d_k)
    families.setdefault(key, []).append(s)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, ((label, width), items) in enumerate(families.items()):
    items = sorted(items, key=lambda s: s["row"].heads)
    heads = [s["row"].heads for s in items]
    color = colors[i % len(colors)]
    name = "%s (h·d_k=%d)" % (label, width)
    for key, style, step in (("final", "-", eval_steps[-1]),
                             ("early", "--", eval_steps[0])):
      means = [s[key][0] for s in items]
      stds = [s[key][1] or 0.0 for s in items]
      ax.errorbar(heads, means, yerr=stds, fmt="o" + style, color=color,
                  capsize=3, label="%s, %d steps" % (name, step),
                  alpha=1.0 if key == "final" else 0.5)
  ax.set_xscale("log", base=2)
  all_heads = sorted({s["row"].heads for f in families.values() for s in f})
  if all_heads:
    ax.set_xticks(all_heads)
    ax.set_xticklabels([str(h) for h in all_heads])
  ax.set_xlabel("heads h (d_k = d_v shrink as h grows)")
  ax.set_ylabel("held-out ln(PPL)")
  ax.set_title("ln(PPL) vs heads: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  if families:
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_loss(summary, curves, path, title=""):
  """Training loss vs step per row, one line per seed, from train_log.csv.

  train_log.csv has a row per step; each line is its running mean over
  1/50 of the steps (at least 1) so that rows can be told apart.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7.0, 4.6))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, s in enumerate(summary):
    row = s["row"]
    color = colors[i % len(colors)]
    for j, log_rows in enumerate(curves.get(row.name, [])):
      if not log_rows:
        continue
      window = max(1, len(log_rows) // 50)
      losses = [r[1] for r in log_rows]
      smooth = [sum(losses[max(0, k - window + 1):k + 1])
                / (k + 1 - max(0, k - window + 1)) for k in range(len(losses))]
      ax.plot([r[0] for r in log_rows], smooth, color=color, lw=1.0,
              alpha=0.8,
              label=("%s (%s)" % (row.name, row.label)) if j == 0 else None)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss (running mean)")
  ax.set_title("loss curves: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  if ax.lines:
    ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_step_time(summary, path, title=""):
  """Measured seconds per step vs multiplies executed per attention layer."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for s in summary:
    t, m = s["step_time"], s["multiplies_executed"]
    if t is None or m is None or math.isnan(t):
      continue
    marker = "o" if s["row"].variant == "multi_head" else "s"
    ax.scatter([m], [t], marker=marker)
    ax.annotate(s["row"].name, (m, t), fontsize=6, xytext=(3, 3),
                textcoords="offset points")
  ax.set_xlabel("multiplies per attention layer (executed)")
  ax.set_ylabel("seconds per training step")
  ax.set_title("step time vs multiplies: %s" % title, fontsize=10)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
