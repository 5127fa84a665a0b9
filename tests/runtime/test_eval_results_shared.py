"""Evals sharing a model_dir (the lock lets them) write eval_results.csv at once.

Each eval writes its row as soon as a checkpoint is scored
(run_files.write_eval_results: read, add, rewrite through a temporary file).
Two processes doing that at once used to replace each other's temporary file
(FileNotFoundError: a traceback) and drop each other's rows; now each
read-and-rewrite holds an flock on the model_dir (run_files._exclusive).
Three small Python processes (no TensorFlow), 80 rows each.
"""
import csv
import os
import subprocess
import sys

import _cli_util
from mtf_talking_heads.runtime import run_files

_WRITER = r"""
import sys
from mtf_talking_heads.runtime import run_files
model_dir, first = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()  # all start together
for step in range(first, first + 240, 3):
  run_files.write_eval_results(model_dir, [
      {"step": step, "split": "validation", "ln_ppl": 1.5, "tokens": 10}])
"""


def test_concurrent_writers_keep_every_row(tmp_path):
  model_dir = str(tmp_path / "run")
  writers = [subprocess.Popen([sys.executable, "-c", _WRITER, model_dir,
                               str(first)], env=_cli_util.env(),
                              stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for first in range(3)]
  for writer in writers:
    writer.stdin.write("go\n")
    writer.stdin.flush()
  errors = [writer.communicate(timeout=120)[1] for writer in writers]
  assert [w.returncode for w in writers] == [0, 0, 0], errors
  with open(os.path.join(model_dir, run_files.EVAL_RESULTS)) as f:
    steps = [int(row["step"]) for row in csv.DictReader(f)]
  assert steps == list(range(240))
  assert os.listdir(model_dir) == [run_files.EVAL_RESULTS]


def test_the_lock_is_reentrant_in_a_thread(tmp_path):
  """write_eval_results holds it while _repair takes it again."""
  with run_files._exclusive(str(tmp_path)):  # pylint: disable=protected-access
    run_files.write_eval_results(str(tmp_path), [
        {"step": 2, "split": "validation", "ln_ppl": 1.25, "tokens": 7}])
  assert run_files.read_eval_results(str(tmp_path)) == [
      {"step": 2, "split": "validation", "ln_ppl": 1.25, "tokens": 7}]
