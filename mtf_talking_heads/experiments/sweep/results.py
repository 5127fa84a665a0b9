"""The files a sweep's runs leave behind, read and written.

Owns results.csv (one line per finished run: RESULT_COLUMNS, then, in a
sweep with --finetune, the fine-tuning stage's FINETUNE_COLUMNS, filled in
by update_result when the stage ends) and the sweep's views of the files
that training writes into a run's directory (train_log.csv and
eval_results.csv, read by runtime/run_files.py).  Nothing recorded is
trusted unchecked: a results.csv line that is cut or lacks its row, seed or
model_dir is refused by every reader, and check_records refuses a line
measured at other steps than the sweep's or whose ln_ppl is not its run's
own (a hand edit), each in one line naming the file, the line and the fix.
"""
import csv
import io
import os
import re

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


_READ_BACK = ("delete that line and rerun the sweep (the run is read back "
              "from its folder, not retrained)")


def _damaged(path, line, where, text):
  """ValueError: "<path> line <n> (row R seed S) <text>"."""
  return ValueError("%s line %d %s %s" % (path, line, where, text))


def _read_records(path):
  """[(line number, record)] of results.csv, each line checked: complete
  (as many cells as the header; the last line ends in a newline), a row
  name, an integer seed and a model_dir.

  Raises:
    ValueError: one line naming the file, the line and what to do.
  """
  try:
    with open(path, "rb") as f:
      text = f.read().decode("utf-8")
  except IsADirectoryError:
    raise ValueError("%s is a folder, not the sweep's results.csv: move it "
                     "away and rerun" % path) from None
  except UnicodeDecodeError as e:
    raise ValueError("%s is not UTF-8 text (byte %d): restore it from a copy"
                     % (path, e.start)) from None
  rows = list(csv.reader(io.StringIO(text)))
  if not rows:
    return []
  header = rows[0]
  missing = [c for c in RESULT_COLUMNS if c not in header]
  if missing or "\0" in text:
    raise ValueError("%s line 1 is not results.csv's header (it lacks %s): "
                     "restore the file from a copy" % (
                         path, ", ".join(missing) or "nothing, but has NUL "
                         "bytes"))
  out = []
  for number, cells in enumerate(rows[1:], 2):
    record = dict(zip(header, cells + [None] * (len(header) - len(cells))))
    where = "(row %s seed %s)" % (record.get("row") or "?",
                                  record.get("seed") or "?")
    last = number == len(rows)
    # append_result writes RESULT_COLUMNS' cells under a header that
    # update_result may have widened by FINETUNE_COLUMNS
    whole = len(cells) in (len(header), len(RESULT_COLUMNS))
    if len(cells) > len(header):
      raise _damaged(path, number, where, "has %d cells, its header %d: "
                     "correct it, or %s" % (len(cells), len(header),
                                            _READ_BACK))
    if not whole or (last and not text.endswith("\n")):
      raise _damaged(path, number, where, "is cut short (%d of %d cells%s): "
                     "%s" % (len(cells), len(header), "" if not whole else
                     ", no newline", _READ_BACK))
    try:
      int(record["seed"])
    except ValueError:
      raise _damaged(path, number, where, "has seed %r, not an integer: "
                     "correct it, or delete that line and rerun the sweep"
                     % record["seed"]) from None
    if not record["row"] or not record["model_dir"]:
      raise _damaged(path, number, where, "has no %s: %s" % (
          "row name" if not record["row"] else "model_dir", _READ_BACK))
    out.append((number, record))
  return out


def read_results(output_dir):
  """Recorded runs: {(row name, seed): record} (strings as in the CSV).

  Raises:
    ValueError: a line is cut or lacks its row, seed or model_dir (one
      line naming it: _read_records).
  """
  path = results_path(output_dir)
  if not os.path.exists(path):
    return {}
  return {(r["row"], int(r["seed"])): r for _, r in _read_records(path)}


