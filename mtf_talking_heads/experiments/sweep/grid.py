"""Rows from explicit values: --grid heads=6,12 --tie d_k=768/heads.

Owns the grid and tie parsers and grid_rows, which builds a Row per
combination of the grid's values (the gin files of the model and of the
variant, the dims as bindings), checked like a paper table's rows.
"""
import collections
import itertools
import json
import re

from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.experiments.sweep import rows as rows_lib

DIMS = rows_lib.DIMS
GRID_KEYS = ("variant",) + DIMS
LABELS = spec_lib.LABELS

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
        if v not in rows_lib.VARIANTS:
          raise ValueError("grid: variant %r is unknown; choose from %s"
                           % (v, ", ".join(rows_lib.VARIANTS)))
        if v == spec_lib.GROUPED:  # its groups is no grid key
          raise ValueError(
              "grid: variant grouped_talking_heads needs groups, which a "
              "grid cannot set: sweep its rows with --paper_table "
              "lm_variants --rows 10,11 or a gin file setting groups")
    else:
      items = [rows_lib.positive_int(int(v) if v.isdigit() else v, key,
                                     "grid") for v in items]
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
  value = gin_reader.GinConfig([_attention_file(variant)],
                               gin_dir=gin_dir).get(macro)
  if not isinstance(value, gin_reader.Reference):
    raise ValueError("%s does not bind the macro %r"
                     % (_attention_file(variant), macro))
  return "%s = %s" % (macro, value)


def grid_rows(grid, ties=None, variant=None, dynamic=(), placement="all",
              model="t5", gin_dir=gin_reader.GIN_DIR):
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
  if model not in rows_lib.MODELS:
    raise ValueError("model=%r is unknown; choose from %s"
                     % (model, ", ".join(rows_lib.MODELS)))
  if placement not in rows_lib.PLACEMENTS:
    raise ValueError("placement=%r is unknown; choose from %s"
                     % (placement, ", ".join(rows_lib.PLACEMENTS)))
  if variant is not None and variant not in rows_lib.VARIANTS:
    raise ValueError("variant=%r is unknown; choose from %s"
                     % (variant, ", ".join(rows_lib.VARIANTS)))
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
      if key == "d_k" and grid["variant"] == [spec_lib.BILINEAR]:
        ties[key] = ("const", 1, None)  # unused: d_k = d_model
        continue
      raise ValueError("%s has no value: give --grid %s=... or --tie %s=..."
                       % (key, key, "d_k=768/heads" if key == "d_k" else
                          "heads=..."))
  order = _tie_order(ties, grid)
  dynamic = tuple(dynamic)
  if dynamic and spec_lib.DYNAMIC not in grid["variant"]:
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
    if v == spec_lib.BILINEAR:
      values["d_k"] = values["d_v"] = 1
    name = "%s_hk%d_h%d_hv%d_dk%d_dv%d" % (
        v, values["heads_k"], values["heads"], values["heads_v"],
        values["d_k"], values["d_v"])
    if v == spec_lib.BILINEAR:
      name = "%s_h%d" % (v, values["heads"])
    row_dynamic = dynamic if v == spec_lib.DYNAMIC else ()
    if v == spec_lib.DYNAMIC and not row_dynamic:
      row_dynamic = tuple(costs.DYNAMIC_TERMS)
    if row_dynamic and row_dynamic != tuple(costs.DYNAMIC_TERMS):
      name += "_" + "_".join(row_dynamic)
    size = "small" if model in rows_lib.SMALL_MODELS else "base"
    gin_files = ["models/%s_%s.gin" % (model, size), _attention_file(v)]
    used = gin_reader.referenced_macros(gin_files, gin_dir)
    # only the dims the variant reads (training refuses a macro nothing uses)
    gin_params = ["%s = %d" % (d, values[d]) for d in DIMS if d in used
                  and not (v == spec_lib.BILINEAR and d in ("d_k", "d_v"))]
    if v == spec_lib.DYNAMIC:
      gin_params.append("dynamic = %s" % json.dumps(list(row_dynamic)))
    label = LABELS[v]
    if placement != "all":
      gin_files.append(_attention_file(spec_lib.MULTI_HEAD))
      gin_params.append(_placement_binding(v, placement, gin_dir))
      name += "_" + placement
      label = "%s-%s" % ("DP" if v == spec_lib.DYNAMIC else "TH",
                         placement.replace("_", "-"))
    row = rows_lib.Row(name=name, label=label, variant=v,
                       **{d: values[d] for d in DIMS}, dynamic=row_dynamic,
                       placement=placement, gin_files=tuple(gin_files),
                       gin_params=tuple(gin_params))
    rows.append(rows_lib.check_row(row, "grid row %s" % name))
  names = [r.name for r in rows]
  if len(set(names)) != len(names):
    raise ValueError("grid: some combinations give the same configuration "
                     "(%s); remove the duplicate values"
                     % ", ".join(sorted({n for n in names
                                         if names.count(n) > 1})))
  return rows


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
