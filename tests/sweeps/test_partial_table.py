"""A sweep's paper-layout table while some seeds are missing: each partial
row says over how many seeds its mean and std are (sweep/report.py)."""
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.experiments.sweep import report


def _summary(rows, seeds_per_row):
  out = []
  for row, n in zip(rows, seeds_per_row):
    values = [1.80 + 0.01 * i for i in range(n)]
    mean = sum(values) / n if n else float("nan")
    std = 0.01 if n > 1 else None
    out.append(dict(row=row, seeds=n, early=(mean + 0.8, std),
                    final=(mean, std), step_time=0.1, params=65536,
                    multiplies=1.258e7, multiplies_executed=1.258e7))
  return out


def test_rows_with_fewer_seeds_say_how_many():
  rows = sweep.select_rows(sweep.paper_table_rows("encdec_heads"), "2,6,4")
  text = report.markdown_table(_summary(rows, [3, 2, 0]), (250, 1000),
                               [128], [128], "small", 3)
  full, partial, empty = [text.splitlines()[i] for i in (2, 3, 4)]
  assert "(n=" not in full and "1.810 (0.010) |" in full
  assert "2.605** (0.010) (n=2) | **1.805** (0.010) (n=2) |" in partial
  assert "| 32 |  | 4 | 4 |  |  |" in empty  # not run: empty, no n
  assert "(n=k): the row's mean and std are over the k of 3 seeds" in text
  complete = report.markdown_table(_summary(rows, [3, 3, 3]), (250, 1000),
                                   [128], [128], "small", 3)
  assert "(n=k)" not in complete and "(n=3)" not in complete
