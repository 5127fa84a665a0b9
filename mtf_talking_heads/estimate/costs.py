"""Parameters and multiplies per attention layer, by the paper's formulas.

Pure Python (no TensorFlow): safe to import anywhere, e.g. from a test that
compares these counts with the variables an mtf layer creates.

The counts follow the pseudocode of "Talking-Heads Attention" (Shazeer et al.
2020), sections 3-6 and appendix A, with n = m = ``length`` and
d_X = d_M = d_Y = ``d_model``:

  * params: the sizes of the learned tensors P_q, P_k, P_v, P_o (plus P_l,
    P_w and the dynamic-projection generators P_Xl, P_Ml, P_Xw, P_Mw where
    the variant has them; P and Q for general bilinear attention).
  * multiplies: the cost of every einsum of the pseudocode, line by line, as
    given in its comments (the product of all dimensions involved).

Dynamic projections (appendix A) are counted as the layers compute them
(``fold_dynamic="code"``, the default; attention.fold_dynamic): per
projection, the static P_l (P_w) plus the first dynamic R (R_Xl if present,
else R_Ml) in one n*m*h*h_k (n*m*h*h_v) einsum, and one more such einsum for
R_Ml (R_Mw) when an X term is there too.  Two other counts:

  * ``fold_dynamic="paper"`` (or True): every dynamic term added to the static
    projection before a single einsum, as the paper's tables tab:dp and
    tab:dp_individual print (equal to "code" with one term per projection).
  * ``fold_dynamic="none"`` (or False): the pseudocode's separate n*m einsum
    per dynamic term.

Grouped talking heads (``groups=g``, variant "grouped_talking_heads", not in
the paper): heads_k, heads, heads_v are the totals, and P_l, P_w mix heads
only within each of g groups, so P_l has h_k*h/g parameters and
L = einsum(J, P_l) costs n*m*h*h_k/g multiplies (P_w and U alike); every
other term is talking heads'.

Two figures in the paper do not follow from its pseudocode (docs/costs.md):

  * Dynamic projections are printed folded ("paper" above), the pseudocode
    writes one einsum per term ("none").
  * General bilinear attention (table tab:t5) is printed as 7.650e9; the
    pseudocode's cheapest evaluation order costs 1.208e10, which is what we
    report (``paper_multiplies_note`` below).

Example:
  >>> attention_costs("talking_heads", 24, 24, 24, 32, 32, d_model=768,
  ...                 length=512)["multiplies"]
  1912602624
"""
import collections

from mtf_talking_heads.core import spec as spec_lib

VARIANTS = spec_lib.COSTED_VARIANTS
DYNAMIC_TERMS = spec_lib.DYNAMIC_TERMS
# How dynamic terms are counted: as the layers compute them, as the paper's
# tables print them, or as the pseudocode writes them (module docstring).
FOLDINGS = ("code", "paper", "none")
COLUMNS = ("variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
           "params", "multiplies")

GROUPED = spec_lib.GROUPED
_LOGITS_TERMS = spec_lib.LOGITS_TERMS
_WEIGHTS_TERMS = spec_lib.WEIGHTS_TERMS
# Dynamic term -> (generator name, R name, dynamic-einsum name, source).
_DYNAMIC_NAMES = {
    "x2l": ("P_Xl", "R_Xl", "L_Xl", "X"),
    "m2l": ("P_Ml", "R_Ml", "L_Ml", "M"),
    "x2w": ("P_Xw", "R_Xw", "U_Xw", "X"),
    "m2w": ("P_Mw", "R_Mw", "U_Mw", "M"),
}
variant_label = spec_lib.variant_label


def _product(factors):
  result = 1
  for f in factors:
    result *= f
  return result


