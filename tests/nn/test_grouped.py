"""Grouped talking heads: P_l, P_w mix heads only within g groups.

1. NumPy: the grouped pseudocode (every einsum carries the groups index g,
   only Y sums over it) equals the paper's talking heads with block-diagonal
   P_l / P_w and the Q, K, V, O weights' [g, h] flattened to g*h heads.
2. mtf, one causal Unitransformer (d_model 8, length 6, batch 2) holding:
   a grouped layer (with per-(group, head) relative position bias) against
   that NumPy transcription on the X it saw; and three pairs of layers run
   on the same X with weights mapped from one to the other (`Twins`):
   grouped == TalkingHeadsAttention with block-diagonal projections,
   groups=1 == talking heads, one head per group with P_l = P_w = 1 ==
   multi-head attention.
3. Sharding, layout groups:model under HeadsParallel: sharded == unsharded
   on model:2 and model:4 (loss, logits, every gradient, one SGD step); in
   `mtf_th comm`'s unit mtf's counters show the ring bytes of multi-head
   at the same dims (no all-reduce of an n x m x heads tensor), and
   prices.ring_elements equals the counters; the split strategies
   refuse grouped layers (Auto then runs heads-parallel).
4. Incremental decoding == teacher forcing (tests/_decode_util.py).
5. Costs (parameters, multiplies), the commands, the sweep rows and bad
   input (ValueError naming `groups`, before any graph).
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
import numpy as np
import pytest

import _decode_util
import _equiv_util as eu
import _strategy_util as su
import _reference as ref
from mtf_talking_heads.commands import comm as comm_command
from mtf_talking_heads.commands import costs as costs_command
from mtf_talking_heads.estimate import costs
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.experiments import sweep
from mtf_talking_heads.experiments.sweep import plan as plan_lib
from mtf_talking_heads.experiments.sweep import rows as rows_lib
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies

TOL = 1e-5  # float32 graph vs float64 reference, relative to max |Y|
D_MODEL, LENGTH, BATCH, VOCAB = 8, 6, 2, 32
# totals: h_k = 4, h = 6, h_v = 4 in 2 groups (2, 3, 2 per group)
GROUPED = dict(heads_k=4, heads=6, heads_v=4, d_k=3, d_v=5)


# ------------------------------------------------------------ 1. NumPy
def grouped_talking_heads(X, M, P_q, P_k, P_v, P_o, P_l, P_w, bias=None):
  """Grouped talking heads, the paper's section 4 with a groups index g.

  Args:
    X: X[..., n, d_X]; M: M[..., m, d_M]
    P_q: P_q[d_X, d_k, g, h_k]; P_k: P_k[d_M, d_k, g, h_k]
    P_v: P_v[d_M, d_v, g, h_v]; P_o: P_o[d_Y, d_v, g, h_v]
    P_l: P_l[g, h_k, h]; P_w: P_w[g, h, h_v]
    bias: optional, broadcastable to L[..., n, m, g, h].
  Returns:
    Y[..., n, d_Y]
  """
  X, M = np.float64(X), np.float64(M)
  Q = np.einsum("...nx,xkgi->...nkgi", X, P_q)          # queries
  K = np.einsum("...my,ykgi->...mkgi", M, P_k)          # keys
  V = np.einsum("...my,yvgj->...mvgj", M, P_v)          # values
  J = np.einsum("...nkgi,...mkgi->...nmgi", Q, K)       # dot prod.
  L = np.einsum("...nmgi,gih->...nmgh", J, P_l)         # within-group proj.
  L = L if bias is None else L + bias
  W = ref.softmax(L, axis=-3)                           # over m
  U = np.einsum("...nmgh,ghj->...nmgj", W, P_w)         # within-group proj.
  O = np.einsum("...nmgj,...mvgj->...nvgj", U, V)
  Y = np.einsum("...nvgj,zvgj->...nz", O, P_o)          # sums over g too
  return Y


def block_diagonal(blocks):
  """[g, a, b] -> the [g a, g b] matrix with blocks[i] as its i-th block."""
  g, a, b = blocks.shape
  out = np.zeros((g * a, g * b), blocks.dtype)
  for i in range(g):
    out[i * a:(i + 1) * a, i * b:(i + 1) * b] = blocks[i]
  return out


def flat_heads(p, axis):
  """Merges dims axis, axis + 1 ([g, h], group-major) into one of g*h."""
  shape = p.shape[:axis] + (-1,) + p.shape[axis + 2:]
  return p.reshape(shape)


def test_numpy_grouped_equals_talking_heads_with_block_diagonal_projections():
  rng = np.random.RandomState(0)
  b, n, m, d_x, d_m, d_y, g, h_k, h, h_v, d_k, d_v = (
      2, 5, 6, 7, 6, 5, 3, 2, 3, 2, 4, 3)
  X, M = rng.randn(b, n, d_x), rng.randn(b, m, d_m)
  P_q, P_k = rng.randn(d_x, d_k, g, h_k), rng.randn(d_m, d_k, g, h_k)
  P_v, P_o = rng.randn(d_m, d_v, g, h_v), rng.randn(d_y, d_v, g, h_v)
  P_l, P_w = rng.randn(g, h_k, h), rng.randn(g, h, h_v)
  bias = rng.randn(b, n, m, g, h)
  got = grouped_talking_heads(X, M, P_q, P_k, P_v, P_o, P_l, P_w, bias)
  want = ref.talking_heads_attention(
      X, M, flat_heads(P_q, 2), flat_heads(P_k, 2), flat_heads(P_v, 2),
      flat_heads(P_o, 2), block_diagonal(P_l), block_diagonal(P_w),
      bias=flat_heads(bias, 3))
  assert eu.max_rel_err(got, want) < 1e-12
  # and it is not talking heads with full projections
  full = ref.talking_heads_attention(
      X, M, flat_heads(P_q, 2), flat_heads(P_k, 2), flat_heads(P_v, 2),
      flat_heads(P_o, 2), rng.randn(g * h_k, g * h), rng.randn(g * h, g * h_v),
      bias=flat_heads(bias, 3))
  assert eu.max_rel_err(got, full) > 1e-2


# ------------------------------------------------------------ 2. mtf
def _ungroup(va):
  """Grouped variables -> TalkingHeadsAttention's (block-diagonal P_l, P_w)."""
  out = {name: flat_heads(va[name], 1) for name in ("p_q", "p_k", "p_v")}
  out["p_o"] = flat_heads(va["p_o"], 0)
  out["p_l"] = block_diagonal(va["p_l"])
  out["p_w"] = block_diagonal(va["p_w"])
  if "relative_attention_bias" in va:
    out["relative_attention_bias"] = flat_heads(va["relative_attention_bias"],
                                                0)
  return out


