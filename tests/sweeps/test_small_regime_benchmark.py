"""benchmarks/small_regime.py times encoder-decoder rows too: the
Bitransformer step of models/encdec_small.gin, interleaved with its
multi-head pair (tiny sizes here)."""
import pytest

import _cli_util
from mtf_talking_heads.experiments import sweep


def _benchmark():
  return _cli_util.load_script("benchmarks/small_regime.py", "small_regime")


def test_encoder_decoder_rows_side_by_side(capsys):
  bench = _benchmark()
  assert "encdec_heads" in bench.TABLES
  rows = sweep.select_rows(sweep.paper_table_rows("encdec_heads"), "2,6")
  model = bench.make_model(rows[1], num_layers=1, d_model=32, batch=2,
                           length=8)
  names = sorted(model.variables)
  assert any(n.startswith("encoder/") for n in names)
  assert any("TalkingHeadsEncoderAttention/p_l" in n for n in names), names
  before = model.fetch(["loss"])["loss"]
  for _ in range(3):
    model.step()
  assert model.fetch(["loss"])["loss"] < before  # it is a training step
  model.close()
  times = bench.time_rows(rows, repeats=2, warmup=1, num_layers=1,
                          d_model=32, batch=2, length=8)
  assert sorted(times) == [r.name for r in rows]
  assert all(len(t) == 2 and min(t) > 0 for t in times.values())
  result = bench.table(rows, times)
  text = capsys.readouterr().out
  assert "| talking-heads | 8 | 16 |" in text
  assert result[0][2] == pytest.approx(1.0)  # multi-head vs itself
  # the multiplies ratio printed is costs.py's at d_model 128, n = 128
  assert "| 1.17 |" in text.splitlines()[-1]
