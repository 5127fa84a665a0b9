"""The files a sweep's runs leave behind, read and written.

Owns results.csv (one line per finished run: RESULT_COLUMNS, then, in a
sweep with --finetune, the fine-tuning stage's FINETUNE_COLUMNS, filled in
by update_result when the stage ends) and the sweep's views of the files
that training writes into a run's directory (train_log.csv and
eval_results.csv, read by runtime/run_files.py).
"""
import csv
import os

from mtf_talking_heads.runtime import run_files

RESULTS_CSV = "results.csv"
RESULT_COLUMNS = (
    "table", "row", "row_label", "variant", "heads_k", "heads", "heads_v",
    "d_k", "d_v", "dynamic", "placement", "scale", "seed", "early_step",
    "early_ln_ppl", "final_step", "final_ln_ppl", "step_time_sec", "params",
    "multiplies", "multiplies_executed", "d_model", "cost_length",
    "wall_sec", "cpu_sec", "model_dir")
# The fine-tuning stage's columns (sweep/finetune.py).
FINETUNE_COLUMNS = ("downstream_mixture", "finetune_step", "span_f1",
                    "cls_accuracy")


def results_path(output_dir):
  return os.path.join(output_dir, RESULTS_CSV)


def read_results(output_dir):
  """Recorded runs: {(row name, seed): record} (strings as in the CSV)."""
  path = results_path(output_dir)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {(r["row"], int(r["seed"])): r for r in csv.DictReader(f)}


def append_result(output_dir, record):
  """Appends one run's line (None -> empty cell), synced to disk."""
  path = results_path(output_dir)
  new = not os.path.exists(path)
  with open(path, "a", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    if new:
      writer.writerow(RESULT_COLUMNS)
    writer.writerow(["" if record[c] is None else record[c]
                     for c in RESULT_COLUMNS])
    f.flush()
    os.fsync(f.fileno())


def update_result(output_dir, row, seed, values):
  """Sets `values` (FINETUNE_COLUMNS cells) on the line of (row, seed).

  Rewrites results.csv (temporary file, then rename) with the header
  RESULT_COLUMNS + FINETUNE_COLUMNS; other lines keep their cells.
  """
  path = results_path(output_dir)
  with open(path) as f:
    records = list(csv.DictReader(f))
  for record in records:
    if record["row"] == row and int(record["seed"]) == seed:
      record.update(values)
  _rewrite(path, records)


def remove_result(output_dir, row, seed):
  """Drops the line of (row, seed) from results.csv (rewritten, renamed)."""
  path = results_path(output_dir)
  with open(path) as f:
    records = [r for r in csv.DictReader(f)
               if not (r["row"] == row and int(r["seed"]) == seed)]
  _rewrite(path, records)


def _rewrite(path, records):
  """Writes records under RESULT_COLUMNS + FINETUNE_COLUMNS: a temporary
  file, synced, then renamed over `path` (never half-written)."""
  columns = RESULT_COLUMNS + FINETUNE_COLUMNS
  with open(path + ".tmp", "w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
      writer.writerow(["" if record.get(c) is None else record[c]
                       for c in columns])
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + ".tmp", path)


def read_train_log(model_dir):
  """[(step, loss, steps_per_sec)] from <model_dir>/train_log.csv."""
  return [(r["step"], r["loss"], r["steps_per_sec"])
          for r in run_files.read_train_log(model_dir)]


def read_eval_results(model_dir, split="validation"):
  """{step: ln_ppl} of `split` from <model_dir>/eval_results.csv."""
  return {r["step"]: r["ln_ppl"]
          for r in run_files.read_eval_results(model_dir)
          if r["split"] == split}