def _to_multi_head(va):
  """One head per group, P_l = P_w = 1 -> MultiHeadAttention's variables."""
  return {"p_q": va["p_q"][:, :, 0], "p_k": va["p_k"][:, :, 0],
          "p_v": va["p_v"][:, :, 0], "p_o": va["p_o"][:, 0]}


def _twins():
  """[(id, grouped layer a, layer b, a's variables -> b's, a's overrides)]."""
  rel = dict(relative_attention_type="bias")
  ones = {"p_l": np.ones((4, 1, 1)), "p_w": np.ones((4, 1, 1))}
  return [
      ("grouped_equals_block_diagonal_talking_heads",
       layers.GroupedTalkingHeadsAttention(groups=2, **GROUPED, **rel),
       layers.TalkingHeadsAttention(**GROUPED, **rel), _ungroup, {}),
      ("one_group_equals_talking_heads",
       layers.GroupedTalkingHeadsAttention(groups=1, **GROUPED),
       layers.TalkingHeadsAttention(**GROUPED), _ungroup, {}),
      ("one_head_per_group_with_unit_projections_equals_multi_head",
       layers.GroupedTalkingHeadsAttention(heads_k=4, heads=4, heads_v=4,
                                           groups=4, d_k=3, d_v=5),
       layers.MultiHeadAttention(heads=4, d_k=3, d_v=5), _to_multi_head, ones),
  ]


TWINS = [t[0] for t in _twins()]


