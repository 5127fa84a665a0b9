"""Every paper-table gin file can be trained at tiny scale.

Every file under gin/experiments/<table>/ goes through the pre-flight checks
(training.parse_gin + training.preflight, no graph) with its tiny scale file
(sweep.scale_files: models/t5_tiny.gin for T5 rows, bert_tiny.gin for BERT,
...).  Training one step is the expensive part, so it runs once per distinct
code path: the first file (in table order) that brings an attention class
not yet trained for its model kind.  All in one subprocess with 8 logical CPU
devices, like the test session.
"""
import glob
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r"""
import json, os, sys, time
from mtf_talking_heads import compat
compat.split_cpu(8)
from mtf_talking_heads import models, sweep, training
out = {"preflight": {}, "trained": {}}
to_train, covered = [], set()
for table in models.experiment_tables():
  for row in sweep.paper_table_rows(table):
    files = list(row.gin_files) + list(sweep.scale_files(row, "tiny"))
    name = row.gin_files[0]
    try:
      training.parse_gin(files, row.gin_params)
      _, description = training.preflight()
    except Exception as e:  # pylint: disable=broad-except
      out["preflight"][name] = "%s: %s" % (type(e).__name__, e)
      continue
    out["preflight"][name] = None
    kind = files[-1]
    classes = set((kind, type(layer).__name__)
                  for _, layer in models.attention_layers(description))
    if classes - covered:
      covered |= classes
      to_train.append((name, files, list(row.gin_params)))
for name, files, params in to_train:
  model_dir = os.path.join(sys.argv[1], name.replace("/", "_"))
  start = time.time()
  try:
    # one layer (block) per stack: every attention class of the file is in it
    rows = training.train(model_dir, files, params + ["num_layers = 1"],
                          train_steps=1)
    out["trained"][name] = rows[-1]["loss"]
  except Exception as e:  # pylint: disable=broad-except
    out["trained"][name] = "%s: %s" % (type(e).__name__, e)
  print("%s %.1f s" % (name, time.time() - start), file=sys.stderr)
out["covered"] = sorted(covered)
print("JSON" + json.dumps(out))
"""


@pytest.mark.slow
def test_every_experiment_passes_preflight_and_each_code_path_trains(
    tmp_path):
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads([l for l in proc.stdout.splitlines()
                    if l.startswith("JSON")][-1][4:])
  on_disk = sorted(os.path.relpath(p, os.path.join(REPO, "gin")) for p in
                   glob.glob(os.path.join(REPO, "gin", "experiments", "*",
                                          "*.gin")))
  assert sorted(out["preflight"]) == on_disk  # every file was checked
  failed = {k: v for k, v in out["preflight"].items() if v is not None}
  if failed:
    pytest.fail("pre-flight failed:\n" + "\n".join(
        "%s: %s" % kv for kv in sorted(failed.items())))
  assert "experiments/t5_heads/10_general_bilinear_12.gin" in out["trained"]
  bad = {k: v for k, v in out["trained"].items()
         if not isinstance(v, float) or not v > 0}
  if bad:
    pytest.fail("one training step failed:\n" + "\n".join(
        "%s: %s" % kv for kv in sorted(bad.items())))
  # each (model kind, attention class) trained once
  assert len(out["trained"]) <= len(out["covered"])