def _run_steps(model_dir):
  """utils.run.train_steps of the run in model_dir (its
  operative_config.gin), or None."""
  try:
    with open(os.path.join(model_dir, "operative_config.gin")) as f:
      match = re.search(r"^(?:utils\.)?run\.train_steps = (\d+)\s*$",
                        f.read(), re.M)
  except (OSError, UnicodeDecodeError):
    return None
  return int(match.group(1)) if match else None


def check_records(output_dir, runs, eval_steps, train_steps):
  """Refuses what a sweep would otherwise trust without checking.

  Each results.csv line of one of `runs` must carry this sweep's steps
  (early_step, final_step = eval_steps' first and last), name its run
  folder, and hold the ln_ppl values of the run's own eval_results.csv at
  those steps (a hand-edited value is named); a run folder not yet
  recorded must have been trained to `train_steps` (its
  operative_config.gin) if it was trained at all.  Writes nothing.

  Args:
    runs: [(row name, seed, model_dir)] of the plan.
    eval_steps: the plan's eval steps; train_steps: its train_steps.
  Raises:
    ValueError: one line naming the file, the line and what to do.
  """
  path = results_path(output_dir)
  records = {}
  if os.path.exists(path):
    records = {(r["row"], int(r["seed"])): (n, r)
               for n, r in _read_records(path)}
  wanted = "%d,%d" % (eval_steps[0], eval_steps[-1])
  for row, seed, model_dir in runs:
    if (row, seed) not in records:
      steps = _run_steps(model_dir) if run_files.checkpoint_prefixes(
          model_dir) else None
      if steps is not None and steps != train_steps:
        raise ValueError(
            "run folder %s was trained with --train_steps %d (its "
            "operative_config.gin) but this sweep has %d: use a new "
            "--output_dir, or --train_steps %d" % (model_dir, steps,
                                                   train_steps, steps))
      continue
    number, record = records[(row, seed)]
    where = "(row %s seed %d)" % (row, seed)
    recorded = "%s,%s" % (record["early_step"], record["final_step"])
    if recorded != wanted:
      raise _damaged(path, number, where, "was measured at steps %s but "
                     "this sweep measures at %s (--train_steps, "
                     "--eval_steps): use a new --output_dir, or the steps "
                     "it was recorded with" % (recorded, wanted))
    cell = os.path.normpath(record["model_dir"])
    tail = os.path.join("runs", row, "seed_%d" % seed)
    if not (cell == os.path.normpath(model_dir) or cell.endswith(
        os.sep + tail) or cell == tail):
      raise _damaged(path, number, where, "names model_dir %s, not this "
                     "run's folder %s: correct that cell"
                     % (record["model_dir"], model_dir))
    evals = run_files.scan_eval_results(model_dir)
    for key, step in (("early_ln_ppl", eval_steps[0]),
                      ("final_ln_ppl", eval_steps[-1])):
      own = evals.get(step)
      evals_path = os.path.join(model_dir, run_files.EVAL_RESULTS)
      if own is None:
        raise _damaged(path, number, where, "cannot be checked: %s has no "
                       "ln_ppl at step %d; restore the run folder, or delete "
                       "that line and rerun the sweep" % (evals_path, step))
      try:
        value = float(record[key])
      except ValueError:
        value = None
      if value is None or abs(value - own) > 5e-7:
        raise _damaged(path, number, where, "has %s %s but the run's own %s "
                       "says %.6f at step %d: the line was edited; %s" % (
                           key, record[key], evals_path, own, step,
                           _READ_BACK))


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
  records = [r for _, r in _read_records(path)]
  for record in records:
    if record["row"] == row and int(record["seed"]) == seed:
      record.update(values)
  _rewrite(path, records)


def remove_result(output_dir, row, seed):
  """Drops the line of (row, seed) from results.csv (rewritten, renamed)."""
  path = results_path(output_dir)
  records = [r for _, r in _read_records(path)
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