@pytest.fixture(scope="module")
def causal_run():
  """One decoder: a probed grouped layer, then the twins."""
  probe = eu.Probe(layers.GroupedTalkingHeadsAttention(
      groups=2, relative_attention_type="bias", **GROUPED), "probe")
  spec = _twins()
  twins = [eu.Twins(a, b, "t%d" % i) for i, (_, a, b, _, _) in enumerate(spec)]
  h = harness.Harness([probe] + twins, d_model=D_MODEL, vocab=VOCAB,
                      batch=BATCH, length=LENGTH, autoregressive=True, seed=5,
                      config=su.session_config())
  values = h.variable_values()
  assign = {}
  for t, (_, _, _, mapping, overrides) in zip(twins, spec):
    names_a = eu.full_names(values, t.scope("a"))
    va = eu.layer_values(values, t.scope("a"))
    for short, value in overrides.items():
      assign[names_a[short]] = value
      va[short] = value
    names_b = eu.full_names(values, t.scope("b"))
    for short, value in mapping(va).items():
      assign[names_b[short]] = value
    assert sorted(mapping(va)) == sorted(names_b)  # every b variable mapped
  h.assign(assign)
  tensors = {"x": probe.x, "y": probe.y}
  for i, t in enumerate(twins):
    tensors["a%d" % i], tensors["b%d" % i] = t.y_a, t.y_b
  out = eu.run(h, eu.export(h, tensors))
  yield dict(out=out, values=h.variable_values(), probe=probe)
  h.close()


def test_grouped_layer_equals_numpy_pseudocode(causal_run):
  """Y of the grouped layer (causal mask, relative bias per (group, head))."""
  v = eu.layer_values(causal_run["values"], causal_run["probe"].scope)
  assert v["relative_attention_bias"].shape == (2, 3, 32)
  g, h = 2, 3
  relative = ref.relative_position_bias(
      flat_heads(v["relative_attention_bias"], 0), LENGTH, LENGTH,
      bidirectional=False).reshape(LENGTH, LENGTH, g, h)
  bias = ref.causal_bias(LENGTH, LENGTH)[..., None, None] + relative
  x = causal_run["out"]["x"]
  want = grouped_talking_heads(
      x, x, v["p_q"].transpose(0, 3, 1, 2), v["p_k"].transpose(0, 3, 1, 2),
      v["p_v"].transpose(0, 3, 1, 2), v["p_o"].transpose(3, 2, 0, 1),
      v["p_l"], v["p_w"], bias)
  assert eu.max_rel_err(causal_run["out"]["y"], want) < TOL


@pytest.mark.parametrize("i", range(len(TWINS)), ids=TWINS)
def test_grouped_identities_in_mtf(causal_run, i):
  out = causal_run["out"]
  assert eu.max_rel_err(out["a%d" % i], out["b%d" % i]) < TOL


def test_weights_and_relative_bias_carry_groups():
  layer = layers.GroupedTalkingHeadsAttention(heads_k=24, heads=24, heads_v=24,
                                              groups=8, d_k=32, d_v=32)
  shapes = {k: [(d.name, d.size) for d in v] for k, v in
            layer.weight_shapes(mtf.Dimension("d_model", 768)).items()}
  assert shapes == {
      "p_q": [("d_model", 768), ("groups", 8), ("heads_k", 3), ("d_k", 32)],
      "p_k": [("d_model", 768), ("groups", 8), ("heads_k", 3), ("d_k", 32)],
      "p_v": [("d_model", 768), ("groups", 8), ("heads_v", 3), ("d_v", 32)],
      "p_o": [("groups", 8), ("heads_v", 3), ("d_v", 32), ("d_model", 768)],
      "p_l": [("groups", 8), ("heads_k", 3), ("heads", 3)],
      "p_w": [("groups", 8), ("heads", 3), ("heads_v", 3)]}
  assert [(d.name, d.size) for d in layer.bias_heads()] == [("groups", 8),
                                                            ("heads", 3)]
  # the variables are the costs' parameters (P_l: h_k h / g = 72)
  params = sum(mtf.Shape(s).size for s in layer.weight_shapes(
      mtf.Dimension("d_model", 768)).values())
  assert params == costs.attention_costs(
      "grouped_talking_heads", 24, 24, 24, 32, 32, 768, 512,
      groups=8)["params"] == 2359440
  assert isinstance(layers.make_attention(
      "grouped_talking_heads", enc_dec=True, groups=2),
                    layers.GroupedTalkingHeadsEncoderAttention)


# ------------------------------------------------------------ 3. sharding
SHARD = dict(heads_k=8, heads=8, heads_v=8, groups=4, d_k=4, d_v=4)
SHARD_D_MODEL, SHARD_BATCH, SHARD_LENGTH = 16, 4, 8


