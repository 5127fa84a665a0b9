"""The small-regime models (h * d_k = d_model): byte tasks, gin configs that
train, the sweep's small scale and curves, the comparison and the demo."""
import csv
import doctest
import json
import math
import os

import pytest

from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments import sweep

SMALL_TABLES = ("lm_heads", "encdec_heads", "lm_variants", "span_heads")


# ------------------------------------------------------------- byte tasks


def test_lm_bytes_task_is_the_corpus_bytes():
  import seqio  # pylint: disable=g-import-not-at-top
  import mtf_talking_heads.data  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  task = seqio.get_mixture_or_task("th_lm_bytes")
  ds = task.get_dataset({"inputs": 32, "targets": 32}, split="validation",
                        shuffle=False)
  examples = list(ds.take(20).as_numpy_iterator())
  assert examples and all("inputs" not in ex for ex in examples)
  vocab = task.output_features["targets"].vocabulary
  assert vocab.vocab_size == 259
  for ex in examples:
    targets = ex["targets"].tolist()
    assert 2 <= len(targets) <= 32 and targets[-1] == 1  # EOS
    text = vocab.decode(targets[:-1])
    assert text and text.isprintable()


# ------------------------------------------------------------- gin rows


@pytest.mark.parametrize("table", SMALL_TABLES)
def test_small_tables_keep_h_times_dk_equal_to_d_model(table):
  rows = sweep.paper_table_rows(table)
  assert {r.variant for r in rows} >= {"multi_head", "talking_heads"}
  for row in rows:
    assert row.heads * row.d_k == row.heads * row.d_v == 128, row.name
    assert sweep.scale_files(row, "small") == ()
    assert sweep.scale_files(row, "tiny") == (
        "models/%s_tiny.gin" % sweep.model_of(row),)
    with pytest.raises(ValueError, match="use --scale small or tiny"):
      sweep.scale_files(row, "base")


def test_paper_rows_refuse_small_scale():
  row = sweep.paper_table_rows("t5_heads")[0]
  with pytest.raises(ValueError, match="use --scale base or tiny"):
    sweep.scale_files(row, "small")


def test_talking_heads_extra_multiplies_in_the_papers_proportion():
  """At h = 8 (d_model 128, n = 128) talking heads costs 1.17x multi-head's
  multiplies per layer; the paper's T5 at h = 24 costs 1.19x."""
  from mtf_talking_heads.estimate import costs  # pylint: disable=g-import-not-at-top

  def ratio(h, d_k, d_model, n):
    th = costs.attention_costs("talking_heads", h, h, h, d_k, d_k, d_model, n)
    mh = costs.attention_costs("multi_head", h, h, h, d_k, d_k, d_model, n)
    return th["multiplies"] / mh["multiplies"]

  assert ratio(8, 16, 128, 128) == pytest.approx(1.167, abs=1e-3)
  assert ratio(24, 32, 768, 512) == pytest.approx(1.1875, abs=1e-3)


# ------------------------------------------------------------- sweep


def test_sweep_small_scale_curves_in_one_train_call(tmp_path):
  rows = sweep.select_rows(sweep.paper_table_rows("lm_heads"), "2,6")
  job = sweep.Sweep(rows, str(tmp_path), scale="small", seeds=3,
                    train_steps=1000, eval_steps=[250, 500, 750, 1000],
                    table="lm_heads")
  run = job.runs()[0]
  assert [c[1] for c in run.commands] == ["train", "eval"]
  assert run.commands[0][-2:] == ["--train_steps", "1000"]
  assert run.commands[1][-2:] == ["--checkpoint_steps", "250,500,750,1000"]
  assert job.cost_length[rows[0].name] == 128
  text = job.dry_run_text()
  assert "ln(PPL) at 250,500,750,1000" in text
  with pytest.raises(ValueError, match="ascending"):
    sweep.Sweep(rows, str(tmp_path / "x"), scale="small",
                eval_steps=[250, 250, 1000], table="lm_heads")


# ------------------------------------------------------------- comparison


def test_comparison_doctests():
  failures, tried = doctest.testmod(comparison)
  assert tried >= 5 and failures == 0


def _write_run(model_dir, points, step_time, steps=40):
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, "eval_results.csv"), "w") as f:
    f.write("step,split,ln_ppl,tokens\n")
    for step, value in sorted(points.items()):
      f.write("%d,validation,%f,100\n" % (step, value))
  with open(os.path.join(model_dir, "train_log.csv"), "w") as f:
    f.write("step,loss,steps_per_sec,elapsed_sec\n")
    for step in range(1, steps + 1):
      rate = 0.5 if step <= 3 else 1.0 / step_time  # slow start-up ignored
      f.write("%d,1.0,%f,%f\n" % (step, rate, step * step_time))


