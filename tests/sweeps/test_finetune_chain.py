"""`mtf_th sweep --finetune` for real at tiny scale: pre-train -> fine-tune ->
metrics on the embedded benchmark (the small byte-level encoder-decoder,
models/encdec_tiny.gin, a few steps each), then a rerun that skips every
finished stage.  About 3-4 minutes on 2 busy cores (five TensorFlow child
processes), hence slow.  The pre-training is the encoder-decoder's
multi-head row trained for real at tiny scale: its held-out ln(PPL) falls
and the sweep records its measurements (the talking-heads encoder-decoder
trains in tests/sweeps/test_span_heads.py).
"""
import csv
import math
import os

import pytest

import _cli_util
from mtf_talking_heads import cli
from mtf_talking_heads.data import downstream

ROW = "01_multi_head_4_32"


@pytest.mark.slow
def test_pretrain_finetune_metrics_then_rerun_skips(tmp_path, capsys):
  out = tmp_path / "sweep"
  argv = ["sweep", "--paper_table", "encdec_heads", "--rows", "1",
          "--scale", "tiny", "--train_steps", "4", "--eval_steps", "2,4",
          "--output_dir", str(out), "--finetune", "--finetune_steps", "4",
          "--finetune_eval_examples", "8"]
  assert cli.main(argv) == 0
  first = capsys.readouterr().out
  assert "fine-tuned to step 8 on th_finetune_embedded_bytes" in first
  run = out / "runs" / ROW / "seed_1"
  with open(run / "finetune" / "downstream_results.csv") as f:
    scores = list(csv.DictReader(f))
  assert sorted((r["task"], r["metric"], r["step"], r["examples"])
                for r in scores) == [
                    ("th_embedded_cloze_bytes", "em", "8", "8"),
                    ("th_embedded_cloze_bytes", "f1", "8", "8"),
                    ("th_embedded_entailment_bytes", "accuracy", "8", "8")]
  for r in scores:
    assert 0.0 <= float(r["value"]) <= 100.0
  values = {(r["task"], r["metric"]): float(r["value"]) for r in scores}
  with open(out / "results.csv") as f:
    record, = list(csv.DictReader(f))
  assert record["downstream_mixture"] == "th_finetune_embedded_bytes"
  assert record["finetune_step"] == "8"
  assert float(record["span_f1"]) == pytest.approx(
      values[("th_embedded_cloze_bytes", "f1")])
  assert float(record["cls_accuracy"]) == pytest.approx(
      values[("th_embedded_entailment_bytes", "accuracy")])
  assert float(record["final_ln_ppl"]) > 0
  for key in ("early_ln_ppl", "final_ln_ppl", "step_time_sec", "wall_sec",
              "cpu_sec"):
    assert math.isfinite(float(record[key])) and float(record[key]) > 0, key
  # encdec_tiny: d_model 128, inputs_length 32
  assert int(record["cost_length"]) == 32 and int(record["d_model"]) == 128
  assert "[1/1]" in first and "ETA" in first
  # The pre-training: 4 finite losses, held-out ln(PPL) falls from step 2 to 4.
  with open(run / "eval_results.csv") as f:
    curve = {int(r["step"]): float(r["ln_ppl"]) for r in csv.DictReader(f)}
  assert sorted(curve) == [2, 4] and curve[2] > curve[4] > 0, curve
  assert float(record["early_ln_ppl"]) == pytest.approx(curve[2])
  with open(run / "train_log.csv") as f:
    losses = [float(r["loss"]) for r in csv.DictReader(f)]
  assert len(losses) == 4 and all(math.isfinite(v) for v in losses), losses
  table = [l for l in (out / "results.md").read_text().splitlines()
           if l.startswith("| multi-head")][0]
  cells = [c.strip() for c in table.strip("|").split("|")]
  assert cells[8] == "%.2f" % float(record["span_f1"])
  assert cells[9] == "%.2f" % float(record["cls_accuracy"])
  down = (out / "downstream.md").read_text()
  assert "th_embedded_cloze_bytes f1" in down
  # The fine-tuning started from the pre-training's last checkpoint.
  log = (run / "finetune" / "sweep.log").read_text()
  assert "--checkpoint_step 4" in log and "[finetune] from " in log
  # Rerun: every stage is finished; no command runs.
  logs = [(run / "sweep.log").read_text(), log]
  assert cli.main(argv) == 0
  assert "1 runs, 1 already recorded" in capsys.readouterr().out
  assert [(run / "sweep.log").read_text(),
          (run / "finetune" / "sweep.log").read_text()] == logs
  assert os.path.exists(run / "finetune" / "checkpoint")