def _sharded_harness(mesh_shape, layout, strategy):
  layer = layers.GroupedTalkingHeadsAttention(strategy=strategy, **SHARD)
  layer.set_name("attention")
  run = harness.Harness([layer], d_model=SHARD_D_MODEL, vocab=VOCAB,
                        batch=SHARD_BATCH, length=SHARD_LENGTH,
                        mesh_shape=mesh_shape, layout=layout,
                        optimizer_step=True, config=su.session_config())
  return run, layer


def _forward_backward_step(run):
  names = ["loss", "logits"] + ["grad:" + n for n in sorted(run.grads)]
  out = run.fetch(names)
  run.step()
  out.update({"after:" + k: v for k, v in run.variable_values().items()})
  out.update({"after:" + k: v for k, v in run.fetch(["loss"]).items()})
  return out


@pytest.fixture(scope="module")
def unsharded():
  run, _ = _sharded_harness("", "", strategies.HeadsParallel())
  initial = run.variable_values()
  out = _forward_backward_step(run)
  run.close()
  return initial, out


@pytest.mark.parametrize("mesh_shape, strategy", [
    ("model:2", "heads_parallel"), ("model:4", "auto")])
def test_sharded_equals_unsharded_with_groups_on_the_model_axis(
    unsharded, mesh_shape, strategy):
  initial, want = unsharded
  run, layer = _sharded_harness(mesh_shape, "groups:model",
                                strategies.make_strategy(strategy))
  run.assign(initial)
  got = _forward_backward_step(run)
  run.close()
  if strategy == "auto":  # the split strategies refuse grouped layers
    assert layer.strategy.picked == "heads_parallel"
  assert sorted(got) == sorted(want)
  assert any(k.startswith("grad:") and k.endswith("/p_l") for k in got)
  for key, value in want.items():
    err = eu.max_rel_err(got[key], value)
    assert err < TOL, (key, err)


def _measure(variant, mesh_shape, layout=None, **kwargs):
  config = comm.make_config(variant, heads=8, d_k=4, d_v=4,
                            d_model=SHARD_D_MODEL, length=SHARD_LENGTH,
                            batch=SHARD_BATCH, **kwargs)
  result = comm.measure(config, "heads_parallel", mesh_shape, layout)
  predicted = comm.predict(config, "heads_parallel", mesh_shape, layout)
  return result, predicted


@pytest.mark.parametrize("mesh_shape, p", [("model:2", 2), ("model:4", 4)])
def test_groups_on_the_model_axis_communicate_what_multi_head_does(
    mesh_shape, p):
  grouped, predicted = _measure("grouped_talking_heads", mesh_shape,
                                groups=4)
  assert grouped["layout"] == "groups:model"  # comm's default for grouped
  multi_head, _ = _measure("multi_head", mesh_shape)
  talking_heads, _ = _measure("talking_heads", mesh_shape)
  # two all-reduces of an X-sized tensor (Y and dX), nothing n x m x heads:
  # mtf counts N x the per-device slice, N = p devices
  x = SHARD_BATCH * SHARD_LENGTH * SHARD_D_MODEL
  assert grouped["allreduce"] == 2 * p * x
  assert grouped["alltoall"] == grouped["allconcat"] == 0
  ring = int(4 * 2 * 2 * (p - 1) / p * x)  # float32 bytes per device
  assert grouped["ring_bytes_per_device"] == ring == multi_head[
      "ring_bytes_per_device"]
  assert predicted == ring
  # full talking heads (heads_k, heads_v on the axis) all-reduces L and dW
  assert talking_heads["ring_bytes_per_device"] == 5 * ring
  # the n x m x heads slices are split p ways, as multi-head's
  assert grouped["max_slice_elements"] == multi_head["max_slice_elements"] \
      == SHARD_BATCH * SHARD_LENGTH ** 2 * 8 // p


def test_per_group_heads_on_the_axis_priced_as_measured():
  """Per-group heads_k, heads_v split (groups whole): P_l, P_w collectives
  as talking heads has them, predicted exactly."""
  result, predicted = _measure("grouped_talking_heads", "model:2",
                               "heads_k:model;heads_v:model", groups=2)
  x = SHARD_BATCH * SHARD_LENGTH * SHARD_D_MODEL
  a = SHARD_BATCH * SHARD_LENGTH ** 2 * 8
  # Y, dX (2 x X) and L = J P_l, dW = dU P_w^T (2 x b n m h): each 2 (P-1)/P
  assert predicted == 4 * (2 * x + 2 * a)
  assert result["ring_bytes_per_device"] == predicted


