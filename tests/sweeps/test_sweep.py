"""Tests for the mtf_talking_heads/experiments/sweep package and `mtf_th sweep` (docs/sweeps.md).

* Dry runs of every paper table: the printed params / multiplies per
  attention layer equal the paper's printed figures wherever those follow from
  its formulas (costs.PAPER_TABLES, itself checked against the LaTeX by
  test_costs.py), and the rows match the paper's heads / dims.
* Grid specs: the explicit-values path reproduces Table 1's rows; unknown
  dims and inconsistent ties are ValueErrors naming the culprit.
* The sweep machinery end to end with a stand-in `mtf_th` (a small script that
  writes train_log.csv / eval_results.csv the way the training package does, with
  known numbers): CSV, markdown, PNGs, means / stds, resume after a failure,
  rerun skips.  Fast, in the default run.
* Real runs (slow) are elsewhere: `mtf_th demo`'s two-row sweep with its
  records, tables, plots, progress lines and resume
  (tests/training/test_small_regime.py) and `mtf_th sweep --finetune` through the
  CLI, rerun included (tests/sweeps/test_finetune_chain.py).
"""
import csv
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import _cli_util
from mtf_talking_heads import cli
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.experiments import sweep

REPO = _cli_util.REPO

TABLES = ("albert_heads", "albert_logits_weights", "bert_heads", "dp",
          "dp_enc_only", "dp_individual", "t5_enc_dec", "t5_heads",
          "t5_heads_dims", "t5_logits_weights")
# Small-regime tables (h * d_k = d_model; tests/training/test_small_regime.py).
SMALL_TABLES = ("encdec_heads", "lm_heads", "lm_variants", "scaling_d128",
                "scaling_d192", "scaling_d256", "span_heads")