def test_compare_pairs_by_heads_and_seed(tmp_path):
  rows = sweep.select_rows(sweep.paper_table_rows("lm_heads"), "2,6")
  mh, th = rows

  def model_dir(row, seed):
    return str(tmp_path / row.name / str(seed))

  # seed 1: th better by 0.1 at every step; seed 2: by 0.2
  for seed, gap in ((1, 0.1), (2, 0.2)):
    _write_run(model_dir(mh, seed), {0: 5.5, 500: 2.6, 1000: 2.4}, 0.1)
    _write_run(model_dir(th, seed), {0: 5.5, 500: 2.6 - gap,
                                     1000: 2.4 - gap}, 0.2)
  records = comparison.compare(rows, 3, model_dir)
  assert [r["seed"] for r in records] == [1, 2]  # seed 3 has no runs
  assert [round(r["delta_equal_steps"], 6) for r in records] == [-0.1, -0.2]
  # equal time = mh's 100 s: th at step 500
  assert [round(r["delta_equal_time"], 6) for r in records] == [
      round(2.5 - 2.4, 6), round(2.4 - 2.4, 6)]
  assert records[0]["step_time_sec"] == pytest.approx(0.2)
  # mh never reaches th's final loss (a lower bound: > 1000/1000 steps);
  # every seed's mh reaches th's step-500 loss: seed 1's 2.5 at step 750
  # (1.5x), seed 2's 2.4 at step 1000 (2x)
  assert [r["steps_multiplier"] for r in records] == [None, None]
  assert [r["multiplier_at_step"] for r in records] == [500, 500]
  assert [r["steps_multiplier_common"] for r in records] == [
      pytest.approx(1.5), pytest.approx(2.0)]
  summary, = comparison.summarize(records, {th.name: "talking-heads"})
  mean, se, n = summary["delta_steps"]
  assert (mean, se, n) == (pytest.approx(-0.15), pytest.approx(0.05), 2)
  assert summary["wins"] == 2 and summary["step_time_ratio"][0] == 2.0
  table = comparison.markdown([summary])
  assert "| talking-heads | 8 |" in table and "-0.150 ± 0.050" in table
  assert "> 1.00× (not reached in 1000 steps)" in table
  assert "1.75× ± 0.250 at step 500" in table
  comparison.write(str(tmp_path), rows, 2, model_dir,
                   {th.name: "talking-heads"})
  with open(tmp_path / comparison.COMPARISON_CSV) as f:
    assert len(list(csv.DictReader(f))) == 2
  # the gap at every evaluated step (step 0 is not a comparison)
  with open(tmp_path / comparison.GAP_CSV) as f:
    gaps = list(csv.DictReader(f))
  assert [(int(g["step"]), round(float(g["delta"]), 6),
           round(float(g["se"]), 6), int(g["seeds"])) for g in gaps] == [
               (500, -0.15, 0.05, 2), (1000, -0.15, 0.05, 2)]
  md = (tmp_path / comparison.COMPARISON_MD).read_text()
  assert ("| variant | heads | vs | Δ step 500 | Δ step 1000 |\n|---|---:|---|"
          "---:|---:|\n| talking-heads | 8 | 02_multi_head_8_16 | -0.150 ± "
          "0.050 | -0.150 ± 0.050 |") in md
  # a seed that evaluated fewer steps is counted where it has them; a step
  # only one run of the pair evaluated is not a comparison
  _write_run(model_dir(th, 3), {500: 2.3, 750: 2.2}, 0.2)
  _write_run(model_dir(mh, 3), {500: 2.6}, 0.1)
  gaps = comparison.gap_by_step(rows, 3, model_dir)
  assert [(g["step"], g["seeds"]) for g in gaps] == [(500, 3), (1000, 2)]
  assert gaps[0]["delta"] == pytest.approx((-0.1 - 0.2 - 0.3) / 3)
  assert "| -0.200 ± 0.058 | -0.150 ± 0.050 (n=2) |" in (
      comparison.gap_markdown(gaps, {th.name: "talking-heads"}))
  # only finished runs count (results.csv); no pairs: no table
  finished = {(mh.name, 1), (th.name, 1), (mh.name, 2)}
  assert [(g["step"], round(g["delta"], 6), g["seeds"]) for g in
          comparison.gap_by_step(rows, 3, model_dir, finished)] == [
              (500, -0.1, 1), (1000, -0.1, 1)]
  assert comparison.gap_by_step([mh], 3, model_dir) == []
  assert comparison.gap_markdown([], {}) == ""
  png = comparison.plot_curves(rows, 2, model_dir, str(tmp_path / "c.png"))
  assert os.path.getsize(png) > 1000
  # the demo quotes a recorded sweep's comparison.csv
  from mtf_talking_heads.commands import demo  # pylint: disable=g-import-not-at-top
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"scale": "small", "train_steps": 1000,
               "eval_steps": [500, 1000]}, f)
  text = demo.recorded_sweep(comparison, str(tmp_path))
  assert "| 8 | 2 | -0.150 ± 0.050 | +0.050 ± 0.050 | 2/2 |" in text
  assert "small scale, 1000 steps, evaluated at 500,1000" in text
  summary = comparison.summarize(records, {})[0]
  assert "more than twice" in demo.verdict(-0.15, summary)
  summary["delta_steps"] = (-0.01, 0.05, 2)
  assert "not distinguishable from seed noise" in demo.verdict(-0.2, summary)
  assert "not in this installation" in demo.recorded_sweep(
      comparison, str(tmp_path / "none"))


