"""`mtf_th sweep --scaling`: held-out loss vs training FLOPs over model sizes.

Synthetic sweeps, written here with the real tables' rows
(gin/experiments/scaling_d128, _d192, _d256) and curves whose final points
lie on known power laws: multi-head's on L = A C^-B, talking heads' where
multi-head's fit reaches it at K times talking heads' FLOPs, so the fits and
the multipliers are known in closed form.  Pure Python, no TensorFlow; one
figure is drawn.
"""
import csv
import doctest
import json
import math
import os

import pytest

import _cli_util
from mtf_talking_heads import cli
from mtf_talking_heads.core import gin_text
from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.experiments.sweep import scaling

A, B, K = 20.0, 0.07, 1.5  # multi-head: L = A C^-B; talking heads: K x
STEPS = (250, 500, 750)
EARLY = 3.0  # every curve's points before its last, unless set otherwise
# one attention layer's multiplies per sequence of 128 (results.csv), and
# the training FLOPs of one step (flops_per_step): 6 x 16 x [2 x (mult +
# 128 x 2 d_model d_ff) + 128 x d_model x 384]
MULTIPLIES = {"scaling_d128": (12582912, 14680064),
              "scaling_d192": (25165824, 27262976),
              "scaling_d256": (41943040, 44040192)}
PER_STEP = {"scaling_d128": (6241124352, 6643777536),
            "scaling_d192": (12985565184, 13388218368),
            "scaling_d256": (22145925120, 22548578304)}
PARAMS = {"scaling_d128": 393216, "scaling_d192": 884736,
          "scaling_d256": 1572864}