# The paper's (label, h, d_k) for the tables without cost columns (ALBERT,
# BERT: tab:albert, tab:albert-logit-weight-only, tab:bert).
NO_COST_TABLES = {
    "albert_heads": [("multi_head", 6, 128), ("multi_head", 12, 64),
                     ("multi_head", 24, 32), ("multi_head", 48, 16),
                     ("talking_heads", 6, 128), ("talking_heads", 12, 64),
                     ("talking_heads", 24, 32), ("talking_heads", 48, 16)],
    "albert_logits_weights": [("multi_head", 12, 64),
                              ("project_logits", 12, 64),
                              ("project_weights", 12, 64),
                              ("talking_heads", 12, 64)],
    "bert_heads": [("multi_head", 12, 64)] + [
        ("talking_heads", h, 768 // h)
        for h in (6, 12, 24, 48, 64, 96, 192, 384, 768)],
}
# tab:t5_4 and tab:dp_enc_only: first / last rows printed, middle "various".
PLACEMENT_TABLES = {
    "t5_enc_dec": [("multi-head", 2359296, 1.611e9), "various", "various",
                   "various", ("talking-heads", 2360448, 1.913e9)],
    "dp_enc_only": [("multi-head", 2359296, 1.611e9), "various", "various"],
}


def _dry_run(capsys, *args):
  code = cli.main(["sweep", "--dry_run"] + list(args))
  out = capsys.readouterr()
  assert code == 0, out.err
  return out.out


def _md_rows(text):
  """Data rows of the (first) markdown table in `text`, as lists of cells."""
  rows = []
  for line in text.splitlines():
    if line.startswith("| ") and not line.startswith("|  | h_k"):
      rows.append([c.strip() for c in line.strip("|").split("|")])
  return rows


def _sci(cell):
  mantissa, exponent = cell.split("·10^")
  return float(mantissa + "e" + exponent)


def test_list_paper_tables_prints_one_name_a_line(capsys):
  assert cli.main(["sweep", "--list_paper_tables"]) == 0
  assert capsys.readouterr().out.splitlines() == sorted(TABLES + SMALL_TABLES)


@pytest.mark.parametrize("table", [t for t in TABLES
                                   if t in costs.PAPER_TABLES])
def test_dry_run_costs_equal_the_papers(table, tmp_path, capsys):
  out_dir = tmp_path / "never_written"
  text = _dry_run(capsys, "--paper_table", table, "--scale", "base",
                  "--seeds", "2", "--output_dir", str(out_dir))
  assert not out_dir.exists()   # a dry run writes nothing
  rows = _md_rows(text)
  paper = costs.PAPER_TABLES[table].rows
  assert len(rows) == len(paper)
  assert "multiplies per att. layer (n=m=512)" in text
  assert "ln(PPL) 65536 steps (std)" in text
  assert "ln(PPL) 524288 steps (std)" in text
  for cells, ref in zip(rows, paper):
    hk, h, hv, dk, dv = cells[1:6]
    assert int(h) == ref.heads
    assert (hk or None) == (None if ref.heads_k is None else str(ref.heads_k))
    assert (hv or None) == (None if ref.heads_v is None else str(ref.heads_v))
    if ref.variant != "general_bilinear":
      assert (int(dk), int(dv)) == (ref.d_k, ref.d_v)
    assert cells[6:9] == ["", "", ""]   # ln(PPL) x 2 and step time: not run
    assert int(cells[9]) == ref.params
    if ref.variant == "general_bilinear":
      # docs/costs.md: the printed 7.650e9 does not follow from the
      # pseudocode; we print the pseudocode's 1.208e10.
      assert _sci(cells[10]) == 1.208e10 != ref.multiplies
    else:
      assert _sci(cells[10]) == ref.multiplies
  # 2 seeds -> 2 runs per row, each "train to 65536, train to 524288, eval".
  commands = [l for l in text.splitlines() if l.startswith("mtf_th ")]
  assert len(commands) == 3 * 2 * len(paper)
  assert commands[0].split()[:2] == ["mtf_th", "train"]
  assert commands[0].endswith("--train_steps 65536")
  assert commands[2].endswith("--checkpoint_steps 65536,524288")


@pytest.mark.parametrize("table", sorted(PLACEMENT_TABLES))
def test_dry_run_placement_tables_print_various(table, tmp_path, capsys):
  rows = _md_rows(_dry_run(capsys, "--paper_table", table, "--scale", "base",
                           "--output_dir", str(tmp_path)))
  expected = PLACEMENT_TABLES[table]
  assert len(rows) == len(expected)
  for cells, ref in zip(rows, expected):
    if ref == "various":
      assert cells[9:11] == ["various", "various"]
      assert (cells[1], cells[2], cells[3]) == ("24*", "24", "24*")
    else:
      assert cells[0] == ref[0]
      assert (int(cells[9]), _sci(cells[10])) == ref[1:]


@pytest.mark.parametrize("table", sorted(NO_COST_TABLES))
def test_dry_run_albert_bert_rows_follow_section5(table, tmp_path, capsys):
  """No printed costs in the paper: rows and section 5's closed form."""
  text = _dry_run(capsys, "--paper_table", table, "--scale", "base",
                  "--output_dir", str(tmp_path))
  rows = _md_rows(text)
  assert len(rows) == len(NO_COST_TABLES[table])
  n = m = 512
  d = 768
  for cells, (variant, h, dk) in zip(rows, NO_COST_TABLES[table]):
    assert (int(cells[2]), int(cells[4]), int(cells[5])) == (h, dk, dk)
    p_l = variant in ("talking_heads", "project_logits")
    p_w = variant in ("talking_heads", "project_weights")
    params = 4 * d * dk * h + (h * h if p_l else 0) + (h * h if p_w else 0)
    mults = (2 * dk * h) * (n * d + m * d + n * m) + n * m * h * (
        (h if p_l else 0) + (h if p_w else 0))
    assert int(cells[9]) == params
    assert _sci(cells[10]) == float("%.3e" % mults)


def test_dry_run_tiny_uses_the_tiny_models_length_and_width(tmp_path, capsys):
  text = _dry_run(capsys, "--paper_table", "t5_heads", "--rows", "2,6",
                  "--output_dir", str(tmp_path), "--train_steps", "400",
                  "--eval_steps", "100,400")
  rows = _md_rows(text)
  # d_model = 64, n = m = 64 (models/t5_tiny.gin), h = 12, d_k = d_v = 64
  assert "(n=m=64)" in text and "d_model = 64" in text
  n, d, h, dk = 64, 64, 12, 64
  assert int(rows[0][9]) == 4 * d * dk * h
  assert _sci(rows[0][10]) == float("%.3e" % (h * 2 * dk * (2 * n * d + n * n)))
  assert int(rows[1][9]) == 4 * d * dk * h + 2 * h * h
  commands = [l for l in text.splitlines() if l.startswith("mtf_th ")]
  # 100 is a multiple of save_checkpoints_steps (100 at tiny): one train call.
  assert len(commands) == 4
  assert "--gin_file models/t5_tiny.gin" in commands[0]
  assert commands[0].endswith("--train_steps 400")


def test_dry_run_tpu_commands(tmp_path, capsys):
  text = _dry_run(capsys, "--paper_table", "t5_heads", "--rows", "7",
                  "--scale", "base", "--output_dir", "gs://bucket/t5",
                  "--tpu", "my-tpu", "--tpu_zone", "europe-west4-a")
  commands = [l for l in text.splitlines() if l.startswith("mtf_th ")]
  # 65536 is not a multiple of save_checkpoints_steps (1000): two train calls
  assert [c.split()[1] for c in commands] == ["train", "train", "eval"]
  for c in commands:
    assert "--tpu my-tpu --tpu_zone europe-west4-a" in c
    assert "--model_dir gs://bucket/t5/runs/07_talking_heads_24_32/seed_1" in c
    assert "models/t5_tiny.gin" not in c


# ---------------------------------------------------------------------------
# Grids.

def test_grid_reproduces_table_1_rows(tmp_path):
  rows = sweep.grid_rows(
      sweep.parse_grid(["variant=multi_head,talking_heads",
                        "heads=6,12,24,48"]),
      sweep.parse_ties(["d_k=768/heads", "d_v=768/heads"]))
  paper = sweep.paper_table_rows("t5_heads")[:8]
  fields = ("variant",) + sweep.DIMS
  assert [tuple(getattr(r, f) for f in fields) for r in rows] == [
      tuple(getattr(r, f) for f in fields) for r in paper]
  grid_sweep = sweep.Sweep(rows, str(tmp_path), scale="base", train_steps=8)
  paper_sweep = sweep.Sweep(paper, str(tmp_path), scale="base", train_steps=8)
  for g, p in zip(rows, paper):
    assert grid_sweep.cost_record(g) == paper_sweep.cost_record(p)
    # The gin the grid row trains with sets the same macros as the file.
    gin_g = sweep.GinConfig(g.gin_files, g.gin_params)
    gin_p = sweep.GinConfig(p.gin_files)
    for macro in sweep.DIMS + ("d_model", "enc_self_attention"):
      assert gin_g.get(macro) == gin_p.get(macro), macro


def test_grid_placement_binds_like_the_papers_th_enc_self():
  row, = sweep.grid_rows({"heads": [24]}, {"d_k": ("div", 768, "heads")},
                         variant="talking_heads", placement="enc_self")
  paper = sweep.paper_table_rows("t5_enc_dec")[1]
  assert (row.label, row.placement) == ("TH-enc-self", "enc_self")
  ours, theirs = (sweep.GinConfig(row.gin_files, row.gin_params),
                  sweep.GinConfig(paper.gin_files))
  for macro in ("enc_self_attention", "dec_self_attention",
                "encdec_attention") + sweep.DIMS:
    assert str(ours.get(macro)) == str(theirs.get(macro)), macro


def test_grid_dynamic_and_general_bilinear_rows():
  dp, = sweep.grid_rows({"heads": [12]}, {"d_k": ("const", 64, None)},
                        variant="dynamic_projections", dynamic=["m2w"])
  assert dp.dynamic == ("m2w",) and 'dynamic = ["m2w"]' in dp.gin_params
  assert dp.name.endswith("_m2w")
  gb, = sweep.grid_rows({"heads": [12]}, variant="general_bilinear")
  assert gb.name == "general_bilinear_h12"
  assert not any(p.startswith("d_k") for p in gb.gin_params)


@pytest.mark.parametrize("grid,ties,variant,pattern", [
    (["heads=6", "width=3"], [], "talking_heads",
     r"^grid: unknown dim 'width' in 'width=3'; choose from variant, heads_k"),
    (["heads=6,7"], ["d_k=768/heads"], "talking_heads",
     r"^tie d_k=768/heads is inconsistent with heads=7: 768/7 = 109.7 is not "
     r"an integer"),
    (["heads=6"], ["d_k=768/hedas"], "talking_heads",
     r"^tie 'd_k=768/hedas': unknown dim 'hedas' on the right"),
    (["heads=6"], ["dk=768/heads"], "talking_heads",
     r"^tie: unknown dim 'dk' in 'dk=768/heads'"),
    (["heads=6", "d_k=64"], ["d_k=768/heads"], "talking_heads",
     r"^d_k is both a grid key and tied \(d_k=768/heads\)"),
    (["heads=6"], ["d_k=d_v", "d_v=d_k"], "talking_heads",
     r"^ties form a cycle: d_k=d_v, d_v=d_k"),
    (["heads=6"], [], "talking_heads",
     r"^d_k has no value: give --grid d_k=... or --tie d_k=768/heads"),
    (["heads=6", "heads_k=3"], ["d_k=64"], "multi_head",
     r"^grid row multi_head_hk3_h6.*: heads_k=3 conflicts with heads=6"),
    (["heads=6,0"], ["d_k=64"], "talking_heads",
     r"^grid: heads must be a positive integer, got 0"),
    (["heads=6"], ["d_k=64"], "talking_head",
     r"^variant='talking_head' is unknown; choose from multi_head"),
    (["variant=talking_heads,multi_heads", "heads=6"], ["d_k=64"], None,
     r"^grid: variant 'multi_heads' is unknown"),
])
def test_bad_grid_specs_are_clear_value_errors(grid, ties, variant, pattern):
  with pytest.raises(ValueError, match=pattern):
    sweep.grid_rows(sweep.parse_grid(grid), sweep.parse_ties(ties),
                    variant=variant)


@pytest.mark.parametrize("variant,dynamic,pattern", [
    ("talking_heads", ["x2l"], r"^dynamic=x2l is only used by variant "
     r"'dynamic_projections'"),
    ("dynamic_projections", ["x2q"], r"^grid row .*: dynamic term 'x2q' is "
     r"unknown"),
])
def test_bad_dynamic_terms_are_clear_value_errors(variant, dynamic, pattern):
  with pytest.raises(ValueError, match=pattern):
    sweep.grid_rows({"heads": [4]}, {"d_k": ("const", 8, None)},
                    variant=variant, dynamic=dynamic)


@pytest.mark.parametrize("args,pattern", [
    (["--grid", "heads=6,7", "--tie", "d_k=768/heads"],
     r"inconsistent with heads=7"),
    (["--grid", "hedas=6", "--tie", "d_k=768/heads"], r"unknown dim 'hedas'"),
    (["--paper_table", "t5_head"], r"paper_table='t5_head' is unknown"),
    (["--paper_table", "t5_heads", "--rows", "0-3"], r"outside 1-11"),
    (["--paper_table", "t5_heads", "--grid", "heads=6"],
     r"--paper_table defines its own rows"),
    (["--paper_table", "t5_heads", "--scale", "huge"],
     r"scale='huge' is unknown"),
    (["--paper_table", "t5_heads", "--eval_steps", "100,50",
      "--train_steps", "50"], r"must be ascending"),
    (["--paper_table", "t5_heads", "--eval_steps", "10,50",
      "--train_steps", "60"], r"the last must equal train_steps=60"),
    (["--paper_table", "t5_heads", "--seeds", "0"],
     r"seeds must be a positive integer"),
])
def test_cli_bad_input_exits_2_before_training(args, pattern, tmp_path,
                                               capsys):
  out_dir = tmp_path / "out"
  variant = [] if "--paper_table" in args else ["--variant", "talking_heads"]
  code = cli.main(["sweep"] + variant + ["--output_dir", str(out_dir)] + args)
  err = capsys.readouterr().err
  assert code == 2
  assert err.startswith("mtf_th sweep: error: ") and re.search(pattern, err)
  assert not out_dir.exists()


# ---------------------------------------------------------------------------
# The machinery, with a stand-in for `mtf_th train` / `mtf_th eval`.

FAKE_MTF_TH = textwrap.dedent('''
    """Stand-in for `mtf_th train|eval`: same files, known numbers.

    ln(PPL) at step s = 5 - heads/100 - s/1000 + seed/500; loss per step
    likewise; 0.01 s per step (steps_per_sec 100).  Appends one line per call
    to $FAKE_CALLS; exits 3 with an error line when $FAKE_FAIL is in the model_dir.
    """
    import argparse, csv, os, re, sys
    cmd = sys.argv[1]
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir"); p.add_argument("--train_steps", type=int)
    p.add_argument("--checkpoint_steps"); p.add_argument("--keep_checkpoint_steps")
    p.add_argument("--gin_file", action="append", default=[])
    p.add_argument("--gin_param", action="append", default=[])
    a = p.parse_args(sys.argv[2:])
    with open(os.environ["FAKE_CALLS"], "a") as f:
      f.write("%s %s %s\\n" % (cmd, a.model_dir, a.train_steps or a.checkpoint_steps))
    if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in a.model_dir:
      print("Some log line", file=sys.stderr)
      print("mtf_th %s: error: lost task 1 (localhost:1) of the cluster" % cmd,
            file=sys.stderr)
      sys.exit(3)
    params = dict(re.match(r"(\\w+) = (.*)", q).groups() for q in a.gin_param)
    heads, seed = int(params["heads"]), int(params["seed"])
    f = lambda s: 5.0 - heads / 100.0 - s / 1000.0 + seed / 500.0
    os.makedirs(a.model_dir, exist_ok=True)
    log = os.path.join(a.model_dir, "train_log.csv")
    if cmd == "train":
      done = sum(1 for _ in open(log)) - 1 if os.path.exists(log) else 0
      with open(log, "a") as out:
        if not done:
          out.write("step,loss,steps_per_sec,elapsed_sec\\n")
        for s in range(done + 1, a.train_steps + 1):
          out.write("%d,%.6f,100,%.2f\\n" % (s, f(s) + 1.0, s / 100.0))
    else:
      with open(os.path.join(a.model_dir, "eval_results.csv"), "w") as out:
        out.write("step,split,ln_ppl,tokens\\n")
        for s in a.checkpoint_steps.split(","):
          out.write("%s,validation,%.6f,1000\\n" % (s, f(int(s))))
    ''')


@pytest.fixture
def fake_mtf_th(tmp_path, monkeypatch):
  script = tmp_path / "fake_mtf_th.py"
  script.write_text(FAKE_MTF_TH)
  calls = tmp_path / "calls.txt"
  calls.write_text("")
  monkeypatch.setenv("FAKE_CALLS", str(calls))
  return [sys.executable, str(script)], calls


def _grid_sweep(output_dir, launcher, seeds=2, log=None, **kwargs):
  rows = sweep.grid_rows({"variant": ["multi_head", "talking_heads"],
                          "heads": [4, 8]}, {"d_k": ("div", 32, "heads")})
  return sweep.Sweep(rows, str(output_dir), scale="tiny", seeds=seeds,
                     train_steps=20, eval_steps=(5, 20), launcher=launcher,
                     log=log or open(os.devnull, "w"), **kwargs)


def _read_csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_sweep_end_to_end_with_stand_in_trainer(tmp_path, fake_mtf_th):
  launcher, calls = fake_mtf_th
  out = tmp_path / "sweep"
  job = _grid_sweep(out, launcher)
  summary = job.run()
  records = _read_csv(out / "results.csv")
  assert [(r["row"], r["seed"]) for r in records] == [
      (row.name, str(s)) for s in (1, 2) for row in job.rows]
  for r in records:
    heads, seed = int(r["heads"]), int(r["seed"])
    assert float(r["early_ln_ppl"]) == pytest.approx(
        5 - heads / 100 - 0.005 + seed / 500)
    assert float(r["final_ln_ppl"]) == pytest.approx(
        5 - heads / 100 - 0.020 + seed / 500)
    assert float(r["step_time_sec"]) == pytest.approx(0.01)
    assert int(r["cost_length"]) == 64 and int(r["d_model"]) == 64
    assert math.isfinite(float(r["wall_sec"])) and float(r["cpu_sec"]) >= 0
    params, mults, _ = sweep.row_costs(
        [row for row in job.rows if row.name == r["row"]][0], 64, 64)
    assert (int(r["params"]), int(r["multiplies"])) == (params, mults)
  # 5 is not a multiple of save_checkpoints_steps (100): two train calls.
  lines = calls.read_text().splitlines()
  assert len(lines) == 4 * 2 * 3
  assert [l.split()[0] for l in lines[:3]] == ["train", "train", "eval"]
  # Summary: mean over seeds 1, 2 -> +0.003, sample std of {.002, .004}.
  th8 = [s for s in summary if s["row"].name.startswith("talking_heads")
         and s["row"].heads == 8][0]
  assert th8["seeds"] == 2
  assert th8["final"][0] == pytest.approx(5 - 0.08 - 0.02 + 0.003)
  assert th8["final"][1] == pytest.approx(math.sqrt(2e-6))
  md = (out / "results.md").read_text()
  rows = _md_rows(md)
  assert len(rows) == 4
  # Best (lowest) ln(PPL): the 8-head rows tie; both bold.
  assert rows[1][7] == "**4.903** (0.001)" and rows[3][7] == "**4.903** (0.001)"
  assert rows[0][7] == "4.943 (0.001)" and rows[0][6] == "4.958 (0.001)"
  assert rows[1][6] == "**4.918** (0.001)"
  assert rows[0][8] == "**0.0100**"   # all equal: all fastest
  assert rows[0][1:4] == ["", "4", ""] and rows[2][1:4] == ["4", "4", "4"]
  for name in sweep.PLOTS:
    assert (out / name).read_bytes()[:4] == b"\x89PNG"
  with open(out / "sweep.json") as f:
    assert json.load(f)["eval_steps"] == [5, 20]
  # Rerun: everything is recorded, nothing runs.
  _grid_sweep(out, launcher).run()
  assert len(calls.read_text().splitlines()) == 4 * 2 * 3
  # More seeds: only the new seed's runs.
  _grid_sweep(out, launcher, seeds=3).run()
  assert len(calls.read_text().splitlines()) == 4 * 3 * 3
  assert len(_read_csv(out / "results.csv")) == 12


def test_failed_run_loses_only_itself_and_resumes(tmp_path, fake_mtf_th,
                                                  monkeypatch):
  launcher, calls = fake_mtf_th
  out = tmp_path / "sweep"
  job = _grid_sweep(out, launcher, seeds=1)
  failing = job.rows[2].name   # the third row fails
  monkeypatch.setenv("FAKE_FAIL", failing)
  with pytest.raises(RuntimeError) as failure:
    job.run()
  log = out / "runs" / failing / "seed_1" / "sweep.log"
  # one line: the run's own error line (a lost --cluster task, say) and log
  assert str(failure.value) == (
      "run %s seed 1 failed (exit status 3) in `%s train`: mtf_th train: "
      "error: lost task 1 (localhost:1) of the cluster (log %s); rerun the "
      "sweep to resume" % (failing, " ".join(launcher), log))
  first_two = [r["row"] for r in _read_csv(out / "results.csv")]
  assert first_two == [job.rows[0].name, job.rows[1].name]
  # The partial run left files; the rerun starts it over and does the rest.
  assert (out / "runs" / failing / "seed_1" / "sweep.log").exists()
  monkeypatch.delenv("FAKE_FAIL")
  before = len(calls.read_text().splitlines())
  _grid_sweep(out, launcher, seeds=1).run()
  new = calls.read_text().splitlines()[before:]
  assert {l.split()[1].split(os.sep)[-2] for l in new} == {
      job.rows[2].name, job.rows[3].name}
  assert [r["row"] for r in _read_csv(out / "results.csv")] == [
      r.name for r in job.rows]


def test_rerun_with_other_settings_is_refused(tmp_path, fake_mtf_th):
  launcher, _ = fake_mtf_th
  out = tmp_path / "sweep"
  _grid_sweep(out, launcher, seeds=1).run()
  rows = sweep.grid_rows({"heads": [4]}, {"d_k": ("const", 8, None)},
                         variant="talking_heads")
  other = sweep.Sweep(rows, str(out), train_steps=20, eval_steps=(5, 20),
                      launcher=launcher)
  with pytest.raises(ValueError, match=r"holds a sweep with other settings "
                     r"\(rows differ"):
    other.run()


def test_run_in_flight_continues_from_its_checkpoint(tmp_path, fake_mtf_th):
  """A run directory with a checkpoint is resumed (its files stay, the
  trainer continues); one without a checkpoint starts over."""
  launcher, calls = fake_mtf_th
  out = tmp_path / "sweep"
  job = _grid_sweep(out, launcher, seeds=1)
  resumed, restarted = job.runs()[0].model_dir, job.runs()[1].model_dir
  for model_dir in (resumed, restarted):
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "marker"), "w") as f:
      f.write("from the interrupted piece")
  with open(os.path.join(resumed, "model.ckpt-5.index"), "w") as f:
    f.write("")
  with open(os.path.join(resumed, sweep.RUN_TIME), "w") as f:
    json.dump({"wall_sec": 100.0, "cpu_sec": 50.0}, f)
  job.run()
  assert os.path.exists(os.path.join(resumed, "marker"))
  assert not os.path.exists(os.path.join(restarted, "marker"))
  records = {r["row"]: r for r in _read_csv(out / "results.csv")}
  # time spent before the interruption is added to the run's record
  assert float(records[job.rows[0].name]["wall_sec"]) >= 100.0
  assert float(records[job.rows[0].name]["cpu_sec"]) >= 50.0
  assert float(records[job.rows[1].name]["wall_sec"]) < 100.0


