"""One attention configuration: the named heads dims, and the names it is laid out by.

Pure Python (no TensorFlow, no mtf): the commands that only count or check
(`mtf_th costs`, `perf`, `comm`'s argument checks, the sweep's pre-flight)
import it before anything heavy.  It owns four things the rest of the
package used to restate:

* VARIANT_TABLE: every attention variant by name, with what follows from its
  heads dims (README: "the dim names are the algorithm"): P_l exists iff
  heads_k and heads differ, P_w iff heads and heads_v differ.  costs.py,
  model.py, comm.py, layers.py and sweep/ read their variant names, labels
  and projections from it.
* AttentionSpec: h_k, h, h_v, d_k, d_v, groups and the dynamic terms of one
  layer, validated once (make_spec), with its label and the shapes of the
  tensors it computes (activation_shapes).
* positive_int: the one check of a size given as a number.
* parse_mesh_shape / parse_layout (mtf's separators: any of ",;." or
  spaces) and check_layout_names: every layout rule names a mesh axis the
  mesh has (or a conventional one, STANDARD_MESH_AXES) and a dim the model
  has, else one line with a did-you-mean.

Example:
  >>> s = make_spec("talking_heads", heads=24, d_k=32, d_v=32)
  >>> s.project_logits, s.project_weights, s.label
  (True, True, 'talking_heads')
  >>> make_spec("project_logits", heads=8, heads_k=16, d_k=4, d_v=4).heads_v
  8
"""
import collections
import difflib
import numbers
import re

DYNAMIC_TERMS = ("x2l", "m2l", "x2w", "m2w")
LOGITS_TERMS = ("x2l", "m2l")
WEIGHTS_TERMS = ("x2w", "m2w")
# The variant names code branches on (everything else reads VARIANT_TABLE).
MULTI_HEAD = "multi_head"
TALKING_HEADS = "talking_heads"
PROJECT_LOGITS = "project_logits"
PROJECT_WEIGHTS = "project_weights"
GROUPED = "grouped_talking_heads"
BILINEAR = "general_bilinear"
DYNAMIC = "dynamic_projections"

Variant = collections.namedtuple("Variant", [
    "name", "label", "project_logits", "project_weights", "layer", "costed",
    "sharded"])
Variant.__doc__ = """One attention variant.

Attributes:
  name: the variant's name (CLI --variant, the experiment files' `variant`).
  label: the paper's first column ("talking-heads").
  project_logits: has P_l[h_k, h] (heads_k and heads are different dims).
  project_weights: has P_w[h, h_v] (heads and heads_v are different dims).
  layer: the gin class of layers.py (self-attention; "Encoder" is inserted
    before "Attention" for attention over the encoder output).
  costed: `mtf_th costs` counts it under this name (dynamic projections are
    talking_heads plus terms there).
  sharded: it has sharding strategies (`mtf_th comm`).
"""