def _write_csv(path, header, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


def write_sweep(path, table, curves, seeds=2, offsets=None, rows=None):
  """A recorded sweep: sweep.json, results.csv, each run's CSVs.

  Args:
    curves: {variant: {step: mean ln(PPL)}}.
    offsets: {variant: per-seed offsets added to the mean (mean 0)}.
    rows: the sweep's rows (default: the table's).
  """
  rows = rows or sweep.paper_table_rows(table)
  plan = sweep.Plan(rows, str(path), scale="small", seeds=seeds,
                    eval_steps=STEPS, table=table)
  os.makedirs(str(path), exist_ok=True)
  with open(os.path.join(str(path), sweep.MANIFEST), "w") as f:
    json.dump(plan.manifest(), f)
  for seed in range(1, seeds + 1):
    for row in rows:
      shift = (offsets or {}).get(row.variant, [0.0] * seeds)[seed - 1]
      points = {s: v + shift for s, v in curves[row.variant].items()}
      model_dir = plan.model_dir(row, seed)
      _write_csv(os.path.join(model_dir, "eval_results.csv"),
                 ["step", "split", "ln_ppl", "tokens"],
                 [[s, "validation", "%.9f" % v, 1000]
                  for s, v in sorted(points.items())])
      _write_csv(os.path.join(model_dir, "train_log.csv"),
                 ["step", "loss", "steps_per_sec", "elapsed_sec"],
                 [[s, 3.0, 4.0, s / 4.0] for s in range(1, 31)])
      results.append_result(str(path), dict(
          plan.row_record(row, seed), early_ln_ppl=points[STEPS[0]],
          final_ln_ppl=points[STEPS[-1]], step_time_sec=0.25, wall_sec=1,
          cpu_sec=1))
  return plan


def law(flops):
  return A * flops ** -B


def _final_flops(table):
  mh, th = PER_STEP[table]
  return mh * STEPS[-1], th * STEPS[-1]


def th_loss(table):
  """Talking heads' final loss: multi-head's law at K x its FLOPs."""
  return law(K * _final_flops(table)[1])


@pytest.fixture(scope="module")
def three_sizes(tmp_path_factory):
  """d128 / d192 / d256; 2 seeds (multi-head +-0.02, talking heads
  +-0.01).  Multi-head d192 is at talking heads d128's final loss at step
  500: the measured multiplier at d128 is read there."""
  root = tmp_path_factory.mktemp("scaling")
  offsets = {"multi_head": [0.02, -0.02], "talking_heads": [0.01, -0.01]}
  dirs = []
  for table in ("scaling_d128", "scaling_d192", "scaling_d256"):
    mh_final, _ = _final_flops(table)
    curves = {"multi_head": {250: EARLY, 500: EARLY, 750: law(mh_final)},
              "talking_heads": {250: EARLY, 500: EARLY, 750: th_loss(table)}}
    if table == "scaling_d192":
      curves["multi_head"][500] = th_loss("scaling_d128")
    write_sweep(root / table, table, curves, offsets=offsets)
    dirs.append(str(root / table))
  return dirs


def test_flops_per_step_from_the_gin_and_results(three_sizes):
  for table, (mh, th) in MULTIPLIES.items():
    rows = sweep.paper_table_rows(table)
    config = gin_text.GinConfig(rows[0].gin_files)
    assert scaling.flops_per_step(config, mh) == PER_STEP[table][0]
    assert scaling.flops_per_step(config, th) == PER_STEP[table][1]
    assert scaling.training_flops(config, mh, 750) == 750 * PER_STEP[table][0]
    assert scaling.nonembedding_params(config, 4 * config.get("d_model") ** 2
                                       ) == PARAMS[table]
  # the sweep's own gin: a row bound to batch 8 costs half of each step
  config = gin_text.GinConfig(rows[0].gin_files, ["batch_size = 8"])
  assert scaling.flops_per_step(config, 41943040) * 2 == PER_STEP[
      "scaling_d256"][0]
  size = scaling.load_size(three_sizes[1])
  assert size.flops_per_step == {"multi_head": PER_STEP["scaling_d192"][0],
                                 "talking_heads": PER_STEP["scaling_d192"][1]}
  assert size.params["multi_head"] == PARAMS["scaling_d192"]
  assert size.finished == {"multi_head": [1, 2], "talking_heads": [1, 2]}


def test_fits_and_multipliers(three_sizes):
  result = scaling.analyse(three_sizes)
  assert [s.d_model for s in result.sizes] == [128, 192, 256]
  a, b = result.fits["multi_head"]
  assert (round(a, 6), round(b, 8)) == (A, B)
  a, b = result.fits["talking_heads"]  # A (K C)^-B = (A K^-B) C^-B
  assert (round(a, 6), round(b, 8)) == (round(A * K ** -B, 6), B)
  # every point of every size: 3 steps x 3 sizes per variant, FLOPs =
  # step x per-step FLOPs, mean of the seeds, s.e. 0.02 / 0.01
  points = result.points["talking_heads"]
  assert [(p["step"], p["flops"]) for p in points[:3]] == [
      (s, s * PER_STEP["scaling_d128"][1]) for s in STEPS]
  assert len(points) == 9 and all(
      p["se"] == pytest.approx(0.01, abs=1e-8) and p["n"] == 2
      for p in points)
  by_size = {line["d_model"]: line for line in result.lines}
  for d_model, table in ((128, "scaling_d128"), (192, "scaling_d192"),
                         (256, "scaling_d256")):
    line = by_size[d_model]
    mh_flops, th_flops = _final_flops(table)
    assert (line["baseline_flops"], line["flops"]) == (mh_flops, th_flops)
    # the CSVs hold 9 decimals
    assert line["baseline_ln_ppl"] == pytest.approx(law(mh_flops), abs=1e-8)
    assert line["ln_ppl"] == pytest.approx(th_loss(table), abs=1e-8)
    assert (line["baseline_se"], line["se"]) == pytest.approx((0.02, 0.01),
                                                              abs=1e-8)
    # paired by seed: (L_th +- 0.01) - (L_mh +- 0.02)
    assert line["delta_equal_steps"] == pytest.approx(
        th_loss(table) - law(mh_flops), abs=1e-8)
    assert line["delta_se"] == pytest.approx(0.01, abs=1e-8)
    assert line["delta_seeds"] == 2
    # multi-head's curve of the same size never gets there
    assert line["steps_multiplier"] is None
    assert round(line["compute_multiplier_fit"], 6) == K
  # the fit's multiplier is read inside multi-head's FLOPs, but at d256
  # (K x talking heads' FLOPs is past multi-head's largest)
  assert [by_size[d]["fit_status"] for d in (128, 192, 256)] == [
      "", "", "extrapolated"]
  # measured: d128's loss is multi-head d192's at step 500
  assert by_size[128]["compute_multiplier_measured"] == pytest.approx(
      500 * PER_STEP["scaling_d192"][0] / _final_flops("scaling_d128")[1],
      rel=1e-12)
  assert by_size[128]["measured_status"].startswith("d_model 192, 2 layers")
  # d192's: multi-head d256 between its steps 500 (3.0) and 750
  mh256 = law(_final_flops("scaling_d256")[0])
  step = 500 + 250 * (EARLY - th_loss("scaling_d192")) / (EARLY - mh256)
  assert by_size[192]["compute_multiplier_measured"] == pytest.approx(
      step * PER_STEP["scaling_d256"][0] / _final_flops("scaling_d192")[1],
      rel=1e-7)
  assert (by_size[256]["compute_multiplier_measured"],
          by_size[256]["measured_status"]) == (None, "not reached")


def test_command_writes_figure_and_tables(three_sizes, tmp_path, capsys):
  out = tmp_path / "scaling"
  argv = ["sweep", "--scaling"] + three_sizes + ["--output_dir", str(out)]
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  names = sorted(os.listdir(out))
  assert names == sorted([scaling.SCALING_PNG, scaling.SCALING_MD,
                          scaling.SCALING_CSV, scaling.POINTS_CSV,
                          scaling.FIT_CSV])
  with open(out / scaling.SCALING_PNG, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(out / scaling.SCALING_CSV) as f:
    lines = list(csv.DictReader(f))
  assert [(l["d_model"], l["params"], l["final_step"]) for l in lines] == [
      ("128", "393472", "750"), ("192", "884992", "750"),
      ("256", "1573120", "750")]  # talking heads: + 2 x 8 x 8 per layer
  assert [round(float(l["compute_multiplier_fit"]), 4) for l in lines] == [
      K] * 3
  assert [l["measured_status"] for l in lines][2] == "not reached"
  with open(out / scaling.FIT_CSV) as f:
    fits = {r["variant"]: r for r in csv.DictReader(f)}
  assert round(float(fits["multi_head"]["b"]), 5) == B
  with open(out / scaling.POINTS_CSV) as f:
    assert len(list(csv.DictReader(f))) == 18
  with open(out / scaling.SCALING_MD) as f:
    md = f.read()
  assert "| d_model 128, 2 layers | 393,216 | 750 | talking-heads |" in md
  assert "1.50× (extrapolated)" in md and "| not reached |" in md
  assert "mtf_th sweep --scaling" in md  # the command that made it
  assert "| multi-head | 3 | 20 | 0.0700 |" in printed


def test_heads_picks_the_rows_of_a_heads_sweep(three_sizes, tmp_path):
  """A sweep with several head counts (lm_heads) is one size of the curve
  with --scaling_heads; without it, it is refused."""
  curves = {"multi_head": {250: EARLY, 500: EARLY, 750: 2.4},
            "talking_heads": {250: EARLY, 500: EARLY, 750: 2.35}}
  write_sweep(tmp_path / "heads", "lm_heads", curves, seeds=1)
  dirs = [str(tmp_path / "heads")] + three_sizes[1:]
  with pytest.raises(ValueError, match="not a scaling table: its rows have "
                     "4, 8, 16, 32 heads"):
    scaling.analyse(dirs)
  result = scaling.analyse(dirs, heads=8)
  line = result.lines[0]
  assert (line["d_model"], line["seeds"], line["baseline_seeds"]) == (128, 1,
                                                                      1)
  assert line["se"] is None and line["ln_ppl"] == pytest.approx(2.35)


def _refused(argv, capsys):
  status = cli.main(["sweep"] + argv)
  err = capsys.readouterr().err
  assert status == 2, err
  assert err.count("\n") == 1, err
  return err


def test_refusals(three_sizes, tmp_path, capsys):
  out = str(tmp_path / "out")
  d128, d192, _ = three_sizes

  def refused(dirs, *extra):
    return _refused(["--scaling"] + dirs + ["--output_dir", out]
                    + list(extra), capsys)

  assert "no/such is not a directory" in refused([d128, "no/such"])
  assert "at least two model sizes, got 1" in refused([d128])
  assert "has no sweep.json" in refused([d128, str(tmp_path)])
  assert "are the same size (d_model 128, 2 layers)" in refused([d128, d128])
  assert "drop --seeds" in refused([d128, d192], "--seeds", "3")
  assert "--output_dir is required" in _refused(
      ["--scaling", d128, d192], capsys)
  assert "--scaling_heads goes with --scaling" in _refused(
      ["--scaling_heads", "8", "--output_dir", out], capsys)
  # a table whose second row is another variant
  rows = sweep.select_rows(sweep.paper_table_rows("lm_variants"), "1,2")
  curves = {"multi_head": {250: EARLY, 500: EARLY, 750: 2.4},
            "project_logits": {250: EARLY, 500: EARLY, 750: 2.35}}
  write_sweep(tmp_path / "variants", "lm_variants", curves, seeds=1,
              rows=rows)
  assert ("variants differ: %s has multi_head, talking_heads, %s has "
          "multi_head, project_logits" % (d192, tmp_path / "variants")
          in refused([d192, str(tmp_path / "variants")]))
  # a row with no finished run yet
  partial = tmp_path / "partial"
  write_sweep(partial, "scaling_d256", {
      "multi_head": {250: EARLY, 500: EARLY, 750: 2.2},
      "talking_heads": {250: EARLY, 500: EARLY, 750: 2.1}}, seeds=1)
  with open(partial / "results.csv") as f:
    kept = [l for l in f if "talking_heads" not in l]
  with open(partial / "results.csv", "w") as f:
    f.writelines(kept)
  assert ("row 02_talking_heads_8_32 has no finished run in results.csv "
          "yet" in refused([d128, str(partial)]))
  # sweeps at different head counts (each with one)
  rows = sweep.select_rows(sweep.paper_table_rows("lm_heads"), "4,8")
  write_sweep(tmp_path / "h32", "lm_heads", {
      "multi_head": {250: EARLY, 500: EARLY, 750: 2.4},
      "talking_heads": {250: EARLY, 500: EARLY, 750: 2.3}}, seeds=1,
              rows=rows)
  assert "the sweeps' head counts differ" in refused(
      [str(tmp_path / "h32"), d192])
  # a corrupt manifest
  broken = tmp_path / "broken"
  write_sweep(broken, "scaling_d256", {
      "multi_head": {250: EARLY, 500: EARLY, 750: 2.2},
      "talking_heads": {250: EARLY, 500: EARLY, 750: 2.1}}, seeds=1)
  with open(broken / "sweep.json", "w") as f:
    f.write("{not json")
  assert "sweep.json is not JSON" in refused([d128, str(broken)])
  assert not os.path.exists(out)  # nothing written by any refusal


def test_refusal_loads_no_tensorflow(tmp_path):
  result = _cli_util.run(["sweep", "--scaling", str(tmp_path / "a"),
                          str(tmp_path / "b"), "--output_dir",
                          str(tmp_path / "out")])
  assert result.code == 2, result.stderr
  assert result.stderr == ("mtf_th sweep: error: --scaling %s is not a "
                           "directory: give the --output_dir of a recorded "
                           "`mtf_th sweep`\n" % (tmp_path / "a"))
  assert result.tensorflow is False


def test_multipliers_at_the_edges():
  """A fit that does not fall, a loss every curve is already below at its
  first point (an upper bound), one between evaluated points."""
  assert scaling.fit_multiplier((2.0, -0.01), 2.2, 1e12, [1e12, 4e12]) == (
      None, "n/a: multi-head's fit does not fall with compute")
  curves = [("small", comparison.Curve({1e12: 2.5, 2e12: 2.3}, 0.1)),
            ("large", comparison.Curve({3e12: 2.4, 6e12: 2.0}, 0.1))]
  assert scaling.measured_multiplier(curves, 2.6, 1e12) == (
      1.0, "upper bound: small's first point")
  value, status = scaling.measured_multiplier(curves, 2.2, 1e12)
  # large: 2.4 -> 2.0 over 3e12..6e12 reaches 2.2 at 4.5e12
  assert math.isclose(value, 4.5) and status == "large, 4.500e+12 FLOPs"
  assert scaling.measured_multiplier(curves, 1.9, 1e12) == (None,
                                                            "not reached")


def test_doctests():
  failures, tried = doctest.testmod(scaling)
  assert failures == 0 and tried >= 7


def test_plan_from_manifest_is_the_manifests_inverse(tmp_path):
  # lm_variants has dynamic tuples and grouped rows (groups set); lm_heads
  # rows have no groups (dropped from the manifest)
  for table in ("lm_variants", "lm_heads"):
    plan = sweep.Plan(sweep.paper_table_rows(table), str(tmp_path),
                      scale="small", eval_steps=STEPS, table=table,
                      gin_params=("seed = 2",))
    again = sweep.Plan.from_manifest(
        json.loads(json.dumps(plan.manifest())), str(tmp_path))
    assert again.rows == plan.rows
    assert again.manifest() == plan.manifest()