def test_eval_steps_give_curves_and_rows_may_be_added(tmp_path, fake_mtf_th):
  launcher, calls = fake_mtf_th
  out = tmp_path / "sweep"
  rows = sweep.grid_rows({"variant": ["multi_head", "talking_heads"],
                          "heads": [4, 8]}, {"d_k": ("div", 32, "heads")})
  first = sweep.Sweep(rows[:2], str(out), scale="tiny", seeds=1,
                      train_steps=20, eval_steps=(5, 10, 20),
                      launcher=launcher, log=open(os.devnull, "w"))
  first.run()
  evals = _read_csv(os.path.join(first.runs()[0].model_dir,
                                 "eval_results.csv"))
  assert [int(r["step"]) for r in evals] == [5, 10, 20]
  before = len(calls.read_text().splitlines())
  grown = sweep.Sweep(rows, str(out), scale="tiny", seeds=1, train_steps=20,
                      eval_steps=(5, 10, 20), launcher=launcher,
                      log=open(os.devnull, "w"))
  grown.run()  # the two recorded runs stay; only the new rows run
  new = calls.read_text().splitlines()[before:]
  assert {l.split()[1].split(os.sep)[-2] for l in new} == {
      r.name for r in rows[2:]}
  assert (out / "comparison.md").exists()
  assert (out / sweep.CURVES_PLOT).read_bytes()[:4] == b"\x89PNG"