def _parse_folding(fold_dynamic):
  """One of FOLDINGS from a FOLDINGS name or a bool (True: paper, False: none)."""
  if isinstance(fold_dynamic, bool):
    return "paper" if fold_dynamic else "none"
  if isinstance(fold_dynamic, str) and fold_dynamic in FOLDINGS:
    return fold_dynamic
  raise ValueError("fold_dynamic must be one of %s (or True for 'paper', "
                   "False for 'none'), got %r"
                   % (", ".join(repr(f) for f in FOLDINGS), fold_dynamic))


def resolve_config(variant, heads_k, heads, heads_v, d_k, d_v, d_model,
                   length, dynamic=(), fold_dynamic="code", groups=None):
  """Validates the arguments of attention_costs; returns them normalized.

  heads_k / heads_v may be None: they then take the value the variant implies
  (heads).  For general_bilinear d_k / d_v may be None and become d_model.
  groups: the g of grouped_talking_heads (required there, None elsewhere).
  Raises ValueError naming the offending parameter and the fix; nothing is
  computed before every argument has been checked.
  """
  spec_lib.check_variant(variant, VARIANTS)
  heads = spec_lib.positive_int("heads", heads)
  d_model = spec_lib.positive_int("d_model", d_model)
  length = spec_lib.positive_int("length", length)
  spec = spec_lib.make_spec(variant, heads, d_k, d_v, heads_k, heads_v,
                            dynamic, groups, d_model)
  heads_k, heads_v, dynamic, groups = (spec.heads_k, spec.heads_v,
                                       spec.dynamic, spec.groups)
  d_k, d_v = ((d_model, d_model) if variant == spec_lib.BILINEAR
              else (spec.d_k, spec.d_v))
  fold_dynamic = _parse_folding(fold_dynamic)
  return dict([
      ("variant", variant), ("heads_k", heads_k), ("heads", heads),
      ("heads_v", heads_v), ("d_k", d_k), ("d_v", d_v), ("d_model", d_model),
      ("length", length), ("dynamic", dynamic),
      ("fold_dynamic", fold_dynamic), ("groups", groups)])


