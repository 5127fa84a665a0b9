"""Every paper-table gin file can be trained at tiny scale.

Every file under gin/experiments/<table>/ goes through the pre-flight checks
(training.parse_gin + training.preflight, no graph) with its tiny scale file
(sweep.scale_files: models/t5_tiny.gin for T5 rows, bert_tiny.gin for BERT,
...).  Training one step is the expensive part, so it runs once per distinct
code path: the first file (in table order) that brings an attention class
not yet trained for its model kind.  Code paths that another test of the
suite already trains at tiny scale, with assertions on its losses
(TRAINED_ELSEWHERE), are not trained again here.  All in one subprocess
with 8 logical CPU devices, like the test session.
"""
import glob
import json
import os
import subprocess
import sys

import pytest

from _cli_util import REPO


# gin file -> the test that trains it at tiny scale (several steps, its
# held-out ln(PPL) falls); the (model kind, attention class) pairs of these
# files are not trained here.
TRAINED_ELSEWHERE = {
    "experiments/lm_heads/01_multi_head_4_32.gin":
        "training/test_small_regime.py::test_demo_end_to_end_at_tiny_scale",
    "experiments/lm_heads/05_talking_heads_4_32.gin":
        "training/test_small_regime.py::test_demo_end_to_end_at_tiny_scale",
    "experiments/encdec_heads/01_multi_head_4_32.gin":
        "sweeps/test_finetune_chain.py::test_pretrain_finetune_metrics_then_rerun_skips",
    "experiments/span_heads/03_talking_heads_8_16.gin":
        "sweeps/test_span_heads.py::test_span_rows_train_and_evaluate",
    "experiments/t5_heads/07_talking_heads_24_32.gin":
        "commands/test_docs_commands.py::test_quick_start_trains_evaluates_and_decodes",
}

_SCRIPT = r"""
import json, os, sys, time
from mtf_talking_heads.core import compat
compat.split_cpu(8)
from mtf_talking_heads import training
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.nn import models
elsewhere = json.loads(sys.argv[2])
out = {"preflight": {}, "trained": {}, "elsewhere": {}}
checked = []
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
    checked.append((name, files, list(row.gin_params), classes))
covered = set()
for name, _, _, classes in checked:
  if name in elsewhere:
    covered |= classes
    out["elsewhere"][name] = sorted(classes)
to_train = []
for name, files, params, classes in checked:
  if classes - covered:
    covered |= classes
    to_train.append((name, files, params))
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
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path),
                         json.dumps(sorted(TRAINED_ELSEWHERE))],
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
  # every file trained elsewhere passed the pre-flight and has attention
  assert sorted(out["elsewhere"]) == sorted(TRAINED_ELSEWHERE)
  assert all(out["elsewhere"].values()), out["elsewhere"]
  for test in set(TRAINED_ELSEWHERE.values()):
    path, name = test.split("::")
    with open(os.path.join(REPO, "tests", path)) as f:
      assert "def %s(" % name in f.read(), test
  assert "experiments/t5_heads/10_general_bilinear_12.gin" in out["trained"]
  bad = {k: v for k, v in out["trained"].items()
         if not isinstance(v, float) or not v > 0}
  if bad:
    pytest.fail("one training step failed:\n" + "\n".join(
        "%s: %s" % kv for kv in sorted(bad.items())))
  # each (model kind, attention class) trained once, here or elsewhere
  assert len(out["trained"]) + len(out["elsewhere"]) <= len(out["covered"])