def test_report_rewrites_tables_without_training(tmp_path, fake_mtf_th):
  launcher, calls = fake_mtf_th
  out = tmp_path / "sweep"
  with pytest.raises(ValueError, match="holds no sweep"):
    _grid_sweep(out, launcher, seeds=1).run(train=False)
  _grid_sweep(out, launcher, seeds=1).run()
  before = len(calls.read_text().splitlines())
  (out / "results.md").unlink()
  (out / "comparison.md").unlink()
  log = io.StringIO()
  _grid_sweep(out, launcher, seeds=2, log=log).run(train=False)  # no seed 2
  assert len(calls.read_text().splitlines()) == before
  assert "8 runs, 4 already recorded" in log.getvalue()
  assert (out / "results.md").exists() and (out / "comparison.md").exists()


_SLEEPER = textwrap.dedent('''\
    import os, sys, time
    with open(os.environ["SLEEPER_PID"] + ".tmp", "w") as f:
      f.write(str(os.getpid()))
    os.rename(os.environ["SLEEPER_PID"] + ".tmp", os.environ["SLEEPER_PID"])
    time.sleep(600)
    ''')

_KILLED_SWEEP = textwrap.dedent('''\
    import sys
    from mtf_talking_heads.experiments import sweep
    rows = sweep.grid_rows({"variant": ["multi_head"], "heads": [4]},
                           {"d_k": ("div", 32, "heads")})
    sweep.Sweep(rows, sys.argv[1], scale="tiny", seeds=1, train_steps=20,
                eval_steps=(5, 20), launcher=[sys.executable, sys.argv[2]],
                log=sys.stderr).run()
    ''')