def attention_terms(variant, heads_k, heads, heads_v, d_k, d_v, d_model,
                    length, dynamic=(), fold_dynamic="code", groups=None):
  """The itemized costs behind attention_costs (same arguments).

  Returns the resolved configuration (see resolve_config) plus
    "params":     {tensor name: shape}  e.g. "P_q": (d_model, d_k, h_k)
    "param_dims": {tensor name: names of its dims} e.g. "P_q": ("d_model",
                  "d_k", "heads_k") (heads dims: heads_k, heads, heads_v,
                  groups)
    "multiplies": {einsum name: factors} e.g. "J": (n, m, d_k, h_k)
  in the order of the paper's pseudocode.  A tensor's parameter count is the
  product of its shape, an einsum's cost the product of its factors.  Shapes
  list the paper's dims (d_X/d_M/d_Y are d_model); compare them with mtf
  variables as multisets, since mtf may order the dims differently.

  Tensor names follow the paper: P_q, P_k, P_v, P_o, P_l, P_w, P_Xl, P_Ml,
  P_Xw, P_Mw (general bilinear: P, Q).  Einsum names are the tensor each one
  produces: Q, K, V, J (the dot products; called L when no P_l follows), L,
  U, O, Y, R_Xl ... R_Mw (dynamic projections), and L_Xl, L_Ml, U_Xw, U_Mw
  for the einsum of J (or W) with R_Xl, R_Ml (R_Xw, R_Mw) -- the latter are
  counted per fold_dynamic: all of them with "none", none with "paper", and
  with "code" only L_Ml (U_Mw) when the X term is there too (its R_X is
  folded into L's (U's) einsum, see attention.fold_dynamic).  General bilinear: XP = X.P, L = XP.M,
  WM = W.M, Y = WM.Q.

  Grouped talking heads: P_l is (g, h_k/g, h/g) and L (n, m, h, h_k/g), so
  h_k*h/g parameters and n*m*h*h_k/g multiplies (P_w, U, the dynamic terms
  alike).
  """
  cfg = resolve_config(variant, heads_k, heads, heads_v, d_k, d_v, d_model,
                       length, dynamic, fold_dynamic, groups)
  h_k, h, h_v = cfg["heads_k"], cfg["heads"], cfg["heads_v"]
  d_k, d_v, d = cfg["d_k"], cfg["d_v"], cfg["d_model"]
  n = m = cfg["length"]
  dyn = cfg["dynamic"]
  params = {}
  dims = {}
  mults = {}

  if variant == spec_lib.BILINEAR:
    # Section 6: L = einsum(X, M, P), Y = einsum(W, M, Q); each 3-way einsum
    # evaluated in its cheapest order (the one mtf's layer uses).
    params["P"] = (d, d, h)
    params["Q"] = (d, d, h)
    dims["P"] = dims["Q"] = ("d_model", "d_model", "heads")
    mults["XP"] = (n, d, d, h)    # X[n, d_X] . P[d_X, d_M, h] -> [n, d_M, h]
    mults["L"] = (n, m, d, h)     # . M[m, d_M] -> L[n, m, h]
    mults["WM"] = (n, m, d, h)    # W[n, m, h] . M[m, d_M] -> [n, d_M, h]
    mults["Y"] = (n, d, d, h)     # . Q[d_M, d_Y, h] -> Y[n, d_Y]
  else:
    has_l = spec_lib.VARIANT[variant].project_logits
    has_w = spec_lib.VARIANT[variant].project_weights
    params["P_q"] = (d, d_k, h_k)
    params["P_k"] = (d, d_k, h_k)
    params["P_v"] = (d, d_v, h_v)
    params["P_o"] = (d, d_v, h_v)
    dims["P_q"] = dims["P_k"] = ("d_model", "d_k", "heads_k")
    dims["P_v"] = dims["P_o"] = ("d_model", "d_v", "heads_v")
    mults["Q"] = (n, d, d_k, h_k)
    mults["K"] = (m, d, d_k, h_k)
    mults["V"] = (m, d, d_v, h_v)
    mults["J" if has_l else "L"] = (n, m, d_k, h_k)
    # P_l mixes J's h_k heads into L's h, P_w W's h into U's h_v; so do the
    # dynamic R[n or m, (h_k, h) or (h, h_v)] (made by P_Xl ... P_Mw);
    # grouped: within each of g groups, (g, h_k/g, h/g) and (g, h/g, h_v/g)
    g = cfg["groups"] or 1
    grouped = (g,) if cfg["groups"] else ()
    named = ("groups",) if cfg["groups"] else ()
    for terms, has_p, p_name, name, mixed, mixed_dims, other in (
        (_LOGITS_TERMS, has_l, "P_l", "L", grouped + (h_k // g, h // g),
         named + ("heads_k", "heads"), h_k // g),
        (_WEIGHTS_TERMS, has_w, "P_w", "U", grouped + (h // g, h_v // g),
         named + ("heads", "heads_v"), h_v // g)):
      if has_p:
        params[p_name] = mixed
        dims[p_name] = mixed_dims
      dynamic = [_DYNAMIC_NAMES[term] for term in dyn if term in terms]
      for generator, r_name, _, src in dynamic:
        params[generator] = (d,) + mixed
        dims[generator] = ("d_model",) + mixed_dims
        mults[r_name] = (n if src == "X" else m, d) + mixed
      if has_p:
        mults[name] = (n, m, h, other)
        unfolded = {"none": dynamic, "paper": [],
                    "code": dynamic[1:]}[cfg["fold_dynamic"]]
        for _, _, dynamic_name, _ in unfolded:
          mults[dynamic_name] = (n, m, h, other)
    mults["O"] = (n, m, d_v, h_v)
    mults["Y"] = (n, d, d_v, h_v)

  terms = dict(cfg)
  terms["params"] = params
  terms["param_dims"] = dims
  terms["multiplies"] = mults
  return terms


def attention_costs(variant, heads_k, heads, heads_v, d_k, d_v, d_model,
                    length, dynamic=(), fold_dynamic="code", groups=None):
  """Parameters and multiplies of one attention layer.

  Args:
    variant: one of VARIANTS.
    heads_k, heads, heads_v: the paper's h_k, h, h_v.  multi_head and
      general_bilinear use heads only; project_logits has h_v = h and
      project_weights h_k = h.  A tied value may be None (or equal to heads).
    d_k, d_v: key / value size per head; None or d_model for
      general_bilinear (which reports both as d_model).
    d_model: d_X = d_M = d_Y.
    length: n = m (queries = memory positions).
    dynamic: subset of DYNAMIC_TERMS ("x2l", "m2l", "x2w", "m2w"), as a
      sequence or a comma-separated string (appendix A).
    fold_dynamic: how the dynamic terms' n*m einsums are counted, one of
      FOLDINGS: "code" (default) as the layers compute them, "paper" (or
      True) all folded into the static projection's einsum as the paper's
      dynamic tables print, "none" (or False) one einsum per term as the
      pseudocode writes.
    groups: the number of head groups g of grouped_talking_heads (required
      there, a divisor of heads_k, heads, heads_v; None for the others).

  Returns:
    dict with keys COLUMNS: variant, heads_k, heads, heads_v, d_k, d_v (the
    resolved values), params, multiplies (ints).

  Raises:
    ValueError: naming the bad parameter and how to fix it.
  """
  return total_costs(attention_terms(variant, heads_k, heads, heads_v, d_k,
                                     d_v, d_model, length, dynamic,
                                     fold_dynamic, groups))


def total_costs(terms):
  """attention_costs' dict from an attention_terms result."""
  result = {k: terms[k] for k in COLUMNS if k not in ("params", "multiplies")}
  result["params"] = sum(_product(s) for s in terms["params"].values())
  result["multiplies"] = sum(_product(f) for f in terms["multiplies"].values())
  return result


def round_sig4(x):
  """x to the 4 significant digits the paper prints (1.611e9)."""
  return float("%.3e" % x)


# ---------------------------------------------------------------------------
# The paper's tables (d_model = 768, n = m = 512), as printed.
# heads_k / heads_v are None where the paper leaves them blank.  multiplies is
# the printed value (4 significant digits).  The dynamic-projection tables
# count multiplies with fold_dynamic="paper" (see module docstring).

PaperRow = collections.namedtuple(
    "PaperRow", ["label", "variant", "heads_k", "heads", "heads_v", "d_k",
                 "d_v", "dynamic", "params", "multiplies"])
PaperTable = collections.namedtuple(
    "PaperTable", ["tex_label", "caption", "rows"])

PAPER_D_MODEL = 768
PAPER_LENGTH = 512
_ALL_DYN = DYNAMIC_TERMS


def _rows(*rows):
  return tuple(PaperRow(*r) for r in rows)


PAPER_TABLES = dict([
    ("t5_heads", PaperTable(
        "tab:t5", "Table 1: Multi-Head vs. Talking-Heads attention on T5",
        _rows(
            ("multi-head", "multi_head", None, 6, None, 128, 128, (), 2359296, 1.611e9),
            ("multi-head", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
            ("multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
            ("multi-head", "multi_head", None, 48, None, 16, 16, (), 2359296, 1.611e9),
            ("talking-heads", "talking_heads", 6, 6, 6, 128, 128, (), 2359368, 1.629e9),
            ("talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
            ("talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
            ("talking-heads", "talking_heads", 48, 48, 48, 16, 16, (), 2363904, 2.819e9),
            ("multi-head", "multi_head", None, 24, None, 64, 64, (), 4718592, 3.221e9),
            ("general bilinear", "general_bilinear", None, 12, None, 768, 768, (), 14155776, 7.650e9),
            ("raffel2019", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
        ))),
    ("t5_heads_dims", PaperTable(
        "tab:t5_2", "Table 2: the three heads dimensions vary independently",
        _rows(
            ("talking-heads", "talking_heads", 6, 6, 6, 128, 128, (), 2359368, 1.629e9),
            ("talking-heads", "talking_heads", 6, 24, 6, 128, 128, (), 2359584, 1.686e9),
            ("talking-heads", "talking_heads", 24, 6, 24, 32, 32, (), 2359584, 1.686e9),
            ("talking-heads", "talking_heads", 6, 24, 24, 128, 32, (), 2360016, 1.799e9),
            ("talking-heads", "talking_heads", 24, 24, 6, 32, 128, (), 2360016, 1.799e9),
            ("talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
        ))),
    ("t5_logits_weights", PaperTable(
        "tab:t5_3", "Table 3: logits-projection only and weights-projection only",
        _rows(
            ("multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
            ("project logits", "project_logits", 24, 24, None, 32, 32, (), 2359872, 1.762e9),
            ("project weights", "project_weights", None, 24, 24, 32, 32, (), 2359872, 1.762e9),
            ("talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
        ))),
    ("dp", PaperTable(
        "tab:dp", "Appendix A: dynamic-projections results on T5",
        _rows(
            ("multi-head", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
            ("talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
            ("dyn. proj.", "talking_heads", 12, 12, 12, 64, 64, _ALL_DYN, 2801952, 1.913e9),
            ("multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
            ("talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
            ("dynamic proj.", "talking_heads", 24, 24, 24, 32, 32, _ALL_DYN, 4129920, 2.819e9),
        ))),
    ("dp_individual", PaperTable(
        "tab:dp_individual",
        "Appendix A: one dynamic projection at a time",
        _rows(
            ("talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
            ("dyn. proj. P_Xl", "talking_heads", 12, 12, 12, 64, 64, ("x2l",), 2470176, 1.743e9),
            ("dyn. proj. P_Xw", "talking_heads", 12, 12, 12, 64, 64, ("x2w",), 2470176, 1.743e9),
            ("dyn. proj. P_Ml", "talking_heads", 12, 12, 12, 64, 64, ("m2l",), 2470176, 1.743e9),
            ("dyn. proj. P_Mw", "talking_heads", 12, 12, 12, 64, 64, ("m2w",), 2470176, 1.743e9),
            ("dyn. proj.", "talking_heads", 12, 12, 12, 64, 64, _ALL_DYN, 2801952, 1.913e9),
        ))),
])

# Printed figures that do not follow from the paper's pseudocode:
# (variant, what we count instead).  Everything else matches exactly.
PAPER_MISMATCHES = {
    spec_lib.BILINEAR: (
        "multiplies: the paper prints 7.650e9 = 2*n*d^2*h + 2*n*m*d, i.e. "
        "its n*m*d_M*h contractions without the factor h; the pseudocode "
        "costs 2*n*d^2*h + 2*n*m*d*h = 1.208e10"),
}


def paper_row_costs(row):
  """Our costs for a PaperRow, counted the paper's way (fold_dynamic="paper").

  Returns attention_costs' dict plus paper_params, paper_multiplies and
  params_match / multiplies_match (multiplies compared at the paper's 4
  significant digits).
  """
  result = attention_costs(
      row.variant, row.heads_k, row.heads, row.heads_v, row.d_k, row.d_v,
      PAPER_D_MODEL, PAPER_LENGTH, dynamic=row.dynamic, fold_dynamic="paper")
  result["paper_params"] = row.params
  result["paper_multiplies"] = row.multiplies
  result["params_match"] = result["params"] == row.params
  result["multiplies_match"] = (
      round_sig4(result["multiplies"]) == row.multiplies)
  return result
