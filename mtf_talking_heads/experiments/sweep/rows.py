"""Rows: one attention configuration each, and the paper tables they form.

Owns Row, the row macros' allowed values, the paper tables (the directories
of gin/experiments/, one file per row, in file-name order) and their checks,
and the --rows selection.  Rows from explicit values are grid.py's.
"""
import collections
import os
import re

from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs

EXPERIMENTS = "experiments"

# The macros every experiment file defines (docs/gin_guide.md).
ROW_MACROS = ("row_label", "variant", "heads_k", "heads", "heads_v", "d_k",
              "d_v", "dynamic", "placement")
VARIANTS = spec_lib.VARIANTS
# Read when an experiment file defines it: the head groups of
# grouped_talking_heads (required there).
GROUPS_MACRO = "groups"
PLACEMENTS = ("all", "enc_self", "dec_self", "encdec")
# t5, bert, albert: the paper's models (models/<m>_base.gin, shrunk for CPU
# by models/<m>_tiny.gin).  lm, encdec: small models in the paper's regime
# (models/<m>_small.gin, h * d_k = d_model; shrunk for tests by
# models/<m>_tiny.gin); their tables run at scale "small".
MODELS = ("t5", "bert", "albert", "lm", "encdec")
SMALL_MODELS = ("lm", "encdec")
DIMS = ("heads_k", "heads", "heads_v", "d_k", "d_v")

Row = collections.namedtuple("Row", [
    "name", "label", "variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
    "dynamic", "placement", "gin_files", "gin_params", "groups"],
    defaults=(None,))
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
  groups: the head groups of grouped_talking_heads (the `groups` macro),
    None for the other variants.
"""


def paper_table_names(gin_dir=gin_reader.GIN_DIR):
  """The paper tables: the directories of gin/experiments/ with gin files."""
  root = os.path.join(gin_dir, EXPERIMENTS)
  if not os.path.isdir(root):
    return []
  return sorted(d for d in os.listdir(root)
                if os.path.isdir(os.path.join(root, d)) and any(
                    f.endswith(".gin") for f in os.listdir(os.path.join(root, d))))


def positive_int(value, name, where):
  """spec.positive_int, its message prefixed with `where`."""
  try:
    return spec_lib.positive_int(name, value)
  except ValueError as e:
    raise ValueError("%s: %s" % (where, e)) from None


def check_row(row, where):
  """Validates a Row's macros; raises ValueError naming `where` and the macro."""
  if row.variant not in VARIANTS:
    raise ValueError("%s: variant=%r is not one of %s"
                     % (where, row.variant, ", ".join(VARIANTS)))
  for name in DIMS:
    positive_int(getattr(row, name), name, where)
  if row.placement not in PLACEMENTS:
    raise ValueError("%s: placement=%r is not one of %s"
                     % (where, row.placement, ", ".join(PLACEMENTS)))
  if not isinstance(row.label, str) or not row.label:
    raise ValueError("%s: row_label must be a non-empty string, got %r"
                     % (where, row.label))
  if row.variant == spec_lib.DYNAMIC and not row.dynamic:
    raise ValueError("%s: variant 'dynamic_projections' needs a non-empty "
                     "dynamic list" % where)
  if row.variant != spec_lib.DYNAMIC and row.dynamic:
    raise ValueError("%s: dynamic=%r is only meaningful for variant "
                     "'dynamic_projections', not %r"
                     % (where, list(row.dynamic), row.variant))
  variant, hk, h, hv, dk, dv, _, _, dynamic = cost_args(row, 1)
  try:  # the heads / dims / dynamic terms / groups must fit the variant
    costs.resolve_config(variant, hk, h, hv, dk, dv, d_model=1, length=1,
                         dynamic=dynamic, groups=row.groups)
  except ValueError as e:
    raise ValueError("%s: %s" % (where, e)) from None
  return row


def paper_table_rows(table, gin_dir=gin_reader.GIN_DIR):
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
    config = gin_reader.GinConfig([rel], gin_dir=gin_dir)
    values = {m: config.require(m, rel) for m in ROW_MACROS}
    dynamic = values["dynamic"]
    if not isinstance(dynamic, (list, tuple)):
      raise ValueError("%s: dynamic must be a list, got %r" % (rel, dynamic))
    row = Row(name=filename[:-len(".gin")], label=values["row_label"],
              variant=values["variant"],
              **{d: values[d] for d in DIMS},
              dynamic=tuple(dynamic), placement=values["placement"],
              gin_files=(rel,), gin_params=(),
              groups=config.get(GROUPS_MACRO) if values["variant"] ==
              costs.GROUPED else None)
    rows.append(check_row(row, rel))
  return rows


def table_caption(table, gin_dir=gin_reader.GIN_DIR):
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


def cost_args(row, d_model):
  """costs.py's (variant, heads_k, heads, heads_v, d_k, d_v, d_model, length,
  dynamic) for a row: dynamic projections are talking heads plus terms,
  general bilinear has no d_k, d_v of its own; length is left to the caller.
  """
  variant = row.variant
  dynamic = ()
  if variant == spec_lib.DYNAMIC:
    variant, dynamic = spec_lib.TALKING_HEADS, row.dynamic
  heads_k, heads_v, d_k, d_v = row.heads_k, row.heads_v, row.d_k, row.d_v
  if variant == spec_lib.BILINEAR:
    d_k = d_v = None
  return (variant, heads_k, row.heads, heads_v, d_k, d_v, d_model, None,
          dynamic)


def model_and_size(row, gin_dir=gin_reader.GIN_DIR):
  """(model, size): which models/<model>_<size>.gin the row includes, size
  "base" (the paper's models) or "small" (the small-regime models)."""
  config = gin_reader.GinConfig(row.gin_files, row.gin_params, gin_dir=gin_dir)
  found = [(m, size) for m in MODELS for size in ("base", "small")
           if "models/%s_%s.gin" % (m, size) in config.includes]
  if len(found) != 1:
    raise ValueError("row %s: cannot tell its model (it should include "
                     "exactly one of models/{%s}_base.gin or "
                     "models/{lm,encdec}_small.gin)"
                     % (row.name, ",".join(MODELS[:3])))
  return found[0]


def model_of(row, gin_dir=gin_reader.GIN_DIR):
  """'t5', 'bert', 'albert', 'lm' or 'encdec' (see model_and_size)."""
  return model_and_size(row, gin_dir)[0]
