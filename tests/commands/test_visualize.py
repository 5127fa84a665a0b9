"""Tests for mtf_talking_heads/experiments/visualize.py and `mtf_th visualize`.

Checkpoints are written directly with tf variables named like the ones
layers.py creates (no training): P_l = identity in layer 0 gives |det| = 1 and
smallest singular value 1; P_w is a known matrix whose determinant is
computed independently here.
"""
import csv
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads import cli
from mtf_talking_heads.experiments import visualize

ENC0 = "encoder/block_000/layer_000/TalkingHeadsAttention"
ENC1 = "encoder/block_001/layer_000/TalkingHeadsAttention"
DEC_LOGITS_ONLY = "decoder/block_000/layer_000/ProjectLogitsAttention"

# P_w of layer 0: upper triangular, so det = product of the diagonal = 2*3*0.5*-1.
P_W0 = np.array([[2.0, 1.0, 0.0, 4.0],
                 [0.0, 3.0, -1.0, 0.0],
                 [0.0, 0.0, 0.5, 0.0],
                 [0.0, 0.0, 0.0, -1.0]])
P_W0_ABS_DET = 3.0


def _write_checkpoint(model_dir, variables, step=100):
  """Saves {name: array} as model.ckpt-<step> in model_dir (float32)."""
  graph = tf.Graph()
  with graph.as_default():
    tf_vars = [tf.get_variable(name, initializer=np.asarray(value, np.float32))
               for name, value in variables.items()]
    saver = tf.train.Saver(tf_vars)
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=step)


def _attention_vars(scope, rng, d_model=8, heads=4, d=2):
  return {scope + "/p_q": rng.normal(size=(d_model, heads, d)),
          scope + "/p_k": rng.normal(size=(d_model, heads, d)),
          scope + "/p_v": rng.normal(size=(d_model, heads, d)),
          scope + "/p_o": rng.normal(size=(heads, d, d_model))}


@pytest.fixture(scope="module")
def th_checkpoint(tmp_path_factory):
  """Two talking-heads layers and one logits-only layer; Adafactor slots too."""
  model_dir = str(tmp_path_factory.mktemp("th_model"))
  rng = np.random.RandomState(0)
  variables = {}
  for scope in (ENC0, ENC1, DEC_LOGITS_ONLY):
    variables.update(_attention_vars(scope, rng))
  variables[ENC0 + "/p_l"] = np.eye(4)
  variables[ENC0 + "/p_w"] = P_W0
  variables[ENC0 + "/p_l_slot_vr"] = np.ones(4)   # not a projection
  variables[ENC1 + "/p_l"] = rng.normal(size=(4, 6))   # heads_k=4, heads=6
  variables[ENC1 + "/p_w"] = rng.normal(size=(6, 4))
  variables[DEC_LOGITS_ONLY + "/p_l"] = rng.normal(size=(4, 4))
  variables["global_step"] = np.array(100)
  _write_checkpoint(model_dir, {k: v for k, v in variables.items()
                                if k != "global_step"})
  return model_dir, variables


def _stats_by_key(rows):
  return {(r["layer"], r["matrix"]): r for r in rows}


def test_reads_every_layer_and_ignores_optimizer_slots(th_checkpoint):
  model_dir, variables = th_checkpoint
  path, layers = visualize.read_projections(model_dir)
  assert path.endswith("model.ckpt-100")
  assert [l.layer for l in layers] == [ENC0, ENC1, DEC_LOGITS_ONLY]
  by_scope = {l.layer: l for l in layers}
  np.testing.assert_array_equal(by_scope[ENC0].p_l, np.eye(4))
  np.testing.assert_allclose(by_scope[ENC0].p_w, P_W0)
  assert by_scope[DEC_LOGITS_ONLY].p_w is None
  assert by_scope[ENC1].p_l.shape == (4, 6)


def test_identity_p_l_has_det_1_and_product_det_is_product_of_dets(
    th_checkpoint):
  model_dir, variables = th_checkpoint
  _, layers = visualize.read_projections(model_dir)
  stats = _stats_by_key(visualize.projection_stats(layers))
  assert stats[(ENC0, "P_l")]["abs_det"] == pytest.approx(1.0, abs=1e-12)
  assert stats[(ENC0, "P_l")]["diag_to_offdiag"] == float("inf")
  # P_W0: mean |diag| = 6.5/4, mean |off-diag| = 6/12.
  assert stats[(ENC0, "P_w")]["diag_to_offdiag"] == pytest.approx(3.25)
  assert stats[(ENC0, "P_l")]["min_singular"] == pytest.approx(1.0, abs=1e-6)
  assert stats[(ENC0, "P_w")]["abs_det"] == pytest.approx(P_W0_ABS_DET, rel=1e-6)
  # P_l = I, so P_l x P_w = P_w.
  assert stats[(ENC0, "P_l x P_w")]["abs_det"] == pytest.approx(
      P_W0_ABS_DET, rel=1e-6)
  assert stats[(ENC0, "P_w")]["min_singular"] == pytest.approx(
      np.linalg.svd(P_W0.astype(np.float32), compute_uv=False).min(), rel=1e-5)
  # Non-square P_l (heads_k=4, heads=6) has no determinant, but a smallest
  # singular value; P_l x P_w is 4x4 (heads_k x heads_v).
  p_l1 = variables[ENC1 + "/p_l"].astype(np.float32)
  p_w1 = variables[ENC1 + "/p_w"].astype(np.float32)
  assert stats[(ENC1, "P_l")]["abs_det"] is None
  assert stats[(ENC1, "P_l")]["diag_to_offdiag"] is None
  assert stats[(ENC1, "P_l")]["min_singular"] == pytest.approx(
      np.linalg.svd(p_l1, compute_uv=False).min(), rel=1e-5)
  prod = stats[(ENC1, "P_l x P_w")]
  assert (prod["rows"], prod["cols"]) == (4, 4)
  assert prod["abs_det"] == pytest.approx(
      abs(np.linalg.det(p_l1.astype(np.float64) @ p_w1)), rel=1e-5)
  # Logits-only layer: P_l only.
  assert (DEC_LOGITS_ONLY, "P_w") not in stats
  assert (DEC_LOGITS_ONLY, "P_l x P_w") not in stats
  assert len(stats) == 3 + 3 + 1