def test_median_step_time_ignores_start_up_and_resumes(tmp_path):
  d = str(tmp_path)
  with open(os.path.join(d, "train_log.csv"), "w") as f:
    f.write("step,loss,steps_per_sec,elapsed_sec\n")
    for step in range(1, 41):
      # 10 slow start-up rows (skipped) and 3 slow rows after a resume at
      # step 31 (outvoted by the median); without the skip, 13 of 40
      # rows are slow and the median moves
      slow = step <= 10 or step in (31, 32, 33)
      f.write("%d,1,%f,0\n" % (step, 0.01 if slow else 4.0))
  assert comparison.median_step_time(d) == pytest.approx(0.25)
  assert math.isnan(comparison.median_step_time(str(tmp_path / "none")))


def test_equal_time_survives_rounding_and_missing_step_times(tmp_path):
  """budget / step_time may land one ulp past the final step; a run without
  a train log has no time: its equal-time figures are None, not wrong."""
  t = 0.13599563200165277  # (1000 * t) / t == 1000.0000000000001
  mh = comparison.Curve({500: 2.6, 1000: 2.4}, t)
  th = comparison.Curve({500: 2.5, 1000: 2.3}, 2 * t)
  delta, _ = comparison.equal_time_delta(mh, th)
  assert delta == pytest.approx(2.4 - 2.5)
  nan = comparison.Curve({500: 2.5, 1000: 2.3}, float("nan"))
  assert comparison.equal_time_delta(nan, mh) == (None, None)
  assert nan.at_step(float("nan")) is None
  rows = sweep.select_rows(sweep.paper_table_rows("lm_heads"), "2,6")

  def model_dir(row, seed):
    return str(tmp_path / row.name / str(seed))

  _write_run(model_dir(rows[0], 1), {500: 2.6, 1000: 2.4}, 0.1)
  _write_run(model_dir(rows[1], 1), {500: 2.5, 1000: 2.3}, 0.1)
  os.remove(os.path.join(model_dir(rows[1], 1), "train_log.csv"))
  record, = comparison.compare(rows, 1, model_dir)
  assert record["delta_equal_steps"] == pytest.approx(-0.1)
  assert record["delta_equal_time"] is None
  assert record["time_multiplier"] is None
  # a run whose curve does not reach the common final step is skipped,
  # and so is one that is not finished
  _write_run(model_dir(rows[1], 2), {250: 2.9}, 0.1)
  _write_run(model_dir(rows[0], 2), {500: 2.6, 1000: 2.4}, 0.1)
  assert [r["seed"] for r in comparison.compare(rows, 2, model_dir)] == [1]
  assert comparison.compare(rows, 2, model_dir,
                            finished={(rows[0].name, 1)}) == []


# ------------------------------------------------------------- training


