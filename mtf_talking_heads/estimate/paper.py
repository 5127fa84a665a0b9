"""The paper's step times, and the step-time model's against them.

Pure Python (no TensorFlow).  PAPER_STEP_TIMES is the "step time (s)"
column of the paper's T5 tables (section 7.1 Tables 1-4, Appendix A.1), by
experiment file of gin/experiments/<table>/; compare_paper puts
step_time.predict's figures for the same rows next to them, both as ratios
to one reference row (`mtf_th perf --compare_paper`; docs/costs.md).

Example:
  PAPER_STEP_TIMES["t5_heads"][1]["02_multi_head_12_64"] == 0.15
"""
import collections

from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import step_time

# The "step time (s)" column of each table, by experiment file of
# gin/experiments/<table>/.  None: the paper prints no time (Raffel et al.).
PAPER_STEP_TIMES = collections.OrderedDict([
    ("t5_heads", ("Table 1 (tab:t5)", collections.OrderedDict([
        ("01_multi_head_6_128", 0.14), ("02_multi_head_12_64", 0.15),
        ("03_multi_head_24_32", 0.17), ("04_multi_head_48_16", 0.21),
        ("05_talking_heads_6_128", 0.16), ("06_talking_heads_12_64", 0.18),
        ("07_talking_heads_24_32", 0.22), ("08_talking_heads_48_16", 0.32),
        ("09_multi_head_24_64", 0.22), ("10_general_bilinear_12", 0.47),
        ("11_raffel2019", None)]))),
    ("t5_heads_dims", ("Table 2 (tab:t5_2)", collections.OrderedDict([
        ("01_talking_heads_6_128", 0.16),
        ("02_talking_heads_6_24_6_128_128", 0.18),
        ("03_talking_heads_24_6_24_32_32", 0.20),
        ("04_talking_heads_6_24_24_128_32", 0.20),
        ("05_talking_heads_24_24_6_32_128", 0.21),
        ("06_talking_heads_24_32", 0.22)]))),
    ("t5_logits_weights", ("Table 3 (tab:t5_3)", collections.OrderedDict([
        ("01_multi_head_24_32", 0.17), ("02_project_logits_24", 0.23),
        ("03_project_weights_24", 0.23), ("04_talking_heads_24_32", 0.22)]))),
    ("t5_enc_dec", ("Table 4 (tab:t5_4)", collections.OrderedDict([
        ("01_multi_head_24_32", 0.17), ("02_th_enc_self", 0.21),
        ("03_th_dec_self", 0.17), ("04_th_encdec", 0.18),
        ("05_talking_heads_24_32", 0.22)]))),
    ("dp", ("Appendix A.1 (tab:dp)", collections.OrderedDict([
        ("01_multi_head_12_64", 0.15), ("02_talking_heads_12_64", 0.18),
        ("03_dp_all_12", 0.36), ("04_multi_head_24_32", 0.17),
        ("05_talking_heads_24_32", 0.22), ("06_dp_all_24", 0.53)]))),
    ("dp_individual", ("Appendix A.1 (tab:dp_individual)",
                       collections.OrderedDict([
                           ("01_talking_heads_12_64", 0.18),
                           ("02_dp_x2l_12", 0.19), ("03_dp_x2w_12", 0.19),
                           ("04_dp_m2l_12", 0.24), ("05_dp_m2w_12", 0.25),
                           ("06_dp_all_12", 0.36)]))),
    ("dp_enc_only", ("Appendix A.1 (tab:dp_enc_only)",
                     collections.OrderedDict([
                         ("01_multi_head_24_32", 0.17),
                         ("02_th_enc_self", 0.21),
                         ("03_dp_enc_self", 0.42)]))),
])
# The reference row of every comparison: Table 1's 12-head multi-head row.
PAPER_REFERENCE = ("t5_heads", "02_multi_head_12_64")

# What the comparison assumes of the paper's runs (docs/costs.md): a TPU v3
# slice of 32 TensorCores (v3-32), data parallel as mtf's defaults.gin
# (model_parallelism = 1): 4 of the 128 sequences per core; mtf 0.1.x layers.
PAPER_HARDWARE = "tpu_v3"
PAPER_MESH = "batch:32"
PAPER_IMPLEMENTATION = "mtf"


def compare_paper(table, hardware=PAPER_HARDWARE, mesh_shape=PAPER_MESH,
                  impl=PAPER_IMPLEMENTATION, efficiency=None):
  """Predicted vs printed step times of one paper table.

  Both as ratios to the reference row (PAPER_REFERENCE: Table 1's 12-head
  multi-head row, 0.15 s), since the paper does not name its slice.

  Returns:
    [dict(row, label, paper_s, paper_ratio, predicted_s, predicted_ratio,
    error)], error = predicted_ratio / paper_ratio - 1 (None where the paper
    prints no time).
  Raises:
    ValueError: a table without printed step times, naming the valid ones.
  """
  if table not in PAPER_STEP_TIMES:
    raise ValueError("--paper_table %r has no step times in the paper; "
                     "--compare_paper works with: %s"
                     % (table, ", ".join(PAPER_STEP_TIMES)))
  ref_table, ref_row = PAPER_REFERENCE
  ref_model = dict((name, model) for name, _, model in
                   model_lib.experiment_rows(ref_table))[ref_row]
  ref_s = step_time.predict(ref_model, hardware, mesh_shape, impl,
                            efficiency)["step_s"]
  ref_paper = PAPER_STEP_TIMES[ref_table][1][ref_row]
  out = []
  for name, label, model in model_lib.experiment_rows(table):
    result = step_time.predict(model, hardware, mesh_shape, impl, efficiency)
    paper_s = PAPER_STEP_TIMES[table][1].get(name)
    row = dict(row=name, label=label, paper_s=paper_s,
               paper_ratio=None if paper_s is None else paper_s / ref_paper,
               predicted_s=result["step_s"],
               predicted_ratio=result["step_s"] / ref_s, error=None,
               result=result)
    if paper_s is not None:
      row["error"] = row["predicted_ratio"] / row["paper_ratio"] - 1
    out.append(row)
  return out