# The one table of variant names, in the order the commands list them.
VARIANT_TABLE = (
    Variant(MULTI_HEAD, "multi-head", False, False, "MultiHeadAttention",
            True, True),
    Variant(TALKING_HEADS, "talking-heads", True, True,
            "TalkingHeadsAttention", True, True),
    Variant(PROJECT_LOGITS, "project logits", True, False,
            "ProjectLogitsAttention", True, True),
    Variant(PROJECT_WEIGHTS, "project weights", False, True,
            "ProjectWeightsAttention", True, True),
    Variant(BILINEAR, "general bilinear", False, False,
            "GeneralBilinearAttention", True, False),
    Variant(DYNAMIC, "dyn. proj.", True, True, "DynamicProjectionsAttention",
            False, False),
    Variant(GROUPED, "grouped talking-heads", True, True,
            "GroupedTalkingHeadsAttention", True, True),
)
VARIANT = collections.OrderedDict((v.name, v) for v in VARIANT_TABLE)
VARIANTS = tuple(VARIANT)  # every name (experiment files, sweep rows)
COSTED_VARIANTS = tuple(v.name for v in VARIANT_TABLE if v.costed)
SHARDED_VARIANTS = tuple(v.name for v in VARIANT_TABLE if v.sharded)
LABELS = collections.OrderedDict((v.name, v.label) for v in VARIANT_TABLE)
# Mesh axes a layout may name although the mesh lacks them: the package's
# layouts use them, so one layout string serves several meshes, as mtf's
# t5 layout "batch:batch;heads:model;d_ff:model;vocab:model" does.
STANDARD_MESH_AXES = ("batch", "model")
# The dim a split sharding strategy shards its core over (its layout rule
# core_shard:model, nn/strategies/split.py's SplitCore).
CORE_SHARD = "core_shard"
# The dims of a one-layer Unitransformer besides attention's (`mtf_th comm`'s
# benchmark unit: embedding, residual, logits).
UNIT_DIMS = ("batch", "length", "memory_length", "d_model", "vocab")
# Dims of a whole mtf transformer besides attention's (models.describe):
# feed-forward, position table, relative-bias buckets, factorized
# embedding, and mtf's generic ones (models.MTF_GENERIC_DIMS).
MODEL_DIMS = UNIT_DIMS + ("d_ff", "max_length", "buckets", "inner_vocab",
                          "ensemble", "experts", "outer_batch")


def layer_class_names(variant):
  """(self-attention class, encoder-attention class) names of a variant."""
  name = VARIANT[variant].layer
  return name, name[:-len("Attention")] + "EncoderAttention"


def variant_with(project_logits, project_weights):
  """The plain variant (multi-head, talking heads or one projection) whose
  projections are these: VARIANT_TABLE's row with those P_l, P_w."""
  for name in (MULTI_HEAD, TALKING_HEADS, PROJECT_LOGITS, PROJECT_WEIGHTS):
    v = VARIANT[name]
    if (v.project_logits, v.project_weights) == (bool(project_logits),
                                                 bool(project_weights)):
      return name