@pytest.mark.parametrize("name", [n for n in strategies.STRATEGIES
                                  if n != "heads_parallel"])
def test_split_strategies_refuse_grouped_layers(name):
  dims = attention.make_dims(8, 8, 8, 4, 4, groups=4)
  layout = "groups:model;core_shard:model"
  with pytest.raises(ValueError, match="runs heads-parallel: lay out "
                     "groups:model"):
    strategies.make_strategy(name).check(dims, "model:2", layout, 4, 8)
  with pytest.raises(ValueError, match="groups:model"):
    prices.ring_elements(name, dims, "model:2", layout, 4, 8, 16)
  auto, _, table = strategies.Auto().choose(
      dims, strategies.MeshLayout("model:2", "groups:model"), 4, 8, 16)
  assert auto.name == "heads_parallel"
  assert "heads-parallel" in table[name]


# ------------------------------------------------------------ 4. decoding
def test_incremental_decoding_equals_teacher_forcing():
  run = _decode_util.DecodeRun([layers.GroupedTalkingHeadsAttention(
      heads_k=4, heads=6, heads_v=4, groups=2, d_k=4, d_v=4,
      relative_attention_type="bias")])
  r = run.results
  np.testing.assert_array_equal(r["decoded"],
                                r["forced_on_decoded"].argmax(-1))
  forced, p = r["forced"], run.prefix
  assert eu.max_rel_err(r["stepped"], forced) <= TOL
  assert eu.max_rel_err(r["first_part"][:, :p], forced[:, :p]) <= TOL
  assert len(np.unique(r["decoded"])) > 1


def test_encoder_attention_decodes_in_a_bitransformer():
  dims = dict(heads_k=4, heads=6, heads_v=4, groups=2, d_k=4, d_v=4)
  run = _decode_util.DecodeRun(
      [layers.GroupedTalkingHeadsAttention(**dims),
       layers.GroupedTalkingHeadsEncoderAttention(**dims)],
      encoder_layers=[layers.GroupedTalkingHeadsAttention(**dims)])
  r = run.results
  np.testing.assert_array_equal(r["decoded"],
                                r["forced_on_decoded"].argmax(-1))
  assert eu.max_rel_err(r["stepped"], r["forced"]) <= TOL
  # the encoder output matters (different encoder inputs per row)
  assert eu.max_rel_err(r["forced"][0, 0], r["forced"][1, 0]) > 1e-3


# ------------------------------------------------------------ 5. costs etc.
@pytest.mark.parametrize("groups, p_l, l_mults", [
    (1, 576, 512 * 512 * 24 * 24), (2, 288, 512 * 512 * 24 * 12),
    (8, 72, 512 * 512 * 24 * 3), (24, 24, 512 * 512 * 24)])
def test_costs_divide_the_projections_by_groups(groups, p_l, l_mults):
  n, d, h, d_k = 512, 768, 24, 32
  terms = costs.attention_terms("grouped_talking_heads", h, h, h, d_k, d_k,
                                d, n, groups=groups)
  size = lambda shape: int(np.prod(shape))  # pylint: disable=unnecessary-lambda-assignment
  assert size(terms["params"]["P_l"]) == size(terms["params"]["P_w"]) == p_l
  assert size(terms["multiplies"]["L"]) == size(
      terms["multiplies"]["U"]) == l_mults
  got = costs.total_costs(terms)
  mh = costs.attention_costs("multi_head", h, h, h, d_k, d_k, d, n)
  assert got["params"] == mh["params"] + 2 * p_l
  assert got["multiplies"] == mh["multiplies"] + 2 * l_mults
  if groups == 1:
    th = costs.attention_costs("talking_heads", h, h, h, d_k, d_k, d, n)
    assert (got["params"], got["multiplies"]) == (th["params"],
                                                  th["multiplies"])


