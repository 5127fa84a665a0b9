"""The fine-tuning stage of `mtf_th sweep --finetune` (sweep/finetune.py),
driven by a stand-in `mtf_th` that records its calls: columns, resumption by
stage, a pre-training checkpoint that is gone, downstream.md; fast.  The
real chain at tiny scale: tests/sweeps/test_finetune_chain.py; the
embedded tasks and metrics: tests/data/test_downstream.py.
"""
import csv
import os
import sys
import textwrap

import pytest

import _cli_util
from mtf_talking_heads import data  # noqa: F401  (registers the tasks)
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.experiments.sweep import finetune as finetune_lib
from mtf_talking_heads.experiments.sweep import run as run_lib


# ---------------------------------------------------------------------------
# The stage in a sweep, with a stand-in `mtf_th`.

FAKE = textwrap.dedent('''
    """Stand-in for mtf_th train|eval|finetune|eval --metrics (same files).

    ln(PPL) 5 - step/1000; fine-tuning writes a checkpoint index at
    --checkpoint_step + --finetune_steps; --metrics writes
    downstream_results.csv with F1 = 40 + seed, EM = 30 + seed, accuracy =
    60 + seed at that step.  One line per call in $FAKE_CALLS.
    """
    import argparse, os, re, sys
    cmd = sys.argv[1]
    p = argparse.ArgumentParser()
    for flag in ("--model_dir", "--train_steps", "--checkpoint_steps",
                 "--checkpoint_step", "--finetune_steps"):
      p.add_argument(flag)
    p.add_argument("--metrics", action="store_true")
    a, _ = p.parse_known_args(sys.argv[2:])
    with open(os.environ["FAKE_CALLS"], "a") as f:
      f.write("%s%s %s\\n" % (cmd, " --metrics" if a.metrics else "", a.model_dir))
    os.makedirs(a.model_dir, exist_ok=True)
    seed = int(re.search(r"seed_(\\d+)", a.model_dir).group(1))
    # multi-head rows score 3 and 2 points lower (the comparison's deltas)
    if "multi_head" in a.model_dir:
      seed -= 2 + seed % 2
    if cmd == "train":
      with open(os.path.join(a.model_dir, "train_log.csv"), "w") as out:
        out.write("step,loss,steps_per_sec,elapsed_sec\\n")
        for s in range(1, int(a.train_steps) + 1):
          out.write("%d,1.0,100,%.2f\\n" % (s, s / 100.0))
      for suffix in ("index", "data-00000-of-00001"):
        open(os.path.join(a.model_dir, "model.ckpt-%s.%s" % (a.train_steps, suffix)), "w")
    elif cmd == "finetune":
      step = int(a.checkpoint_step) + int(a.finetune_steps)
      with open(os.path.join(a.model_dir, "checkpoint"), "w") as out:
        out.write('model_checkpoint_path: "model.ckpt-%d"\\n' % step)
    elif a.metrics:
      with open(os.path.join(a.model_dir, "checkpoint")) as f:
        step = int(f.read().split("-")[-1].strip().strip('"'))
      with open(os.path.join(a.model_dir, "downstream_results.csv"), "w") as out:
        out.write("task,metric,value,step,examples\\n")
        out.write("th_embedded_entailment,accuracy,%d,%d,8\\n" % (60 + seed, step))
        out.write("th_embedded_cloze,em,%d,%d,8\\n" % (30 + seed, step))
        out.write("th_embedded_cloze,f1,%d,%d,8\\n" % (40 + seed, step))
    else:
      with open(os.path.join(a.model_dir, "eval_results.csv"), "w") as out:
        out.write("step,split,ln_ppl,tokens\\n")
        for s in a.checkpoint_steps.split(","):
          out.write("%s,validation,%.6f,1000\\n" % (s, 5 - int(s) / 1000.0))
    ''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
  script = tmp_path / "fake_mtf_th.py"
  script.write_text(FAKE)
  calls = tmp_path / "calls.txt"
  calls.write_text("")
  monkeypatch.setenv("FAKE_CALLS", str(calls))
  return [sys.executable, str(script)], calls


def _sweep(out, launcher, finetune, rows=(6,)):
  table = sweep.paper_table_rows("t5_heads")
  rows = [table[i] for i in rows]
  return sweep.Sweep(rows, str(out), scale="tiny", seeds=2, train_steps=200,
                     eval_steps=(100, 200), table="t5_heads", launcher=launcher,
                     log=open(os.devnull, "w"), finetune=finetune)


def _calls(calls):
  return [l.split()[:-1] + [l.split()[-1].split("/seed_")[-1]]
          for l in calls.read_text().splitlines()]


def test_stage_fills_the_columns_and_resumes_by_stage(tmp_path, fake,
                                                      monkeypatch):
  launcher, calls = fake
  out = tmp_path / "sweep"
  watched = []  # (model_dir's last part, the step progress counts to)
  watch = run_lib.Runner._watch  # pylint: disable=protected-access

  def _watch(self, proc, run, model_dir, log, last_step):
    watched.append((os.path.basename(model_dir), last_step))
    return watch(self, proc, run, model_dir, log, last_step)

  monkeypatch.setattr(run_lib.Runner, "_watch", _watch)
  _sweep(out, launcher, None).run()  # pre-training only, then --finetune
  assert [c[0] for c in _calls(calls)] == ["train", "eval"] * 2
  assert watched == [("seed_1", 200)] * 2 + [("seed_2", 200)] * 2
  watched.clear()
  ft1 = out / "runs" / "07_talking_heads_24_32" / "seed_1" / "finetune"
  ft1.mkdir()
  (ft1 / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-210"\n')
  calls.write_text("")
  job = _sweep(out, launcher, {"steps": 10, "max_eval_examples": 8})
  job.run()
  # seed 1 was fine-tuned already (step 200 + 10): only its metrics.
  assert _calls(calls) == [["eval", "--metrics", "1/finetune"],
                           ["finetune", "2/finetune"],
                           ["eval", "--metrics", "2/finetune"]]
  # Progress of a fine-tuning counts to its last step (200 + 10).
  assert watched == [("finetune", 210)] * 3
  with open(out / "results.csv") as f:
    records = list(csv.DictReader(f))
  assert [(r["span_f1"], r["cls_accuracy"], r["finetune_step"],
           r["downstream_mixture"]) for r in records] == [
               ("41.0", "61.0", "210", "th_finetune_embedded"),
               ("42.0", "62.0", "210", "th_finetune_embedded")]
  md = (out / "results.md").read_text()
  assert ("| embedded cloze F1 (not SQuAD) (std) | embedded entailment "
          "acc. (not MNLI-m) (std) |") in md
  assert "| 41.50 (0.71) | 61.50 (0.71) |" in md
  assert "not those benchmarks" in md
  down = (out / "downstream.md").read_text()
  assert ("| row | variant | th_embedded_cloze em | th_embedded_cloze f1 | "
          "th_embedded_entailment accuracy |") in down
  # Each line is named by its row: variant labels repeat across head counts.
  assert ("| 07_talking_heads_24_32 | talking-heads | 31.50 (0.71) | "
          "41.50 (0.71) | 61.50 (0.71) |") in down, down
  # Rerun: every stage is recorded, nothing runs.
  calls.write_text("")
  _sweep(out, launcher, {"steps": 10, "max_eval_examples": 8}).run()
  assert calls.read_text() == ""
  # Other fine-tuning settings in the same output_dir are refused.
  with pytest.raises(ValueError, match="finetune differ"):
    _sweep(out, launcher, {"steps": 11}).run()


def test_run_whose_pretraining_checkpoint_is_gone_is_trained_again(
    tmp_path, fake):
  """On another machine a recorded, not fine-tuned run has its small files
  but no checkpoints: fine-tuning could not start, so the sweep says so,
  trains that run again (its stale finetune/ gone) and records it once;
  the others only fine-tune, a scored run is left alone, and --report and
  other rows' lines change nothing."""
  launcher, calls = fake
  out = tmp_path / "sweep"
  _sweep(out, launcher, None).run()  # pre-training only
  seed_2 = out / "runs" / "07_talking_heads_24_32" / "seed_2"
  for ckpt in seed_2.glob("model.ckpt-*"):
    ckpt.unlink()  # a commit carried only its small files here
  stale = seed_2 / "finetune"  # a fine-tuning that cannot resume
  stale.mkdir()
  (stale / "train_log.csv").write_text("step,loss\n205,0.5\n")
  (stale / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-205"\n')
  csv_path = out / "results.csv"
  lines = csv_path.read_text().splitlines()
  other = lines[1].replace("07_talking_heads_24_32", "99_other_row")
  csv_path.write_text("\n".join(lines + [other]) + "\n")
  before = csv_path.read_text()
  job = _sweep(out, launcher, {"steps": 10})
  job.run(train=False)  # --report: nothing is dropped
  assert csv_path.read_text() == before
  holder = _cli_util.lock_holder(str(stale))  # a finetune by hand
  try:
    with pytest.raises(ValueError, match="finetune is in use by"):
      job.run()
  finally:
    holder.kill()
    holder.wait()
  assert csv_path.read_text() == before
  calls.write_text("")
  log = tmp_path / "log.txt"
  job.runner.log = open(log, "w")
  job.run()
  assert _calls(calls) == [["train", "2"], ["eval", "2"],
                           ["finetune", "2/finetune"],
                           ["eval", "--metrics", "2/finetune"],
                           ["finetune", "1/finetune"],
                           ["eval", "--metrics", "1/finetune"]]
  said = log.read_text()
  assert ("07_talking_heads_24_32 seed 2: pre-training is recorded but not "
          "its fine-tuning, and the checkpoint fine-tuning starts from "
          "(step 200 in %s) is gone: the run is trained again" % seed_2
          in said), said
  assert "seed 1: pre-training is recorded" not in said
  assert "2 runs, 1 already recorded" in said
  assert not (stale / "train_log.csv").exists()
  with open(csv_path) as f:
    records = list(csv.DictReader(f))
  assert sorted((r["row"], r["seed"], r["finetune_step"])
                for r in records) == [
                    ("07_talking_heads_24_32", "1", "210"),
                    ("07_talking_heads_24_32", "2", "210"),
                    ("99_other_row", "1", "")]
  # Both runs scored, then moved without checkpoints: nothing runs again.
  for ckpt in (out / "runs").glob("*/seed_*/model.ckpt-*"):
    ckpt.unlink()
  calls.write_text("")
  _sweep(out, launcher, {"steps": 10}).run()
  assert calls.read_text() == ""


def test_downstream_md_compares_each_variant_with_multi_head_by_seed(
    tmp_path, fake):
  """downstream.md: variant − multi-head of both columns, mean ± s.e. over
  the seeds, paired by seed (the fake scores multi-head 3 and 2 lower)."""
  launcher, _ = fake
  out = tmp_path / "sweep"
  _sweep(out, launcher, {"steps": 10}, rows=(2, 6)).run()
  down = (out / "downstream.md").read_text()
  assert ("| variant | heads | vs | seeds | Δ embedded cloze F1 (not SQuAD) "
          "| Δ embedded entailment acc. (not MNLI-m) | higher (seeds) |"
          in down)
  assert ("| talking-heads | 24 | 03_multi_head_24_32 | 2 | +2.50 ± 0.50 | "
          "+2.50 ± 0.50 | 2/2, 2/2 |" in down), down
  # one seed scored: no standard error
  ft = out / "runs" / "03_multi_head_24_32" / "seed_2" / "finetune"
  (ft / finetune_lib.DOWNSTREAM_RESULTS).unlink()
  plan = _sweep(out, launcher, {"steps": 10}, rows=(2, 6))
  assert ("| talking-heads | 24 | 03_multi_head_24_32 | 1 | +3.00 | +3.00 | "
          "1/1, 1/1 |" in finetune_lib.downstream_comparison(plan))
  # without a multi-head row: no comparison
  assert finetune_lib.downstream_comparison(
      _sweep(tmp_path / "other", launcher, {"steps": 10})) == ""


def test_downstream_comparison_pairs_each_column_by_seed(tmp_path, fake):
  """Δ = variant − multi-head per column (span, then classification), the
  sign kept; a column scored in fewer seeds is marked (n=k)."""
  launcher, _ = fake
  plan = _sweep(tmp_path / "sweep", launcher, {"steps": 10}, rows=(2, 6))
  stage = plan.finetune
  scores = {  # (row index, seed): (cloze F1, entailment accuracy or None)
      (0, 1): (50.0, 70.0), (0, 2): (52.0, 72.0),
      (1, 1): (51.0, 66.0), (1, 2): (55.0, None)}
  for (i, seed), (f1, acc) in scores.items():
    ft = stage.model_dir(plan.rows[i], seed)
    os.makedirs(ft)
    with open(os.path.join(ft, finetune_lib.DOWNSTREAM_RESULTS), "w") as f:
      f.write("task,metric,value,step,examples\n")
      f.write("th_embedded_cloze,f1,%s,%d,8\n" % (f1, stage.total_steps))
      if acc is not None:
        f.write("th_embedded_entailment,accuracy,%s,%d,8\n"
                % (acc, stage.total_steps))
  assert [r.name for r in plan.rows] == ["03_multi_head_24_32",
                                         "07_talking_heads_24_32"]
  table = finetune_lib.downstream_comparison(plan)
  # F1: +1, +3 -> +2.00 ± 1.00; accuracy: only seed 1 paired, -4
  assert ("| talking-heads | 24 | 03_multi_head_24_32 | 2 | +2.00 ± 1.00 | "
          "-4.00 (n=1) | 2/2, 0/1 |" in table), table