def test_normalized_lies_in_minus_one_one_with_max_one():
  m = np.array([[0.5, -4.0], [2.0, 1.0]])
  n = visualize.normalized(m)
  np.testing.assert_allclose(n, m / 4.0)
  assert np.max(np.abs(n)) == 1.0


def test_cli_writes_png_and_csv_and_prints_table(th_checkpoint, tmp_path,
                                                 capsys):
  model_dir, _ = th_checkpoint
  out = tmp_path / "pictures"
  assert cli.main(["visualize", "--model_dir", model_dir,
                   "--output_dir", str(out)]) == 0
  printed = capsys.readouterr().out
  png = out / "projections.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  height, width = image.imread(str(png)).shape[:2]
  assert (height, width) == (860, 900)   # 3 layer rows x 3 columns, dpi 100
  with open(out / "projections.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 7
  enc0_l, = [r for r in rows if r["layer"] == ENC0 and r["matrix"] == "P_l"]
  assert float(enc0_l["abs_det"]) == pytest.approx(1.0)
  assert float(enc0_l["min_singular"]) == pytest.approx(1.0)
  enc1_l, = [r for r in rows if r["layer"] == ENC1 and r["matrix"] == "P_l"]
  assert enc1_l["abs_det"] == "" and enc1_l["rows"] == "4"
  assert ENC0 in printed and "1.000e+00" in printed and "n/a" in printed


def test_checkpoint_prefix_is_accepted(th_checkpoint, tmp_path):
  model_dir, _ = th_checkpoint
  result = visualize.visualize(os.path.join(model_dir, "model.ckpt-100"),
                               str(tmp_path))
  assert os.path.exists(result["png"]) and len(result["stats"]) == 7


def test_multi_head_checkpoint_is_a_clear_error(tmp_path, capsys):
  model_dir = str(tmp_path / "mh")
  _write_checkpoint(model_dir, _attention_vars(
      "encoder/block_000/layer_000/MultiHeadAttention",
      np.random.RandomState(1)))
  with pytest.raises(ValueError, match=r"no talking-heads projections .*"
                     r"multi-head"):
    visualize.read_projections(model_dir)
  assert cli.main(["visualize", "--model_dir", model_dir]) == 2
  err = capsys.readouterr().err
  assert err.startswith("mtf_th visualize: error: checkpoint ")
  assert not os.path.exists(os.path.join(model_dir, "projections.png"))


def test_missing_checkpoint_names_model_dir(tmp_path):
  with pytest.raises(ValueError, match=r"^--model_dir .* has no checkpoint"):
    visualize.read_projections(str(tmp_path))
  with pytest.raises(ValueError, match=r"^--model_dir .* neither a directory"):
    visualize.read_projections(str(tmp_path / "nope" / "model.ckpt-5"))
  with pytest.raises(ValueError, match=r"^--baseline .* has no checkpoint"):
    visualize.read_projections(str(tmp_path), "--baseline")



def test_baseline_change_is_relative_frobenius_distance(th_checkpoint,
                                                         tmp_path, capsys):
  model_dir, variables = th_checkpoint
  # The baseline: every projection halved, so P - P_0 = P_0 and change = 1
  # (P_l x P_w, a product of two halved matrices, is a quarter: change 3).
  baseline_dir = str(tmp_path / "init")
  _write_checkpoint(baseline_dir, {
      k: v / 2 if k.endswith(("/p_l", "/p_w")) else v
      for k, v in variables.items() if k != "global_step"}, step=0)
  out = tmp_path / "pictures"
  assert cli.main(["visualize", "--model_dir", model_dir, "--output_dir",
                   str(out), "--baseline",
                   os.path.join(baseline_dir, "model.ckpt-0")]) == 0
  assert "change" in capsys.readouterr().out
  with open(out / "projections.csv") as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    expected = 3.0 if r["matrix"] == "P_l x P_w" else 1.0
    assert float(r["change"]) == pytest.approx(expected, rel=1e-6), r
  # Without a baseline the column is empty; against itself it is 0.
  same = visualize.visualize(model_dir, str(tmp_path / "same"), model_dir)
  assert all(r["change"] == 0.0 for r in same["stats"])
  plain = visualize.visualize(model_dir, str(tmp_path / "plain"))
  assert all(r["change"] is None for r in plain["stats"])


def test_baseline_of_another_model_is_a_clear_error(th_checkpoint, tmp_path):
  model_dir, _ = th_checkpoint
  other = str(tmp_path / "other")
  _write_checkpoint(other, {ENC0 + "/p_l": np.eye(3)})
  with pytest.raises(ValueError, match=(
      r"--baseline .*other/model.ckpt-100 holds another model than "
      r".*: 2 layers in encoder/ in model.ckpt-100, 1 in the baseline; .*; "
      r"pass a checkpoint of the same model \(e.g. .*model.ckpt-0\)$")):
    visualize.visualize(model_dir, str(tmp_path / "o"), other)
  assert not os.path.exists(str(tmp_path / "o"))  # refused before writing