def test_costs_command(capsys):
  assert costs_command.main([
      "--variant", "grouped_talking_heads", "--groups", "8", "--heads", "24",
      "--d_k", "32", "--d_v", "32", "--d_model", "768", "--length",
      "512"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      "variant,heads_k,heads,heads_v,d_k,d_v,params,multiplies",
      "grouped_talking_heads(groups=8),24,24,24,32,32,2359440,1648361472"]
  assert costs_command.main([
      "--variant", "talking_heads", "--groups", "8", "--heads", "24",
      "--d_k", "32", "--d_v", "32", "--d_model", "768", "--length",
      "512"]) == 2
  assert "groups=8 is only for variant 'grouped_talking_heads'" in \
      capsys.readouterr().err


def test_comm_command_reports_split_strategies_as_not_applying(capsys):
  assert comm_command.main([
      "--variant", "grouped_talking_heads", "--groups", "4", "--heads", "8",
      "--d_k", "4", "--d_v", "4", "--d_model", "16", "--length", "8",
      "--batch", "4", "--mesh_shape", "model:2"]) == 0
  out = capsys.readouterr()
  assert out.out.splitlines() == [
      ",".join(comm.COLUMNS),
      "grouped_talking_heads(groups=4),heads_parallel,model:2,groups:model,"
      "2048,0,0,1.607,1024,4096"]
  assert out.err.count("does not apply") == len(strategies.STRATEGIES) - 1


def test_lm_variants_rows_and_their_costs():
  rows = sweep.paper_table_rows("lm_variants")
  grouped = [r for r in rows if r.variant == "grouped_talking_heads"]
  assert [(r.name, r.groups) for r in grouped] == [
      ("10_grouped_talking_heads_8_g2", 2),
      ("11_grouped_talking_heads_8_g4", 4)]
  assert all(r.groups is None for r in rows if r not in grouped)
  # small regime: d_model 128, n = m = 128; 8 heads of 16
  mh = costs.attention_costs("multi_head", 8, 8, 8, 16, 16, 128, 128)
  for row in grouped:
    params, mults, executed = plan_lib.row_costs(row, 128, 128)
    assert params == mh["params"] + 2 * 64 // row.groups
    assert mults == executed == mh["multiplies"] + 2 * 128 * 128 * 64 // (
        row.groups)
    # the manifest records groups only where set (older manifests match)
    assert plan_lib._row_manifest(row)["groups"] == row.groups  # pylint: disable=protected-access
  assert "groups" not in plan_lib._row_manifest(rows[0])  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="groups is required"):
    rows_lib.check_row(grouped[0]._replace(groups=None), "row")


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(heads=6, groups=4), "groups=4 does not divide heads_k=6"),
    (dict(heads_k=8, heads=6, heads_v=8, groups=4),
     "groups=4 does not divide heads=6"),
    (dict(groups=0), "groups must have a positive size"),
    (dict(groups=-2), "groups must have a positive size"),
    (dict(groups=None), "groups must be a positive integer"),
    (dict(groups=True), "groups must be an int or a \(name, size\) pair"),
])
def test_bad_groups_are_value_errors_naming_groups(kwargs, pattern):
  kwargs = dict(dict(heads_k=kwargs.get("heads", 12),
                     heads_v=kwargs.get("heads", 12)), **kwargs)
  with pytest.raises(ValueError, match=pattern):
    layers.GroupedTalkingHeadsAttention(**kwargs)


def test_bad_groups_in_costs_and_comm():
  for groups, pattern in ((5, "groups=5 does not divide heads_k=24"),
                          (0, "groups must be a positive integer"),
                          (None, "groups is required")):
    with pytest.raises(ValueError, match=pattern):
      costs.attention_costs("grouped_talking_heads", 24, 24, 24, 32, 32, 768,
                            512, groups=groups)
    with pytest.raises(ValueError, match=pattern):
      comm.make_config("grouped_talking_heads", 24, 32, 32, 768, 512, 8,
                       groups=groups)
  with pytest.raises(ValueError, match="groups may not share a name"):
    attention.make_dims(4, 4, 4, 2, 2, groups=("heads", 2))


