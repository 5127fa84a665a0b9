"""The span-corruption table of the small regime (gin/experiments/span_heads:
T5's span corruption on bytes, objectives/span_corruption_bytes.gin): the
task's examples, that building them reads nothing from the network, the
table's rows, and (slow) that its multi-head and talking-heads rows train.
"""
import csv
import os
import socket

import numpy as np
import pytest
import seqio

from mtf_talking_heads import cli
from mtf_talking_heads import data  # noqa: F401  (registers the tasks)
from mtf_talking_heads.core import gin_text
from mtf_talking_heads.data import tasks
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.experiments.sweep import finetune as finetune_lib
from mtf_talking_heads.experiments.sweep import plan as plan_lib

TASK = "th_span_corruption_bytes"


def _examples(lengths, count):
  task = seqio.get_mixture_or_task(TASK)
  ds = task.get_dataset(lengths, split="validation", shuffle=False, seed=1)
  return list(ds.take(count).as_numpy_iterator())


def test_bytes_with_sentinels_and_no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("span corruption tried the network: %r" % (args,))
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  assert tasks.span_corruption_targets_length(128) == 29
  examples = _examples({"inputs": 128, "targets": 29}, 30)
  vocabulary = seqio.get_mixture_or_task(TASK).output_features[
      "targets"].vocabulary
  assert isinstance(vocabulary, seqio.ByteVocabulary)
  assert vocabulary.vocab_size == 259
  noise = kept = 0
  for ex in examples:
    inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
    assert len(inputs) == 128 and len(targets) <= 29  # packed exactly
    assert inputs[-1] == 1 and targets[-1] == 1  # EOS
    sentinels = [t for t in targets if t >= 250]
    # one sentinel per span, the same in inputs and targets, counting down
    # from 258 (byte 0xFF): ids no UTF-8 text has
    assert sentinels == [t for t in inputs if t >= 250]
    assert sentinels == list(range(258, 258 - len(sentinels), -1))
    assert targets[0] == 258
    noise += len(targets) - 1 - len(sentinels)
    kept += len(inputs) - 1 - len(sentinels)
  assert 0.12 < noise / (noise + kept) < 0.18  # 15% of the bytes


def test_span_table_rows_and_objective():
  rows = sweep.paper_table_rows("span_heads")
  assert [(r.variant, r.heads, r.d_k) for r in rows] == [
      ("multi_head", 8, 16), ("multi_head", 32, 4),
      ("talking_heads", 8, 16), ("talking_heads", 32, 4)]
  for row in rows:
    assert row.heads * row.d_k == row.heads * row.d_v == 128
    assert sweep.model_and_size(row) == ("encdec", "small")
    config = gin_text.GinConfig(row.gin_files)
    assert config.get("MIXTURE_NAME") == TASK
    assert (config.get("inputs_length"), config.get("targets_length")) == (
        128, tasks.span_corruption_targets_length(128))
    tiny = gin_text.GinConfig(row.gin_files + sweep.scale_files(row, "tiny"))
    assert tiny.get("targets_length") >= (
        tasks.span_corruption_targets_length(tiny.get("inputs_length")))
  assert "span corruption" in sweep.table_caption("span_heads")


def test_absolute_positions_fit_pre_training_and_fine_tuning(tmp_path,
                                                             capsys):
  """models/absolute_positions.gin on a span row: one position table (160)
  for pre-training (128 inputs) and fine-tuning (160); the pre-flight of
  both stages passes.  Without its fixed max_length the table would follow
  inputs_length and the fine-tuning is refused before anything runs."""
  argv = ["sweep", "--paper_table", "span_heads", "--rows", "1",
          "--output_dir", str(tmp_path / "out"), "--finetune",
          "--finetune_mixture", "th_finetune_lm_bytes", "--dry_run"]
  config = gin_text.GinConfig(sweep.paper_table_rows("span_heads")[0].gin_files
                              + ("models/absolute_positions.gin",))
  assert config.binding("transformer.Unitransformer.positional_embedding")
  assert config.binding("transformer.Unitransformer.max_length") == 160
  assert cli.main(argv + ["--gin_file", "models/absolute_positions.gin"]) == 0
  out, err = capsys.readouterr()
  finetune, = [l for l in out.splitlines() if l.startswith("mtf_th finetune")]
  assert "models/absolute_positions.gin" in finetune
  assert "pre-flight of `mtf_th train` passed for all 1 rows" in err
  assert "pre-flight of `mtf_th finetune` passed for all 1 rows" in err
  assert cli.main(argv + ["--gin_param", "transformer.Unitransformer."
                          "positional_embedding = True"]) == 2
  err = capsys.readouterr().err
  assert ("row 01_multi_head_8_16's encoder position embedding table has "
          "128 positions in pre-training and 160 in fine-tuning" in err), err
  assert "--gin_file models/absolute_positions.gin (160)" in err
  assert not (tmp_path / "out").exists()


