"""Tests for mtf_talking_heads/estimate/costs.py and `mtf_th costs` (docs/costs.md).

The formula tests load costs.py straight from its file: costs.py is pure
Python, but `import mtf_talking_heads.<anything>` runs the package __init__,
which imports TensorFlow (~8 s).  Only the CLI tests at the end import the
package (they have to: they go through mtf_talking_heads.cli).

The paper's printed figures are transcribed here independently of
costs.PAPER_TABLES (which the CLI prints); test_cli_paper_tables_match_...
checks the two agree and test_transcription_matches_paper_tex checks this
transcription against the LaTeX source when it is available.
"""
import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

import _cli_util

REPO = pathlib.Path(__file__).resolve().parents[2]
PAPER_TEX = pathlib.Path(os.environ.get(
    "MTF_TH_PAPER_TEX",
    REPO.parent / "shared" / "paper" / "talking-heads-attention.tex"))


def _load_costs():
  spec = importlib.util.spec_from_file_location(
      "_costs_under_test", REPO / "mtf_talking_heads" / "estimate" / "costs.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


costs = _load_costs()

D_MODEL, N = 768, 512          # the paper's T5 setting; n = m = 512
ALL4 = ("x2l", "m2l", "x2w", "m2w")

# (table, label as printed, variant, h_k, h, h_v, d_k, d_v, dynamic,
#  printed params, printed multiplies).  Blank heads cells are None.
PAPER_ROWS = [
    # Table 1 (tab:t5)
    ("t5_heads", "multi-head", "multi_head", None, 6, None, 128, 128, (), 2359296, 1.611e9),
    ("t5_heads", "multi-head", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
    ("t5_heads", "multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
    ("t5_heads", "multi-head", "multi_head", None, 48, None, 16, 16, (), 2359296, 1.611e9),
    ("t5_heads", "talking-heads", "talking_heads", 6, 6, 6, 128, 128, (), 2359368, 1.629e9),
    ("t5_heads", "talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
    ("t5_heads", "talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
    ("t5_heads", "talking-heads", "talking_heads", 48, 48, 48, 16, 16, (), 2363904, 2.819e9),
    ("t5_heads", "multi-head", "multi_head", None, 24, None, 64, 64, (), 4718592, 3.221e9),
    ("t5_heads", "general bilinear", "general_bilinear", None, 12, None, 768, 768, (), 14155776, 7.650e9),
    ("t5_heads", "raffel2019", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
    # Table 2 (tab:t5_2)
    ("t5_heads_dims", "talking-heads", "talking_heads", 6, 6, 6, 128, 128, (), 2359368, 1.629e9),
    ("t5_heads_dims", "talking-heads", "talking_heads", 6, 24, 6, 128, 128, (), 2359584, 1.686e9),
    ("t5_heads_dims", "talking-heads", "talking_heads", 24, 6, 24, 32, 32, (), 2359584, 1.686e9),
    ("t5_heads_dims", "talking-heads", "talking_heads", 6, 24, 24, 128, 32, (), 2360016, 1.799e9),
    ("t5_heads_dims", "talking-heads", "talking_heads", 24, 24, 6, 32, 128, (), 2360016, 1.799e9),
    ("t5_heads_dims", "talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
    # Table 3 (tab:t5_3)
    ("t5_logits_weights", "multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
    ("t5_logits_weights", "project logits", "project_logits", 24, 24, None, 32, 32, (), 2359872, 1.762e9),
    ("t5_logits_weights", "project weights", "project_weights", None, 24, 24, 32, 32, (), 2359872, 1.762e9),
    ("t5_logits_weights", "talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
    # Appendix A (tab:dp)
    ("dp", "multi-head", "multi_head", None, 12, None, 64, 64, (), 2359296, 1.611e9),
    ("dp", "talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
    ("dp", "dyn. proj.", "talking_heads", 12, 12, 12, 64, 64, ALL4, 2801952, 1.913e9),
    ("dp", "multi-head", "multi_head", None, 24, None, 32, 32, (), 2359296, 1.611e9),
    ("dp", "talking-heads", "talking_heads", 24, 24, 24, 32, 32, (), 2360448, 1.913e9),
    ("dp", "dynamic proj.", "talking_heads", 24, 24, 24, 32, 32, ALL4, 4129920, 2.819e9),
    # Appendix A (tab:dp_individual)
    ("dp_individual", "talking-heads", "talking_heads", 12, 12, 12, 64, 64, (), 2359584, 1.686e9),
    ("dp_individual", "dyn. proj. $P_{Xl}$", "talking_heads", 12, 12, 12, 64, 64, ("x2l",), 2470176, 1.743e9),
    ("dp_individual", "dyn. proj. $P_{Xw}$", "talking_heads", 12, 12, 12, 64, 64, ("x2w",), 2470176, 1.743e9),
    ("dp_individual", "dyn. proj. $P_{Ml}$", "talking_heads", 12, 12, 12, 64, 64, ("m2l",), 2470176, 1.743e9),
    ("dp_individual", "dyn. proj. $P_{Mw}$", "talking_heads", 12, 12, 12, 64, 64, ("m2w",), 2470176, 1.743e9),
    ("dp_individual", "dyn. proj.", "talking_heads", 12, 12, 12, 64, 64, ALL4, 2801952, 1.913e9),
]
TEX_LABELS = {"t5_heads": "tab:t5", "t5_heads_dims": "tab:t5_2",
              "t5_logits_weights": "tab:t5_3", "dp": "tab:dp",
              "dp_individual": "tab:dp_individual"}


def _row_id(row):
  table, _, variant, hk, h, hv, dk, dv, dyn, params, mults = row
  number = [r for r in PAPER_ROWS if r[0] == table].index(row) + 1
  heads = "h%d" % h if hk is None and hv is None else "hk%s_h%d_hv%s" % (
      hk if hk is not None else "=h", h, hv if hv is not None else "=h")
  dyn = ("+" + "+".join(dyn)) if dyn else ""
  return "%s_row%d:%s%s_%s_dk%d_dv%d->%d_params,%.3e_mults" % (
      table, number, variant, dyn, heads, dk, dv, params, mults)


def _sig4(x):
  return float("%.3e" % x)


def _costs_of(row, fold_dynamic=True):
  _, _, variant, hk, h, hv, dk, dv, dyn, _, _ = row
  return costs.attention_costs(variant, hk, h, hv, dk, dv, D_MODEL, N,
                               dynamic=dyn, fold_dynamic=fold_dynamic)


MATCHING_ROWS = [r for r in PAPER_ROWS if r[2] != "general_bilinear"]
GB_ROW = [r for r in PAPER_ROWS if r[2] == "general_bilinear"]
assert len(PAPER_ROWS) == 33 and len(GB_ROW) == 1


# ----------------------------------------------------------------------------
# Every row of Tables 1-3 and of tab:dp / tab:dp_individual.

@pytest.mark.parametrize("row", MATCHING_ROWS,
                         ids=[_row_id(r) for r in MATCHING_ROWS])
def test_paper_row_params_exact_and_multiplies_to_4_digits(row):
  got = _costs_of(row, fold_dynamic=True)  # how the paper counts dyn. terms
  assert got["params"] == row[9]
  assert _sig4(got["multiplies"]) == row[10], got["multiplies"]


@pytest.mark.parametrize("row", GB_ROW, ids=[
    "t5_heads:general_bilinear_params_match_but_paper_7.650e9_is_not_the_"
    "pseudocode_1.208e10"])
def test_general_bilinear_paper_multiplies_do_not_follow_pseudocode(row):
  got = _costs_of(row)
  h, d, n, m = 12, D_MODEL, N, N
  assert got["params"] == row[9] == 2 * d * d * h   # P and Q: [d, d, h]
  # Cheapest order of the pseudocode's two 3-way einsums:
  # X.P (n d d h), .M (n m d h); W.M (n m d h), .Q (n d d h).
  assert got["multiplies"] == 2 * n * d * d * h + 2 * n * m * d * h
  assert got["multiplies"] == 12079595520 and _sig4(got["multiplies"]) == 1.208e10
  assert _sig4(got["multiplies"]) != row[10]
  # docs/costs.md: the printed 7.650e9 is that sum with the factor h missing
  # from the two n*m*d_M*h contractions.
  assert _sig4(2 * n * d * d * h + 2 * n * m * d) == row[10] == 7.650e9
  assert (got["d_k"], got["d_v"]) == (d, d)
  terms = costs.attention_terms("general_bilinear", None, 12, None, None,
                                None, D_MODEL, N)
  assert terms["params"] == {"P": (d, d, h), "Q": (d, d, h)}
  assert list(terms["multiplies"]) == ["XP", "L", "WM", "Y"]


@pytest.mark.parametrize("name", list(TEX_LABELS))
def test_cli_paper_tables_match_this_transcription(name):
  ours = [r[2:] for r in PAPER_ROWS if r[0] == name]
  cli = [(r.variant, r.heads_k, r.heads, r.heads_v, r.d_k, r.d_v,
          tuple(r.dynamic), r.params, r.multiplies)
         for r in costs.PAPER_TABLES[name].rows]
  assert cli == ours
  assert costs.PAPER_TABLES[name].tex_label == TEX_LABELS[name]
  # paper_row_costs (what --paper_table prints) agrees with the tests above.
  for row in costs.PAPER_TABLES[name].rows:
    r = costs.paper_row_costs(row)
    assert r["params_match"]
    assert r["multiplies_match"] == (row.variant != "general_bilinear")


def _tex_rows(tex, label):
  body = tex.split(r"\label{%s}" % label, 1)[1].split(r"\end{tabular}", 1)[0]
  rows = []
  for line in body.splitlines():
    cells = [c.strip() for c in line.rstrip().rstrip("\\").split("&")]
    if len(cells) == 13 and cells[11].isdigit():
      mant, exp = re.match(r"\$([\d.]+) \\cdot 10\^\{?(\d+)\}?\$",
                           cells[12]).groups()
      heads = tuple(int(c.rstrip("*")) if c else None for c in cells[1:4])
      rows.append(heads + (int(cells[4]), int(cells[5]), int(cells[11]),
                           float(mant + "e" + exp)))
  return rows


@pytest.mark.skipif(not PAPER_TEX.exists(),
                    reason="paper LaTeX not found at %s" % PAPER_TEX)
@pytest.mark.parametrize("name", list(TEX_LABELS))
def test_transcription_matches_paper_tex(name):
  tex = PAPER_TEX.read_text()
  ours = [tuple(r[3:8]) + (r[9], r[10]) for r in PAPER_ROWS if r[0] == name]
  assert _tex_rows(tex, TEX_LABELS[name]) == ours


# ----------------------------------------------------------------------------
# The formulas themselves.

@pytest.mark.parametrize("args,params,multiplies", [
    (("talking_heads", 24, 24, 24, 32, 32), 2360448, 1912602624),
    (("multi_head", None, 12, None, 64, 64), 2359296, 1610612736),
    (("project_logits", 24, 24, None, 32, 32), 2359872, 1761607680),
    (("project_weights", None, 24, 24, 32, 32), 2359872, 1761607680),
    (("general_bilinear", None, 12, None, None, None), 14155776, 12079595520),
], ids=["talking_heads_24_exact", "multi_head_12_exact",
        "project_logits_24_exact", "project_weights_24_exact",
        "general_bilinear_12_exact_pseudocode_count"])
def test_exact_counts(args, params, multiplies):
  got = costs.attention_costs(*args, d_model=D_MODEL, length=N)
  assert (got["params"], got["multiplies"]) == (params, multiplies)
  assert list(got) == ["variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
                       "params", "multiplies"]


@pytest.mark.parametrize("variant,hk,h,hv,dk,dv", [
    ("multi_head", None, 8, None, 40, 24),
    ("talking_heads", 6, 24, 12, 128, 40),
    ("talking_heads", 16, 4, 5, 7, 9),
    ("project_logits", 6, 20, None, 48, 30),
    ("project_weights", None, 20, 3, 48, 30),
], ids=["multi_head_uneven_dk_dv", "talking_heads_hk<h>hv",
        "talking_heads_h<hk,hv", "project_logits_hk!=h",
        "project_weights_hv!=h"])
def test_matches_section5_closed_form(variant, hk, h, hv, dk, dv):
  """Section 5: (d_k h_k + d_v h_v)(n d_X + m d_M + n m) + n m h (h_k + h_v)."""
  n = m = 100
  d = 96
  got = costs.attention_costs(variant, hk, h, hv, dk, dv, d, n)
  h_k = h if hk is None else hk
  h_v = h if hv is None else hv
  proj = (n * m * h * h_k if variant in ("talking_heads", "project_logits")
          else 0) + (n * m * h * h_v
                     if variant in ("talking_heads", "project_weights") else 0)
  assert got["multiplies"] == (dk * h_k + dv * h_v) * (n * d + m * d + n * m) + proj
  assert got["params"] == 2 * d * (dk * h_k + dv * h_v) + (
      h_k * h if variant in ("talking_heads", "project_logits") else 0) + (
          h * h_v if variant in ("talking_heads", "project_weights") else 0)
  assert (got["heads_k"], got["heads_v"]) == (h_k, h_v)


@pytest.mark.parametrize("dynamic", [
    ("x2l",), ("m2l",), ("x2w",), ("m2w",), ("x2l", "m2w"), ALL4,
], ids=["x2l", "m2l", "x2w", "m2w", "x2l+m2w", "all_four"])
def test_dynamic_terms_pseudocode_vs_folded(dynamic):
  """Each term adds d h_k h (or d h h_v) params and an R projection; the
  pseudocode also adds n m h h_k (n m h h_v) per term, the paper's folding
  none, the code's one per projection that has both an X and an M term."""
  hk, h, hv, d, n = 6, 24, 12, 96, 50
  static = costs.attention_costs("talking_heads", hk, h, hv, 16, 20, d, n)
  folded = costs.attention_costs("talking_heads", hk, h, hv, 16, 20, d, n,
                                 dynamic=dynamic, fold_dynamic=True)
  full = costs.attention_costs("talking_heads", hk, h, hv, 16, 20, d, n,
                               dynamic=",".join(dynamic), fold_dynamic=False)
  code = costs.attention_costs("talking_heads", hk, h, hv, 16, 20, d, n,
                               dynamic=dynamic)
  size = {"x2l": hk * h, "m2l": hk * h, "x2w": h * hv, "m2w": h * hv}
  assert folded["params"] == full["params"] == code["params"] == (
      static["params"] + sum(d * size[t] for t in dynamic))
  assert folded["multiplies"] == static["multiplies"] + sum(
      n * d * size[t] for t in dynamic)
  assert full["multiplies"] == folded["multiplies"] + sum(
      n * n * size[t] for t in dynamic)
  # the code folds R_X (or a lone R_M) into the static einsum; an R_M next
  # to an R_X of the same projection keeps its own n x m einsum.
  unfolded_m = [t for t in ("m2l", "m2w")
                if t in dynamic and "x" + t[1:] in dynamic]
  assert code["multiplies"] == folded["multiplies"] + sum(
      n * n * size[t] for t in unfolded_m)


def test_dynamic_counts_at_the_papers_row():
  """All four terms, h = 12, d_k = d_v = 64: paper 1.913e9 (tab:dp_individual
  bottom row), the code one n m h h more per projection, pseudocode four."""
  def count(fold):
    return costs.attention_costs("talking_heads", 12, 12, 12, 64, 64,
                                 D_MODEL, N, dynamic=ALL4, fold_dynamic=fold)
  assert {count(f)["params"] for f in costs.FOLDINGS} == {2801952}
  assert count("paper")["multiplies"] == 1912602624
  code, none = count("code")["multiplies"], count("none")["multiplies"]
  assert code == 1912602624 + 2 * N * N * 12 * 12 == 1988100096
  assert none == 1912602624 + 4 * N * N * 12 * 12 == 2063597568
  assert costs.attention_costs(
      "talking_heads", 12, 12, 12, 64, 64, D_MODEL, N,
      dynamic=ALL4)["multiplies"] == count("code")["multiplies"]


@pytest.mark.parametrize("row", costs.PAPER_TABLES["dp_individual"].rows
                         [1:-1], ids=lambda r: r.label)
def test_single_term_rows_match_the_paper_by_default(row):
  """With one dynamic term the code's count (the default) is the paper's."""
  got = costs.attention_costs(
      row.variant, row.heads_k, row.heads, row.heads_v, row.d_k, row.d_v,
      costs.PAPER_D_MODEL, costs.PAPER_LENGTH, dynamic=row.dynamic)
  assert len(row.dynamic) == 1
  assert costs.round_sig4(got["multiplies"]) == row.multiplies
  assert got["params"] == row.params


def test_terms_itemize_the_totals_with_the_papers_names():
  terms = costs.attention_terms("talking_heads", 6, 24, 12, 16, 20, 96, 50,
                                dynamic=("m2w", "x2l"))
  assert terms["dynamic"] == ("x2l", "m2w")    # canonical order
  assert terms["params"] == {
      "P_q": (96, 16, 6), "P_k": (96, 16, 6), "P_v": (96, 20, 12),
      "P_o": (96, 20, 12), "P_l": (6, 24), "P_Xl": (96, 6, 24),
      "P_w": (24, 12), "P_Mw": (96, 24, 12)}
  # one term per projection: folded into L's and U's einsums (the default)
  assert list(terms["multiplies"]) == [
      "Q", "K", "V", "J", "R_Xl", "L", "R_Mw", "U", "O", "Y"]
  unfolded = costs.attention_terms("talking_heads", 6, 24, 12, 16, 20, 96, 50,
                                   dynamic=("m2w", "x2l"), fold_dynamic="none")
  assert list(unfolded["multiplies"]) == [
      "Q", "K", "V", "J", "R_Xl", "L", "L_Xl", "R_Mw", "U", "U_Mw", "O", "Y"]
  both = costs.attention_terms("talking_heads", 6, 24, 12, 16, 20, 96, 50,
                               dynamic=("x2l", "m2l"))
  assert list(both["multiplies"]) == [
      "Q", "K", "V", "J", "R_Xl", "R_Ml", "L", "L_Ml", "U", "O", "Y"]
  total = costs.total_costs(terms)
  assert total["params"] == sum(
      math.prod(s) for s in terms["params"].values())
  assert total["multiplies"] == sum(
      math.prod(f) for f in terms["multiplies"].values())


def test_multi_head_has_no_talking_heads_tensors():
  terms = costs.attention_terms("multi_head", None, 12, None, 64, 64, 768, 8)
  assert list(terms["params"]) == ["P_q", "P_k", "P_v", "P_o"]
  assert list(terms["multiplies"]) == ["Q", "K", "V", "L", "O", "Y"]


def test_module_does_not_import_tensorflow():
  # costs.py and the spec it reads, under the package's light import (the
  # mtf_th console script's: no TensorFlow in mtf_talking_heads/__init__.py)
  proc, heavy = _cli_util.heavy_imports(
      ["-c", "import mtf_talking_heads_startup as s; "
       "s.LIGHT_PACKAGE_IMPORT = True; "
       "from mtf_talking_heads.estimate import costs; "
       "print(costs.__file__ == %r)"
       % str(REPO / "mtf_talking_heads" / "estimate" / "costs.py")])
  assert proc.stdout.strip() == "True", proc.stderr[-2000:]
  assert not heavy, heavy[:3]


# ----------------------------------------------------------------------------
# Bad inputs: ValueError naming the parameter, before anything is computed.

GOOD = dict(variant="talking_heads", heads_k=24, heads=24, heads_v=24, d_k=32,
            d_v=32, d_model=768, length=512)


@pytest.mark.parametrize("changes,pattern", [
    (dict(heads=0), r"^heads must be a positive integer, got 0"),
    (dict(heads_k=-3), r"^heads_k must be a positive integer"),
    (dict(heads_v=True), r"^heads_v must be a positive integer"),
    (dict(d_k=32.0), r"^d_k must be a positive integer, got 32.0"),
    (dict(length=0), r"^length must be a positive integer"),
    (dict(d_model=None), r"^d_model must be a positive integer"),
    (dict(variant="talking-heads"),
     r"^variant='talking-heads' is not supported \(did you mean "
     r"'talking_heads'\?\); choose one of"),
    (dict(variant="bogus"), r"^variant='bogus' is not supported"),
    (dict(dynamic=("x2l", "x2q")), r"^dynamic term 'x2q' is unknown"),
    (dict(dynamic="x2l,x2l"), r"^dynamic lists x2l more than once"),
    (dict(variant="multi_head", heads_k=None, heads_v=None, dynamic=("x2l",)),
     r"^dynamic=x2l needs a talking-heads projection.*variant='talking_heads'"),
    (dict(variant="general_bilinear", heads_k=None, heads_v=None, d_k=None,
          d_v=None, dynamic="m2w"), r"^dynamic=m2w needs"),
    (dict(variant="project_logits", heads_v=None, dynamic="x2w"),
     r"^dynamic term 'x2w' adds to the weights projection P_w"),
    (dict(variant="multi_head", heads_k=6, heads_v=None),
     r"^heads_k=6 conflicts with heads=24: .*set it to 24"),
    (dict(variant="project_logits", heads_v=12),
     r"^heads_v=12 conflicts with heads=24: variant 'project_logits' has no "
     r"weights projection"),
    (dict(variant="project_weights", heads_k=12),
     r"^heads_k=12 conflicts with heads=24"),
    (dict(variant="multi_head", heads_k=None, heads_v=None, d_v=None),
     r"^d_v is required for variant 'multi_head'"),
    (dict(variant="general_bilinear", heads_k=None, heads_v=None, d_k=64,
          d_v=None), r"^d_k=64 conflicts with d_model=768: general_bilinear"),
    (dict(dynamic="x2l", fold_dynamic="yes"),
     r"^fold_dynamic must be one of 'code', 'paper', 'none'"),
], ids=["heads_zero", "heads_k_negative", "heads_v_bool", "d_k_float",
        "length_zero", "d_model_missing", "variant_hyphenated_gets_suggestion",
        "variant_unknown", "dynamic_unknown_term", "dynamic_duplicate_term",
        "dynamic_with_multi_head", "dynamic_with_general_bilinear",
        "weights_term_without_P_w", "multi_head_heads_k_differs",
        "project_logits_heads_v_differs", "project_weights_heads_k_differs",
        "d_v_missing", "general_bilinear_d_k_not_d_model",
        "fold_dynamic_not_bool"])
def test_bad_input_names_the_parameter(changes, pattern, monkeypatch):
  def no_computing(*_):
    raise AssertionError("computed costs before validating")
  monkeypatch.setattr(costs, "_product", no_computing)
  kwargs = dict(GOOD, **changes)
  with pytest.raises(ValueError, match=pattern):
    costs.attention_costs(**kwargs)


# ----------------------------------------------------------------------------
# `mtf_th costs` (imports the package, hence TensorFlow).

EXAMPLE = ["--variant", "talking_heads", "--heads_k", "24", "--heads", "24",
           "--heads_v", "24", "--d_k", "32", "--d_v", "32", "--d_model", "768",
           "--length", "512"]
EXAMPLE_CSV = ("variant,heads_k,heads,heads_v,d_k,d_v,params,multiplies\n"
               "talking_heads,24,24,24,32,32,2360448,1912602624\n")


@pytest.fixture(scope="module")
def cli():
  from mtf_talking_heads import cli as cli_module  # pylint: disable=g-import-not-at-top
  return cli_module


def test_cli_example_csv_exact(cli, capsys):
  assert cli.main(["costs"] + EXAMPLE) == 0
  out, err = capsys.readouterr()
  assert out == EXAMPLE_CSV
  assert err == ""


def test_cli_example_md_exact(cli, capsys):
  assert cli.main(["costs"] + EXAMPLE + ["--format", "md"]) == 0
  assert capsys.readouterr().out == (
      "| variant | heads_k | heads | heads_v | d_k | d_v | params | multiplies |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n"
      "| talking_heads | 24 | 24 | 24 | 32 | 32 | 2360448 | 1912602624 |\n")


@pytest.mark.parametrize("extra,row", [
    ([], "talking_heads+x2l+m2l+x2w+m2w,12,12,12,64,64,2801952,1988100096"),
    (["--fold_dynamic"],
     "talking_heads+x2l+m2l+x2w+m2w,12,12,12,64,64,2801952,1912602624"),
    (["--unfolded"],
     "talking_heads+x2l+m2l+x2w+m2w,12,12,12,64,64,2801952,2063597568"),
], ids=["dynamic_code_count", "dynamic_folded_paper_count",
        "dynamic_pseudocode_count"])
def test_cli_dynamic(cli, capsys, extra, row):
  argv = ["costs", "--variant", "talking_heads", "--dynamic", "m2w,x2l,m2l,x2w",
          "--heads", "12", "--d_k", "64", "--d_v", "64", "--d_model", "768",
          "--length", "512"] + extra
  assert cli.main(argv) == 0
  assert capsys.readouterr().out.splitlines()[1] == row


@pytest.mark.parametrize("name", list(TEX_LABELS))
def test_cli_paper_table_prints_every_row(cli, capsys, name):
  assert cli.main(["costs", "--paper_table", name]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("variant,heads_k,heads,heads_v,d_k,d_v,params,"
                      "multiplies,paper_params,paper_multiplies,match")
  rows = [r for r in PAPER_ROWS if r[0] == name]
  assert len(lines) == 1 + len(rows)
  for line, row in zip(lines[1:], rows):
    cells = line.split(",")
    assert int(cells[8]) == row[9] and float(cells[9]) == row[10]
    expected = "no:multiplies" if row[2] == "general_bilinear" else "yes"
    assert cells[10] == expected, line


def test_cli_via_console_script():
  script = pathlib.Path(sys.executable).parent / "mtf_th"
  if not script.exists():
    script = REPO / ".venv" / "bin" / "mtf_th"
  assert script.exists(), "mtf_th not installed; run pip install -e ."
  proc = subprocess.run([str(script), "costs"] + EXAMPLE, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == EXAMPLE_CSV


@pytest.mark.parametrize("argv,pattern", [
    (["--variant", "bogus"], r"argument --variant: invalid choice: 'bogus'"),
    (EXAMPLE[:4] + ["--heads", "0"] + EXAMPLE[6:],
     r"heads must be a positive integer, got 0"),
    (["--variant", "multi_head", "--heads", "12", "--d_model", "768",
      "--length", "512"], r"d_k is required for variant 'multi_head'"),
    (EXAMPLE + ["--dynamic", "x2l,q2l"], r"dynamic term 'q2l' is unknown"),
    (["--variant", "multi_head", "--dynamic", "x2l", "--heads", "12",
      "--d_k", "64", "--d_v", "64", "--d_model", "768", "--length", "512"],
     r"dynamic=x2l needs a talking-heads projection"),
    (["--heads", "twelve"], r"argument --heads: invalid int value"),
    ([], r"missing --variant, --heads, --d_model, --length"),
    (["--paper_table", "dp", "--heads", "12"],
     r"--paper_table prints the paper's own rows; drop --heads"),
    (["--paper_table", "table9"], r"argument --paper_table: invalid choice"),
], ids=["unknown_variant", "zero_heads", "missing_d_k", "unknown_dynamic_term",
        "dynamic_with_multi_head", "non_integer_heads", "nothing_given",
        "paper_table_with_config_flags", "unknown_paper_table"])
def test_cli_bad_arguments_exit_2_with_one_message(cli, capsys, argv, pattern):
  assert cli.main(["costs"] + argv) == 2
  out, err = capsys.readouterr()
  assert out == ""
  assert len(err.strip().splitlines()) == 1, err
  assert err.startswith("mtf_th costs: error: ")
  assert re.search(pattern, err), err


def test_the_import_profile_sees_tensorflow_when_it_is_imported():
  # _cli_util.heavy_imports, what the "imports no TensorFlow" tests of the
  # light commands use, finds TensorFlow where it is imported
  proc, heavy = _cli_util.heavy_imports(
      ["-c", "import mtf_talking_heads.estimate.costs, tensorflow"])
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert heavy