def test_perf_counts_grouped_projections_and_reads_the_rows():
  """mtf_th perf: L = J P_l and U = W P_w have 1/g of talking heads' FLOPs
  (and its bytes less P_l's: they read and write whole n x m x h tensors), and
  heads-parallel (groups:model) sends multi-head's elements."""
  from mtf_talking_heads.estimate import hardware as hardware_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  impl = hardware_lib.IMPLEMENTATIONS["mtf_th"]
  th = model_lib.make_attention("talking_heads", 24, 32, 32, 24, 24)
  mh = model_lib.make_attention("multi_head", 24, 32, 32)
  for g in (1, 8):
    grouped = model_lib.make_attention("grouped_talking_heads", 24, 32, 32,
                                       24, 24, groups=g)
    ops = {}
    for att in (th, grouped):
      ops[att] = {o.name: o for o in step_time.attention_ops(
          att, 768, 512, 512, 2, impl, "enc_self")}
    for name in ("L0", "U0"):
      assert ops[grouped][name].flops * g == ops[th][name].flops == (
          2 * 2 * 512 * 512 * 24 * 24)
      # the same n x m x h traffic, less of P_l / P_w
      assert ops[th][name].bytes - ops[grouped][name].bytes == (
          24 * 24 - 24 * 24 // g) * impl.activation_bytes
    if g == 8:  # groups:model needs g % P == 0
      assert prices.attention_elements(
          "heads_parallel", grouped, 768, 512, 512, 2, 8) == \
          prices.attention_elements("heads_parallel", mh, 768, 512, 512, 2, 8)
  rows = {name: model for name, _, model in model_lib.experiment_rows(
      "lm_variants")}
  assert rows["11_grouped_talking_heads_8_g4"].dec_self == (
      model_lib.make_attention("grouped_talking_heads", 8, 16, 16, 8, 8,
                               groups=4))


def test_only_the_grouped_classes_take_groups():
  """groups on another layer class would silently group it (and costs,
  perf and sweep rows would count it as ungrouped): refused; and the
  grouped classes have no default number of groups."""
  for cls in (layers.TalkingHeadsAttention, layers.MultiHeadAttention,
              layers.ProjectLogitsEncoderAttention):
    with pytest.raises(ValueError, match="groups: %s does not group"
                       % cls.__name__):
      cls(groups=2)
  for cls in (layers.GroupedTalkingHeadsAttention,
              layers.GroupedTalkingHeadsEncoderAttention):
    with pytest.raises(ValueError, match="groups must be a positive integer"):
      cls(heads_k=8, heads=8, heads_v=8)
    assert cls(groups=2, heads_k=8, heads=8, heads_v=8).dims.groups.size == 2


def test_grid_refuses_grouped_rows_it_cannot_configure():
  from mtf_talking_heads.experiments.sweep import grid  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="grouped_talking_heads needs groups"):
    grid.parse_grid(["variant=talking_heads,grouped_talking_heads"])


def test_perf_checks_groups_against_the_model_axis():
  """A grouped layer is laid out groups:model: mtf_th perf refuses a model
  axis that does not divide its groups (lm_variants row 10 has 2)."""
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  rows = {name: model for name, _, model in model_lib.experiment_rows(
      "lm_variants")}
  model = rows["10_grouped_talking_heads_8_g2"]
  assert step_time.predict(model, "tpu_v3", mesh_shape="model:2")
  with pytest.raises(ValueError, match=r"dec_self groups \(2\) is not "
                     "divisible by the model axis"):
    step_time.predict(model, "tpu_v3", mesh_shape="model:4")


def test_validation_shapes_carry_groups():
  """The pre-flight's tensor shapes of a grouped layer carry `groups` next
  to each heads dim, and its relative-position bias is per (group, head)."""
  from mtf_talking_heads.nn import validation  # pylint: disable=g-import-not-at-top
  layer = layers.GroupedTalkingHeadsAttention(
      groups=2, heads_k=8, heads=8, heads_v=8, d_k=4, d_v=4,
      relative_attention_type="bias", dynamic=["x2l"])
  shapes = validation.attention_tensor_shapes(layer, 16, 2, 8)
  names = {k: [(d.name, d.size) for d in v] for k, v in shapes.items()}
  assert names["Q"] == [("batch", 2), ("length", 8), ("groups", 2),
                        ("heads_k", 4), ("d_k", 4)]
  assert names["L"][-2:] == [("groups", 2), ("heads", 4)]
  assert names["R_Xl"][-3:] == [("groups", 2), ("heads_k", 4), ("heads", 4)]
  assert names["relative_attention_bias"] == [("groups", 2), ("heads", 4),
                                              ("buckets", 32)]