@pytest.mark.slow
def test_demo_end_to_end_at_tiny_scale(tmp_path, capsys):
  """`mtf_th demo` trains the multi-head and talking-heads LM rows for real
  (a two-row sweep: one `mtf_th train` and one `mtf_th eval` process per
  row), and the sweep's records, tables, plots and progress lines are
  filled from what those processes wrote.  The real runs of the suite's
  other models: the encoder-decoder's multi-head row in
  test_finetune_chain.py (its pre-training, through `mtf_th sweep`), its
  talking-heads layers in test_span_heads.py, one step of every attention
  class in test_experiments_train.py."""
  from mtf_talking_heads.commands import demo  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "demo")
  argv = ["--output_dir", out, "--scale", "tiny", "--heads", "4",
          "--train_steps", "4", "--eval_every", "2"]
  status = demo.main(argv)
  assert status == 0
  captured = capsys.readouterr()
  text = captured.out
  assert "held-out ln(PPL) after 4 steps" in text
  assert "| multi-head | 4 | 32 |" in text and "| talking-heads | 4 | 32 |" in text
  assert "at equal steps" in text and "at equal time" in text
  for row in ("01_multi_head_4_32", "05_talking_heads_4_32"):
    run = os.path.join(out, "runs", row, "seed_1")
    with open(os.path.join(run, "eval_results.csv")) as f:
      curve = {int(r["step"]): float(r["ln_ppl"]) for r in csv.DictReader(f)}
    assert sorted(curve) == [2, 4], (row, curve)
    assert curve[2] > curve[4] > 0, (row, curve)  # the LM learns
    with open(os.path.join(run, "train_log.csv")) as f:
      losses = [float(r["loss"]) for r in csv.DictReader(f)]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses), row
  for name in ("demo.md", "curves.png", "results.csv", "comparison.csv"):
    assert os.path.exists(os.path.join(out, name)), name
  # the sweep's records of the two real runs (lm_tiny: d_model 128,
  # length 32)
  with open(os.path.join(out, "results.csv")) as f:
    records = list(csv.DictReader(f))
  assert [r["variant"] for r in records] == ["multi_head", "talking_heads"]
  for r in records:
    for key in ("early_ln_ppl", "final_ln_ppl", "step_time_sec", "wall_sec",
                "cpu_sec"):
      assert math.isfinite(float(r[key])) and float(r[key]) > 0, key
    assert int(r["cost_length"]) == 32 and int(r["d_model"]) == 128
    # ln(PPL) of a 4-step byte LM is near ln(259 bytes), far from 0
    assert 2.0 < float(r["final_ln_ppl"]) < 12.0, r
  with open(os.path.join(out, "results.md")) as f:
    assert len([l for l in f.read().splitlines() if l.startswith("| ")
                and not l.startswith("|  | h_k")]) == 2  # one line a row
  for name in sweep.PLOTS:
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(4) == b"\x89PNG", name
  assert "[2/2]" in captured.err and "ETA" in captured.err
  # a second invocation resumes: nothing to train, same table
  assert demo.main(argv) == 0
  again = capsys.readouterr()
  assert "2 runs, 2 already recorded" in again.err
  assert "[1/2]" not in again.err
  assert "| multi-head | 4 | 32 |" in again.out
  with open(os.path.join(out, "results.csv")) as f:
    assert len(list(csv.DictReader(f))) == 2
  assert demo.main(["--output_dir", out, "--heads", "5"]) == 2


def test_side_by_side_step_times_replace_the_runs_own(tmp_path):
  rows = sweep.select_rows(sweep.paper_table_rows("lm_heads"), "2,6")
  mh, th = rows

  def model_dir(row, seed):
    return str(tmp_path / row.name / str(seed))

  _write_run(model_dir(mh, 1), {500: 2.6, 1000: 2.4}, 0.3)  # a loaded moment
  _write_run(model_dir(th, 1), {500: 2.5, 1000: 2.3}, 0.1)
  with open(tmp_path / comparison.STEP_TIMES, "w") as f:
    f.write("row,step_time_sec,ratio_to_multi_head\n")
    f.write("%s,0.10000,1.0\n%s,0.20000,2.0\n" % (mh.name, th.name))
  records = comparison.compare(rows, 1, model_dir,
                               comparison.read_step_times(str(tmp_path)))
  assert records[0]["step_time_sec"] == 0.2
  assert records[0]["delta_equal_time"] == pytest.approx(2.5 - 2.4)
  assert records[0]["step_time_source"] == "side by side"
  # only one row of the pair measured: both keep their own times
  with open(tmp_path / comparison.STEP_TIMES, "w") as f:
    f.write("row,step_time_sec,ratio_to_multi_head\n%s,0.2,1.0\n" % th.name)
  record, = comparison.compare(rows, 1, model_dir,
                               comparison.read_step_times(str(tmp_path)))
  assert record["step_time_sec"] == pytest.approx(0.1)
  assert record["step_time_source"] == "own run"
  with open(tmp_path / comparison.STEP_TIMES, "w") as f:
    f.write("row,step_time_sec,ratio_to_multi_head\n")
    f.write("%s,0.10000,1.0\n%s,0.20000,2.0\n" % (mh.name, th.name))
  comparison.write(str(tmp_path), rows, 1, model_dir, {})
  assert "measured side by side" in (
      tmp_path / comparison.COMPARISON_MD).read_text()


def test_demo_equal_time_cell_before_the_first_evaluation():
  """A load spike can put the equal-time step before the first evaluation:
  the demo's table says so instead of crashing."""
  from mtf_talking_heads.commands import demo  # pylint: disable=g-import-not-at-top
  curve = comparison.Curve({250: 2.6, 500: 2.3}, step_time=0.1)
  assert demo._at_time(curve, 375.0) == "2.450 (step 375)"
  assert demo._at_time(curve, 120.0) == (
      "n/a (step 120, before the first evaluation at step 250)")
  assert demo._at_time(curve, None) == "n/a"
