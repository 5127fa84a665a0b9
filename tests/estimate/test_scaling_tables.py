"""The scaling curve's sweep definitions (gin/experiments/scaling_d128,
scaling_d192, scaling_d256): multi-head vs talking heads at 8 heads with
h * d_k = d_model at three widths, each trained to about 4 bytes per
parameter outside the embedding, none reading the train split more than
twice; fast (no model is built)."""
import pytest

from mtf_talking_heads.core import gin_text
from mtf_talking_heads.data import corpus
from mtf_talking_heads.experiments import sweep

SIZES = {"scaling_d128": (128, 750), "scaling_d192": (192, 1750),
         "scaling_d256": (256, 3000)}


@pytest.mark.parametrize("table", sorted(SIZES))
def test_sizes_tokens_per_parameter_and_repeats(table, tmp_path):
  d_model, steps = SIZES[table]
  rows = sweep.paper_table_rows(table)
  assert [(r.variant, r.heads) for r in rows] == [("multi_head", 8),
                                                   ("talking_heads", 8)]
  train_bytes = corpus.stats()["bytes"]["train"]
  for row in rows:
    assert row.heads * row.d_k == row.heads * row.d_v == d_model
    assert sweep.model_and_size(row) == ("lm", "small")
    config = gin_text.GinConfig(row.gin_files)
    layers, d_ff = config.get("num_layers"), config.get("d_ff")
    assert (config.get("d_model"), d_ff, config.get("train_steps")) == (
        d_model, 4 * d_model, steps)
    params = layers * (4 * d_model * row.heads * row.d_k + 2 * d_model * d_ff)
    tokens = steps * config.get("batch_size") * config.get("targets_length")
    assert 3.5 < tokens / params < 4.5, (table, tokens / params)
    assert tokens <= 2 * train_bytes, (table, tokens / train_bytes)
  # the sweep runs them at small scale, one train call per run, and a
  # rerun resumes (the eval steps are checkpoint steps)
  job = sweep.Sweep(rows, str(tmp_path), scale="small", seeds=3,
                    train_steps=steps,
                    eval_steps=list(range(250, steps + 1, 250)), table=table)
  run = job.runs()[0]
  assert [c[1] for c in run.commands] == ["train", "eval"]
  assert run.commands[0][-2:] == ["--train_steps", str(steps)]