def test_a_killed_sweep_takes_its_run_with_it(tmp_path, monkeypatch):
  """SIGKILL (no handler runs) on the sweep: its training command gets
  SIGTERM, as on Ctrl-C, instead of training on with no one to record it,
  even when the sweep was started with SIGINT and SIGTERM ignored."""
  sleeper = tmp_path / "sleeper.py"
  sleeper.write_text(_SLEEPER)
  pid_file = tmp_path / "run.pid"
  monkeypatch.setenv("SLEEPER_PID", str(pid_file))
  # started as a shell without job control starts `mtf_th sweep &` (SIGINT
  # ignored), SIGTERM ignored too (`trap '' TERM`): inherited by its runs
  # unless the sweep resets it
  proc = subprocess.Popen([sys.executable, "-c", _KILLED_SWEEP,
                           str(tmp_path / "sweep"), str(sleeper)],
                          cwd=REPO, stderr=subprocess.DEVNULL,
                          preexec_fn=lambda: _cli_util.set_stop_signals(
                              signal.SIG_IGN))
  try:
    deadline = time.time() + 120
    while not pid_file.exists():
      assert proc.poll() is None and time.time() < deadline
      time.sleep(0.1)
    child = int(pid_file.read_text())
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
      time.sleep(0.1)
    assert not _alive(child), "the sweep's run outlived it"
  finally:
    if proc.poll() is None:
      proc.kill()


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open("/proc/%d/stat" % pid) as f:  # a zombie is gone too
    return f.read().split(")")[-1].split()[0] != "Z"