@pytest.mark.slow
def test_decoder_only_row_fine_tunes_as_delimited_lm_and_decodes(tmp_path,
                                                                  capsys):
  """lm_heads' talking-heads row at tiny scale: pre-trained as an LM, fine-
  tuned on th_finetune_lm_bytes in one 32-position sequence (16 + 16),
  scored on its two tasks, and `mtf_th decode` continues "<input> EOS"."""
  out = tmp_path / "sweep"
  argv = ["sweep", "--paper_table", "lm_heads", "--rows", "6",
          "--scale", "tiny", "--train_steps", "4", "--eval_steps", "2,4",
          "--output_dir", str(out), "--finetune", "--finetune_steps", "4",
          "--finetune_eval_examples", "8"]
  assert cli.main(argv) == 0
  assert "fine-tuned to step 8 on th_finetune_lm_bytes" in (
      capsys.readouterr().out)
  ft = out / "runs" / "06_talking_heads_8_16" / "seed_1" / "finetune"
  with open(ft / "downstream_results.csv") as f:
    scores = list(csv.DictReader(f))
  assert sorted((r["task"], r["metric"], r["step"], r["examples"])
                for r in scores) == [
                    ("th_embedded_acceptability_lm_bytes", "accuracy", "8",
                     "8"),
                    ("th_embedded_misspelling_lm_bytes", "em", "8", "8"),
                    ("th_embedded_misspelling_lm_bytes", "f1", "8", "8")]
  values = {(r["task"], r["metric"]): float(r["value"]) for r in scores}
  with open(out / "results.csv") as f:
    record, = list(csv.DictReader(f))
  assert record["downstream_mixture"] == "th_finetune_lm_bytes"
  assert float(record["span_f1"]) == pytest.approx(
      values[("th_embedded_misspelling_lm_bytes", "f1")])
  assert float(record["cls_accuracy"]) == pytest.approx(
      values[("th_embedded_acceptability_lm_bytes", "accuracy")])
  with open(ft / "operative_config.gin") as f:
    operative = f.read()
  assert "run.model_type = 'delimited_lm'" in operative
  assert "loss_on_targets_only = True" in operative
  # inputs_length 16 at tiny scale: the input fits with its EOS
  # decode and eval in child processes, as a user runs them: in-process
  # their commands switch TensorFlow to graph mode for the rest of the
  # worker (tf.disable_v2_behavior), which tests of eager code then meet.
  done = _cli_util.run(["decode", "--model_dir", str(ft), "--input",
                        "cola sentence"])
  assert done.code == 0, done.stderr
  line, = done.stdout.rstrip("\n").split("\n")
  text, answer = line.split("\t")
  assert text == "cola sentence"
  # the continuation fills at most the sequence's 32 positions after
  # "cola sentence" and its EOS (mtf's sample_autoregressive stops at the
  # next EOS or the end, not after targets_length); one byte at most per id
  assert len(answer.encode()) <= 32 - len("cola sentence") - 1
  # ln(PPL) of the fine-tuned model counts the targets only (each with one
  # EOS), not the inputs: loss_on_targets_only.  One task, so that every
  # held-out example is read once (a mixture's held-out set is sampled).
  task = downstream.ACCEPTABILITY + downstream.LM_SUFFIX
  done = _cli_util.run(["eval", "--model_dir", str(ft), "--checkpoint_steps",
                        "8", "--gin_param", "MIXTURE_NAME = '%s_bytes'" % task])
  assert done.code == 0, done.stderr
  with open(ft / "eval_results.csv") as f:
    row, = list(csv.DictReader(f))
  targets = [e["targets"] for e in downstream.examples(task, "validation")]
  assert int(row["tokens"]) == sum(len(t) + 1 for t in targets)
  assert 0 < float(row["ln_ppl"]) < 10