def positive_int(name, value, hint=""):
  """value as an int; ValueError "NAME must be a positive integer, got V"."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError("%s must be a positive integer, got %r%s"
                     % (name, value, hint))
  if value <= 0:
    raise ValueError("%s must be a positive integer, got %d%s"
                     % (name, value, hint))
  return int(value)


def dim_pair(value, default_name, param):
  """An int, (name, size) pair or mtf.Dimension -> (name, size), size > 0.

  The one check of a dim given to a layer or a checker (attention.make_dims,
  the layers' heads arguments, validation's d_model, length, the dims of
  its tensor_shapes, ...): the message names `param`, the argument the
  caller set.  A bool is refused; so is an int when default_name is None
  (a dim that must be named).
  """
  pair = ((default_name, value)
          if isinstance(value, int) and default_name is not None else value)
  try:
    name, size = pair
    ok = (isinstance(name, str) and isinstance(size, int)
          and not isinstance(size, bool))
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError("%s must be %sa (name, size) pair, got %r"
                     % (param, "" if default_name is None else "an int or ",
                        value))
  if size <= 0:
    raise ValueError("%s must have a positive size, got %r; set %s to a "
                     "positive integer" % (param, value, param))
  return name, size


def parse_dynamic(dynamic):
  """A tuple of dynamic terms in canonical order (from a sequence or 'a,b')."""
  if dynamic is None:
    return ()
  if isinstance(dynamic, str):
    items = [t.strip() for t in dynamic.split(",") if t.strip()]
  else:
    try:
      items = list(dynamic)
    except TypeError:
      raise ValueError("dynamic must be a sequence of terms from %s (or a "
                       "comma-separated string), got %r"
                       % (", ".join(DYNAMIC_TERMS), dynamic)) from None
  for term in items:
    if term not in DYNAMIC_TERMS:
      raise ValueError("dynamic term %r is unknown; choose a subset of %s"
                       % (term, ", ".join(DYNAMIC_TERMS)))
  repeated = sorted({t for t in items if items.count(t) > 1})
  if repeated:
    raise ValueError("dynamic lists %s more than once; give each term once"
                     % ", ".join(repeated))
  return tuple(t for t in DYNAMIC_TERMS if t in items)


def variant_label(variant, dynamic=(), groups=None):
  """The variant as tables print it: "talking_heads+x2l",
  "grouped_talking_heads(groups=8)"."""
  label = "+".join((variant,) + tuple(dynamic))
  return label if groups is None else "%s(groups=%d)" % (label, groups)


def did_you_mean(name, known, n=1):
  """" (did you mean 'x'?)" for the closest of `known`, or ""."""
  close = difflib.get_close_matches(name, sorted(set(known)), n=n)
  return (" (did you mean %s?)" % " or ".join(repr(c) for c in close)
          if close else "")


# ------------------------------------------------------------------ the spec
class AttentionSpec(collections.namedtuple("AttentionSpec", [
    "variant", "heads_k", "heads", "heads_v", "d_k", "d_v", "dynamic",
    "groups"], defaults=(None,))):
  """The paper's h_k, h, h_v, d_k, d_v of one layer, plus groups and dynamic.

  heads sizes are totals (grouped: each a multiple of groups); d_k, d_v are
  None for general bilinear (they are d_model there).  Build with make_spec.

  Example (talking heads of the paper's T5, tab:t5 row 7):
    AttentionSpec("talking_heads", 24, 24, 24, 32, 32, (), None)
    .project_logits == .project_weights == True, .label == "talking_heads"
  """

  @property
  def project_logits(self):
    return VARIANT[self.variant].project_logits

  @property
  def project_weights(self):
    return VARIANT[self.variant].project_weights

  @property
  def mixes_heads(self):
    """True if heads-parallel leaves h whole on every device: P_l or P_w
    mixes heads (h_k / h_v split).  Grouped talking heads is laid out
    groups:model, split like multi-head."""
    return (self.project_logits or self.project_weights) and not self.groups

  @property
  def label(self):
    """costs.variant_label's: "talking_heads+x2l", "grouped_...(groups=8)"."""
    return variant_label(self.variant, self.dynamic, self.groups)

  def dim_sizes(self):
    """{dim name: size} as the layers name them (grouped: per-group heads
    plus "groups"); tied heads dims share the name "heads"."""
    g = self.groups or 1
    sizes = {"heads": self.heads // g}
    if self.project_logits:
      sizes["heads_k"] = self.heads_k // g
    if self.project_weights:
      sizes["heads_v"] = self.heads_v // g
    if self.variant != BILINEAR:
      sizes["d_k"] = self.d_k
      sizes["d_v"] = self.d_v
    if self.groups:
      sizes["groups"] = self.groups
    return sizes


def unit_dim_names(spec):
  """Every dim name of `mtf_th comm`'s unit for `spec` (layout targets)."""
  return sorted(set(spec.dim_sizes()) | set(UNIT_DIMS) | {CORE_SHARD})


def _tied(name, value, variant, heads, why):
  """heads_k / heads_v of a variant where it must equal heads."""
  if value is None:
    return heads
  value = positive_int(name, value)
  if value != heads:
    raise ValueError(
        "%s=%d conflicts with heads=%d: variant %r %s, so %s = heads; "
        "leave %s unset or set it to %d"
        % (name, value, heads, variant, why, name, name, heads))
  return value


def _outer_heads(name, value, variant, heads, projected, one_sided, why):
  """heads_k (or heads_v): free where P_l (P_w) exists, else tied to heads.

  Args:
    name: "heads_k" or "heads_v".
    value: the caller's value (None: heads).
    variant: the attention variant.
    heads: h.
    projected: True if the variant has the projection (P_l or P_w).
    one_sided: the variant with only the other projection.
    why: the reason `one_sided` ties it.
  Returns:
    the positive int.
  Raises:
    ValueError: naming the parameter.
  """
  if projected:
    return heads if value is None else positive_int(name, value)
  return _tied(name, value, variant, heads, why if variant == one_sided
               else "has a single heads dimension")


def _check_dynamic(variant, dynamic):
  """The dynamic terms a variant can take (each adds to P_l or P_w)."""
  v = VARIANT[variant]
  for term in dynamic:
    if not (v.project_logits or v.project_weights):
      raise ValueError(
          "dynamic=%s needs a talking-heads projection, which variant %r "
          "does not have; use variant='talking_heads' (or drop dynamic)"
          % (",".join(dynamic), variant))
    if term in LOGITS_TERMS and not v.project_logits:
      raise ValueError(
          "dynamic term %r adds to the logits projection P_l, which variant "
          "%r does not have; use variant='talking_heads' or "
          "'project_logits', or drop %r" % (term, variant, term))
    if term in WEIGHTS_TERMS and not v.project_weights:
      raise ValueError(
          "dynamic term %r adds to the weights projection P_w, which variant "
          "%r does not have; use variant='talking_heads' or "
          "'project_weights', or drop %r" % (term, variant, term))


def check_groups(variant, groups, heads_k, heads, heads_v):
  """groups: required (a divisor of each heads size) for grouped talking
  heads, None for every other variant."""
  if variant != GROUPED:
    if groups is not None:
      raise ValueError(
          "groups=%r is only for variant %r; drop groups or use that "
          "variant" % (groups, GROUPED))
    return None
  if groups is None:
    raise ValueError("groups is required for variant %r (the number of "
                     "head groups g, e.g. 8)" % GROUPED)
  groups = positive_int("groups", groups)
  for name, value in (("heads_k", heads_k), ("heads", heads),
                      ("heads_v", heads_v)):
    if value % groups:
      raise ValueError(
          "groups=%d does not divide %s=%d: each of heads_k, heads, heads_v "
          "must be a multiple of groups; choose groups among their common "
          "divisors" % (groups, name, value))
  return groups


def check_variant(variant, known=COSTED_VARIANTS):
  """variant, if it is one of `known`; else the did-you-mean ValueError."""
  if not isinstance(variant, str) or variant not in known:
    hint = ""
    if isinstance(variant, str) and variant.replace("-", "_") in known:
      hint = " (did you mean %r?)" % variant.replace("-", "_")
    raise ValueError("variant=%r is not supported%s; choose one of: %s"
                     % (variant, hint, ", ".join(known)))
  return variant


def resolve_dims(variant, heads, heads_k, heads_v, d_k, d_v, d_model):
  """(heads_k, heads_v, d_k, d_v) of a variant, validated (heads already).

  heads_k / heads_v None take the value the variant implies (heads); for
  general_bilinear d_k = d_v = d_model (None allowed).
  """
  v = VARIANT[variant]
  heads_k = _outer_heads("heads_k", heads_k, variant, heads, v.project_logits,
                         "project_weights",
                         "has no logits projection P_l[h_k, h]")
  heads_v = _outer_heads("heads_v", heads_v, variant, heads,
                         v.project_weights, "project_logits",
                         "has no weights projection P_w[h, h_v]")
  if variant == BILINEAR:
    for name, value in (("d_k", d_k), ("d_v", d_v)):
      if value is not None and (
          isinstance(value, bool) or value != d_model):
        raise ValueError(
            "%s=%r conflicts with d_model=%d: general_bilinear has no "
            "separate key/value projections (its P[d_X, d_M, h] and "
            "Q[d_M, d_Y, h] act on d_model), so %s = d_model; leave %s unset "
            "or set it to %d" % (name, value, d_model, name, name, d_model))
    return heads_k, heads_v, d_model, d_model
  for name, value, what in (("d_k", d_k, "key"), ("d_v", d_v, "value")):
    if value is None:
      raise ValueError("%s is required for variant %r (the per-head %s "
                       "size, e.g. 64)" % (name, variant, what))
  return heads_k, heads_v, positive_int("d_k", d_k), positive_int("d_v", d_v)


def make_spec(variant, heads, d_k=None, d_v=None, heads_k=None, heads_v=None,
              dynamic=(), groups=None, d_model=None):
  """The one constructor: a validated AttentionSpec from a variant name.

  Args:
    variant: a name of VARIANT_TABLE; "dynamic_projections" is talking heads
      with (non-empty) dynamic terms.
    heads: h.
    d_k, d_v: per-head key / value sizes (None for general_bilinear, or
      d_model).
    heads_k, heads_v: h_k, h_v (None: heads; must equal heads where the
      variant ties them).
    dynamic: subset of DYNAMIC_TERMS (sequence or "x2l,m2w").
    groups: head groups of grouped_talking_heads (required there).
    d_model: only for general_bilinear's d_k = d_v = d_model check.
  Returns:
    an AttentionSpec (general_bilinear: d_k = d_v = None).
  Raises:
    ValueError: with the message `mtf_th costs` prints for the same input.
  """
  if variant == DYNAMIC:
    if not parse_dynamic(dynamic):
      raise ValueError("variant 'dynamic_projections' needs a non-empty "
                       "dynamic list")
    variant = TALKING_HEADS
  check_variant(variant)
  heads = positive_int("heads", heads)
  heads_k, heads_v, d_k, d_v = resolve_dims(
      variant, heads, heads_k, heads_v, d_k, d_v,
      d_model if d_model is not None else d_k)
  dynamic = parse_dynamic(dynamic)
  _check_dynamic(variant, dynamic)
  groups = check_groups(variant, groups, heads_k, heads, heads_v)
  if variant == BILINEAR:
    d_k = d_v = None
  return AttentionSpec(variant, heads_k, heads, heads_v, d_k, d_v, dynamic,
                       groups)


def activation_shapes(dims, batch, length, memory_length, d_model=None,
                      dynamic=()):
  """{tensor: [dim]} of the paper's activations, from a layer's named dims.

  dims: anything with heads_k, heads, heads_v, d_k, d_v and group_dims
  (attention.AttentionDims); the dims (and batch, length, memory_length,
  d_model) are put in the lists as given, so this serves mtf.Dimensions and
  (name, size) pairs alike.  batch is a list of batch dims.  Example
  (talking heads):

    Q: [batch, length, heads_k, d_k]     K: [batch, memory_length, heads_k, d_k]
    V: [batch, memory_length, heads_v, d_v]
    J: [batch, length, memory_length, heads_k]
    L, W: [batch, length, memory_length, heads]
    U: [batch, length, memory_length, heads_v]
    O: [batch, length, heads_v, d_v]
    X, Y: [batch, length, d_model]       M: [batch, memory_length, d_model]
    R_Xl: [batch, length, heads_k, heads] ... R_Mw: [batch, memory_length,
      heads, heads_v]

  Grouped talking heads: [groups] before each heads dim.  X, M, Y only with
  d_model.
  """
  b, n, m, g = list(batch), length, memory_length, list(dims.group_dims)
  shapes = {}
  if d_model is not None:
    shapes["X"] = b + [n, d_model]
    shapes["M"] = b + [m, d_model]
  shapes.update({
      "Q": b + [n] + g + [dims.heads_k, dims.d_k],
      "K": b + [m] + g + [dims.heads_k, dims.d_k],
      "V": b + [m] + g + [dims.heads_v, dims.d_v],
      "J": b + [n, m] + g + [dims.heads_k],
      "L": b + [n, m] + g + [dims.heads],
      "W": b + [n, m] + g + [dims.heads],
      "U": b + [n, m] + g + [dims.heads_v],
      "O": b + [n] + g + [dims.heads_v, dims.d_v],
  })
  if d_model is not None:
    shapes["Y"] = b + [n, d_model]
  for term in dynamic:
    source = n if term[0] == "x" else m
    pair = ([dims.heads_k, dims.heads] if term.endswith("l")
            else [dims.heads, dims.heads_v])
    shapes["R_%s%s" % (term[0].upper(), term[-1])] = b + [source] + g + pair
  return shapes


# ------------------------------------------------------------ mesh and layout
# mtf's own parser (ops._parse_string_to_list_of_pairs) splits on these.
DELIMITERS = re.compile(r"[,.;\s]+")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def split_rules(text):
  """The name:value tokens of an mtf mesh shape or layout string."""
  return [t for t in DELIMITERS.split((text or "").strip()) if t]


def _name_value_tokens(text, what, names, write):
  """Yields (name, value) of each token of an mtf string, in order.

  Args:
    text: a mesh shape or layout string.
    what: its parameter name, first in the message.
    names: how many sides must be identifiers (1: the name; 2: both).
    write: what to write instead, e.g. 'name:size pairs separated by ...'.
  Raises:
    ValueError: "WHAT: cannot parse TOKEN in TEXT; write WRITE" for a token
      without exactly one ':' or whose sides are not names.
  """
  for token in split_rules(text):
    parts = token.split(":")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts[:names]):
      raise ValueError("%s: cannot parse %r in %r; write %s"
                       % (what, token, text, write))
    yield tuple(parts)


def _check_mesh_pairs(pairs, mesh_shape):
  seen = set()
  for name, size in pairs:
    if not isinstance(name, str) or not _NAME.match(name):
      raise ValueError("mesh_shape: mesh dim name %r in %s is not an "
                       "identifier" % (name, repr(mesh_shape)))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise ValueError(
          "mesh_shape: mesh dim %r has size %r in %s; sizes must be positive "
          "integers" % (name, size, repr(mesh_shape)))
    if name in seen:
      raise ValueError("mesh_shape: mesh dim %r appears twice in %s; give "
                       "each mesh dim once" % (name, repr(mesh_shape)))
    seen.add(name)
  return pairs


def parse_mesh_shape(mesh_shape):
  """Parses a mesh shape into a list of (name, size) pairs.

  Args:
    mesh_shape: an mtf string such as "batch:2;model:4" (delimiters as in mtf:
      any of ",;." or spaces), a list of (name, size) pairs or of objects
      with .name and .size (mtf.Dimension), or None / "" for a one-device
      mesh.  (validation.parse_mesh_shape also takes an mtf.Shape.)
  Returns:
    a list of (name, size) pairs.
  Raises:
    ValueError: naming mesh_shape, if it is malformed, a size is not a
      positive integer or a name repeats.
  """
  if mesh_shape is None:
    return []
  if isinstance(mesh_shape, str):
    pairs = []
    for name, size in _name_value_tokens(
        mesh_shape, "mesh_shape", 1,
        "name:size pairs separated by ';', e.g. \"batch:2;model:4\""):
      if not re.match(r"^[0-9]+$", size):
        raise ValueError(
            "mesh_shape: size %r of mesh dim %r in %r is not an integer; "
            "write name:size pairs, e.g. \"model:8\""
            % (size, name, mesh_shape))
      pairs.append((name, int(size)))
    return _check_mesh_pairs(pairs, mesh_shape)
  try:
    pairs = [(d.name, d.size) if hasattr(d, "name") and hasattr(d, "size")
             else (d[0], d[1]) for d in mesh_shape]
  except (TypeError, IndexError, KeyError):
    raise ValueError(
        "mesh_shape must be an mtf string such as \"batch:2;model:4\", an "
        "mtf.Shape or a list of (name, size) pairs, got %r"
        % (mesh_shape,)) from None
  return _check_mesh_pairs(pairs, mesh_shape)


def parse_layout(layout):
  """Parses layout rules into a sorted list of (tensor dim, mesh dim) pairs.

  Args:
    layout: an mtf string such as "heads:model;batch:batch", a collection of
      (tensor dim name, mesh dim name) pairs, or None / "" for no rules.
      (validation.parse_layout also takes an mtf.LayoutRules.)
  Returns:
    a sorted list of (tensor dim name, mesh dim name) pairs, no repeats.
  Raises:
    ValueError: naming layout, if it is malformed.
  """
  if layout is None:
    return []
  if isinstance(layout, str):
    return sorted(set(_name_value_tokens(
        layout, "layout", 2, "tensor_dim:mesh_dim rules separated by ';', "
        "e.g. \"heads:model;batch:batch\"")))
  try:
    pairs = [(a, b) for a, b in layout]
  except (TypeError, ValueError):
    raise ValueError(
        "layout must be an mtf string such as \"heads:model;batch:batch\", "
        "an mtf.LayoutRules or a list of (tensor_dim, mesh_dim) pairs, "
        "got %r" % (layout,)) from None
  for a, b in pairs:
    if not (isinstance(a, str) and isinstance(b, str) and _NAME.match(a)
            and _NAME.match(b)):
      raise ValueError("layout: rule %r must pair two dim names" % ((a, b),))
  return sorted(set(pairs))


def _rules(layout):
  """(dim, axis) pairs in the order written (malformed ones left out)."""
  if isinstance(layout, str):
    rules = [tuple(t.split(":")) for t in split_rules(layout)]
  else:
    rules = [tuple(r) for r in layout]
  return [r for r in rules if len(r) == 2]


def check_layout_axes(layout, mesh_axes, what="layout"):
  """Every rule names one of `mesh_axes` or of STANDARD_MESH_AXES.

  Rules for a conventional axis the mesh lacks are ignored, as mtf does
  (one layout serves several meshes); any other axis is a typo.

  Raises:
    ValueError: one line, e.g. "layout rule heads:modle names mesh axis
      'modle', which the mesh (axes: model) does not have (did you mean
      'model'?); fix the spelling or drop the rule".
  """
  mesh_axes = list(mesh_axes)
  axes = mesh_axes + [a for a in STANDARD_MESH_AXES if a not in mesh_axes]
  for dim, axis in _rules(layout):
    if axis not in axes:
      raise ValueError(
          "%s rule %s:%s names mesh axis %r, which the mesh (axes: %s) does "
          "not have%s; fix the spelling or drop the rule"
          % (what, dim, axis, axis, ", ".join(mesh_axes) or "none",
             did_you_mean(axis, axes)))


def check_layout_names(layout, mesh_axes, dims, what="layout"):
  """Every rule names a known mesh axis and a dim of the model.

  check_layout_axes, then: each rule's tensor dim is one of `dims`.

  Args:
    layout: an mtf layout string or (tensor dim, mesh axis) pairs.
    mesh_axes: the mesh's axis names.
    dims: the dim names of every tensor the layout applies to.
    what: how the message names the layout ("--layout", "layout 'a:b'").
  Raises:
    ValueError: one line naming the rule, with a did-you-mean, e.g.
      "--layout rule hedas:model names tensor dim 'hedas', which the model
      does not have (did you mean 'heads'?); its dims: ...".
  """
  check_layout_axes(layout, mesh_axes, what)
  dims = sorted(set(dims))
  for dim, axis in _rules(layout):
    if dim not in dims:
      raise ValueError(
          "%s rule %s:%s names tensor dim %r, which the model does not "
          "have%s; its dims: %s"
          % (what, dim, axis, dim, did_you_mean(dim, dims), ", ".join(dims)))