def _finetune_stage(table, params, files=(), scale="small"):
  rows = sweep.paper_table_rows(table)[:1]
  plan = plan_lib.Plan(rows, "/nonexistent", scale, gin_files=files,
                       gin_params=params, table=table)
  return finetune_lib.Finetune(plan, steps=4)


@pytest.mark.parametrize("params, stack, sizes", [
    # scoped to one stack: the encoder's table follows inputs_length
    (["encoder/transformer.Unitransformer.positional_embedding = True"],
     "encoder", (128, 160)),
    (["decoder/transformer.Unitransformer.positional_embedding = True"],
     "decoder", (128, 160)),
    # one stack fixed, the other following inputs_length
    (["transformer.Unitransformer.positional_embedding = True",
      "encoder/transformer.Unitransformer.max_length = 160"],
     "decoder", (128, 160)),
])
def test_position_table_check_reads_scoped_bindings(params, stack, sizes):
  """The fine-tuning's pre-flight compares each stack's table as gin binds
  it (scope first), before anything runs (no graph, no pre-flight)."""
  with pytest.raises(ValueError, match=(
      "row 01_multi_head_8_16's %s position embedding table has %d "
      "positions in pre-training and %d in fine-tuning" % ((stack,) + sizes))):
    _finetune_stage("span_heads", params)


@pytest.mark.parametrize("table, params, files, scale", [
    # both stacks fixed at 160 by scoped bindings: one size in both stages
    ("span_heads", ["transformer.Unitransformer.positional_embedding = True",
                    "encoder/transformer.Unitransformer.max_length = 160",
                    "decoder/transformer.Unitransformer.max_length = 160"],
     (), "small"),
    # no absolute positions at all (T5's relative bias): nothing to restore
    ("span_heads", [], (), "small"),
    ("span_heads", [], ("models/absolute_positions.gin",), "tiny"),
    # decoder-only rows keep their pre-training's table, whatever its size
    ("lm_heads", [], (), "small"),
    ("lm_heads", [], (), "tiny"),
    ("lm_heads", [], ("models/absolute_positions.gin",), "small"),
    ("lm_heads", ["transformer.Unitransformer.max_length = 256"], (),
     "small"),
])
def test_position_table_check_accepts_one_size(table, params, files, scale):
  stage = _finetune_stage(table, params, files, scale)
  row = stage.plan.rows[0]
  config = gin_text.GinConfig(*stage.gin(row, 1))
  scopes = ("",) if table == "lm_heads" else ("encoder", "decoder")
  for scope in scopes:
    assert (finetune_lib.position_table(config, scope)
            == finetune_lib.position_table(stage.plan.config(row), scope))
  if table == "lm_heads":  # inputs + targets = the pre-training's length
    length = {"small": 128, "tiny": 32}[scale]
    assert stage.length_params(row)[:2] == ["inputs_length = %d"
                                            % (length - 16),
                                            "targets_length = 16"]


@pytest.mark.slow
def test_span_rows_train_and_evaluate(tmp_path):
  """Talking heads at 8 heads trains 4 steps at tiny scale on span
  corruption and held-out ln(PPL) of the targets falls (multi-head rows
  share every other code path: test_small_regime.py trains them)."""
  from mtf_talking_heads.commands import evaluate  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.commands import train  # pylint: disable=g-import-not-at-top
  for row in sweep.select_rows(sweep.paper_table_rows("span_heads"), "3"):
    model_dir = str(tmp_path / row.name)
    flags = ["--model_dir", model_dir]
    for f in list(row.gin_files) + list(sweep.scale_files(row, "tiny")):
      flags += ["--gin_file", f]
    assert train.main(flags) == 0
    assert evaluate.main(flags + ["--checkpoint_steps", "0,4"]) == 0
    with open(os.path.join(model_dir, "eval_results.csv")) as f:
      curve = {int(r["step"]): float(r["ln_ppl"]) for r in csv.DictReader(f)}
    assert sorted(curve) == [0, 4]
    assert curve[0] > curve[4] > 0, (row.name, curve)
    assert np.isfinite(list(curve.values())).all()
