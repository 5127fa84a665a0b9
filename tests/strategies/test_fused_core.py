"""The fused attention core (nn/core_kernel.py) == the einsum core.

* Every applicable variant (multi-head, talking heads, logits-only,
  weights-only, grouped) x bias (none, causal, padding, T5-style trainable
  relative bias with a mask) and a split-shaped core (two lead and two query
  dims, a bias with part of them): one mtf graph on one device computes each
  core twice, kernels.ordered_core under kind "einsum" and "fused", and
  compares O and the gradients of Q, K, V, P_l, P_w and the relative bias
  (within 1e-5 relative, float32).
* Every strategy's per-slice core on a mesh of logical CPUs (HeadsParallel
  with the batch split and with multi-head's heads split, grouped heads
  split, QuerySplit in both gather forms, BatchSplit, BatchQuerySplit,
  GatheredBatchSplit, Auto, RecomputeCore): a one-layer model with causal,
  padding and relative-position biases, fused and sharded, equals the
  unsharded einsum model (loss, logits, every gradient, within 1e-5), and its
  graph has the fused op and no softmax.
* Greedy decoding: the fused first pass and the einsum one-position steps
  decode what the einsum core decodes.
* Where the fused core does not apply (dynamic projections, attention
  dropout, bfloat16, decoding one position, split memory_length, split heads
  with projections, op not loaded) the einsum core runs and stderr has one
  line, once; kind "fused" there is a one-line ValueError, and before any
  graph `mtf_th train` exits 2 with it.
"""
import subprocess

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import attention
from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn import fused_op
from mtf_talking_heads.nn import kernels
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies
from _cli_util import MTF_TH, REPO
from _equiv_util import Probe, relative_error
import _strategy_util as su

TOL = 1e-5


kind = su.core_kernel


@pytest.fixture(scope="module", autouse=True)
def op_loaded():
  fn, reason = core_kernel.load()
  assert fn is not None, "the fused op did not load: %s" % reason


# ---------------------------------------------------------------------------
# One graph, one device: every variant x bias, the einsum and fused cores.

D = mtf.Dimension
BATCH, N, M, D_K, D_V = D("batch", 2), D("length", 5), D("memory_length", 7), \
    D("d_k", 3), D("d_v", 2)
VARIANTS = {  # name: (heads_k, heads, heads_v, groups); sizes differ
    "multi_head": (("heads", 4), ("heads", 4), ("heads", 4), None),
    "talking_heads": (("heads_k", 3), ("heads", 4), ("heads_v", 2), None),
    "project_logits": (("heads_k", 3), ("heads", 4), ("heads", 4), None),
    "project_weights": (("heads", 4), ("heads", 4), ("heads_v", 2), None),
    "grouped": (("heads_k", 4), ("heads", 6), ("heads_v", 2), 2),
}
BIASES = ("none", "causal", "padding", "relative_causal", "relative_padding")


class _Cores(object):
  """Builds cores in one mtf graph; run() lowers on one device and fetches."""

  def __init__(self):
    self.graph = tf.Graph()
    self.mtf_graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.mtf_graph, "mesh")
    self.rng = np.random.RandomState(0)
    self.wanted = {}  # key: (einsum mtf tensor, fused mtf tensor)
    self.fused_ops = 0

  def var(self, name, dims, scale=1.0):
    return mtf.get_variable(
        self.mesh, name, mtf.Shape(dims),
        initializer=tf.random_normal_initializer(stddev=scale))

  def const(self, value, dims):
    return mtf.import_tf_tensor(self.mesh, tf.constant(value, tf.float32),
                                mtf.Shape(dims))

  def mask(self, visible, dims):
    return self.const(np.where(visible, 0.0, -1e9), dims)

  def causal(self, query=(N,)):
    n = np.arange(N.size)[:, None] + (M.size - N.size)
    shape = [d.size for d in query] + [M.size]
    return self.mask(np.broadcast_to(np.arange(M.size)[None] <= n,
                                     (N.size, M.size)).reshape(shape),
                     list(query) + [M])

  def padding(self, lead):
    visible = self.rng.rand(*([d.size for d in lead] + [N.size, M.size]))
    visible = (visible > 0.4) | (np.arange(M.size) == 0)
    return self.mask(visible, lead + [N, M])

  def add(self, key, q, k, v, dims, p_l, p_w, bias, inputs):
    """The einsum and fused cores of one case, and their gradients."""
    cores = {}
    for k_ in ("einsum", "fused"):
      with kind(k_):
        cores[k_] = kernels.ordered_core(q, k, v, M, dims, p_l, p_w,
                                         bias=bias)
    fused = cores["fused"]
    assert isinstance(fused.operation, core_kernel.FusedCore), key
    self.fused_ops += 1
    r = self.const(self.rng.randn(*cores["einsum"].shape.to_integer_list),
                   cores["einsum"].shape.dims)
    for k_, o in cores.items():
      loss = mtf.reduce_sum(o * r)
      grads = mtf.gradients([loss], inputs)
      self.wanted[key + ("O", k_)] = mtf.einsum(
          [o], output_shape=cores["einsum"].shape)
      for i, g in enumerate(grads):
        self.wanted[key + ("d%d" % i, k_)] = g

  def run(self):
    mesh_impl = harness.mesh_impl("", "")
    lowering = mtf.Lowering(self.mtf_graph, {self.mesh: mesh_impl})
    fetch = {key: lowering.export_to_tf_tensor(t)
             for key, t in self.wanted.items()}
    init = tf.global_variables_initializer()
    copy = lowering.copy_masters_to_slices()
    with tf.Session(graph=self.graph, config=su.session_config()) as s:
      s.run(init)
      s.run(copy)
      return s.run(fetch)


def _variant_case(cores, variant, bias_kind):
  heads_k, heads, heads_v, groups = VARIANTS[variant]
  dims = attention.make_dims(
      heads_k, heads, heads_v, D_K, D_V,
      groups=None if groups is None else D("groups", groups))
  g = dims.group_dims
  name = "%s_%s_" % (variant, bias_kind)
  q = cores.var(name + "q", [BATCH, N] + g + [dims.heads_k, D_K])
  k = cores.var(name + "k", [BATCH, M] + g + [dims.heads_k, D_K])
  v = cores.var(name + "v", [BATCH, M] + g + [dims.heads_v, D_V])
  inputs = [q, k, v]
  p_l = p_w = bias = None
  if dims.project_logits:
    p_l = cores.var(name + "p_l", g + [dims.heads_k, dims.heads], 0.5)
    inputs.append(p_l)
  if dims.project_weights:
    p_w = cores.var(name + "p_w", g + [dims.heads, dims.heads_v], 0.5)
    inputs.append(p_w)
  if bias_kind.startswith("relative"):
    bias = cores.var(name + "relative", g + [dims.heads, N, M])
    inputs.append(bias)
  if bias_kind.endswith("causal"):
    bias = cores.causal() if bias is None else bias + cores.causal()
  if bias_kind.endswith("padding"):
    mask = cores.padding([BATCH])
    bias = mask if bias is None else bias + mask
  cores.add((variant, bias_kind), q, k, v, dims, p_l, p_w, bias, inputs)


def _split_shaped_case(cores):
  """A split core's shape: lead [outer, batch], query [cq, nq], a causal
  mask with outer but not batch, a relative bias with heads."""
  outer, cq, nq = D("outer", 2), D("cq", 2), D("nq", 3)
  n_dims = [cq, nq]
  dims = attention.make_dims(("heads_k", 3), ("heads", 4), ("heads_v", 2),
                             D_K, D_V)
  q = cores.var("s_q", [outer, BATCH] + n_dims + [dims.heads_k, D_K])
  k = cores.var("s_k", [outer, BATCH, M, dims.heads_k, D_K])
  v = cores.var("s_v", [BATCH, outer, M, dims.heads_v, D_V])
  p_l = cores.var("s_p_l", [dims.heads_k, dims.heads], 0.5)
  p_w = cores.var("s_p_w", [dims.heads, dims.heads_v], 0.5)
  rel = cores.var("s_rel", [nq, dims.heads, M])
  visible = cores.rng.rand(outer.size, cq.size, nq.size, M.size) > 0.3
  visible |= np.arange(M.size) == 1
  bias = cores.mask(visible, [outer, cq, nq, M]) + rel
  cores.add(("split_shaped", "outer_mask_relative"), q, k, v, dims, p_l,
            p_w, bias, [q, k, v, p_l, p_w, rel])


@pytest.fixture(scope="module")
def core_values():
  cores = _Cores()
  with cores.graph.as_default():
    tf.set_random_seed(1)
    for variant in VARIANTS:
      for bias_kind in BIASES:
        _variant_case(cores, variant, bias_kind)
    _split_shaped_case(cores)
    return cores.fused_ops, cores.run()


@pytest.mark.parametrize("variant", list(VARIANTS) + ["split_shaped"])
def test_fused_equals_einsum_forward_and_every_gradient(core_values,
                                                        variant):
  built, values = core_values
  assert built == len(VARIANTS) * len(BIASES) + 1
  keys = {key[:3] for key in values if key[0] == variant}
  cases = {key[1] for key in keys}
  assert cases == ({"outer_mask_relative"} if variant == "split_shaped"
                   else set(BIASES))
  errors = {}
  for key in sorted(keys):
    want, got = values[key + ("einsum",)], values[key + ("fused",)]
    assert np.abs(want).max() > 0, key
    errors[key] = relative_error(got, want)
  # O and dQ, dK, dV (+ dP_l, dP_w, d relative bias) of each bias
  assert len(errors) >= 4 * len(cases)
  bad = {k: e for k, e in errors.items() if not e <= TOL}
  assert not bad, "fused differs from einsum: %s" % bad


# ---------------------------------------------------------------------------
# Strategies on meshes: fused, sharded == einsum, unsharded.

LENGTH, VOCAB = 8, 32
SEQUENCE_ID = np.array([[1] * 5 + [2] * 3, [1] * 8, [1] * 2 + [2] * 6,
                        [1] * 4 + [2] * 2 + [3] * 2])
MODELS = {
    "th": lambda s: layers.TalkingHeadsAttention(
        heads_k=4, heads=8, heads_v=4, d_k=2, d_v=3, strategy=s,
        relative_attention_type="bias", relative_attention_num_buckets=8),
    "mha": lambda s: layers.MultiHeadAttention(
        heads=4, d_k=2, d_v=3, strategy=s, relative_attention_type="bias",
        relative_attention_num_buckets=8),
    "grouped": lambda s: layers.GroupedTalkingHeadsAttention(
        heads_k=4, heads=8, heads_v=4, groups=2, d_k=2, d_v=3, strategy=s,
        relative_attention_type="bias", relative_attention_num_buckets=8),
}
# id: (model, strategy name, mesh, extra layout rules, batch, padding);
# without padding the bias lacks the batch, which batch:2 splits
RUNS = {
    "th-heads_parallel-batch2": ("th", "heads_parallel", "batch:2",
                                 "batch:batch", 4, False),
    "mha-heads_parallel-model2": ("mha", "heads_parallel", "model:2", "", 4,
                                  True),
    "grouped-heads_parallel-model2": ("grouped", "heads_parallel", "model:2",
                                      "", 4, True),
    "th-query_split-model2": ("th", "query_split", "model:2", "", 4, True),
    "th-query_split_allgather-model2": ("th", "query_split_allgather",
                                        "model:2", "", 4, True),
    "th-batch_split-batch2xmodel2": ("th", "batch_split", "batch:2;model:2",
                                     "batch:batch", 4, True),
    "th-batch_query_split-model4": ("th", "batch_query_split", "model:4", "",
                                    2, True),
    "th-batch_split_gathered-model2": ("th", "batch_split_gathered",
                                       "model:2", "", 4, True),
    "th-auto-model2": ("th", "auto", "model:2", "", 4, True),
    "th-recompute-1": ("th", "recompute", "", "", 4, True),
}
FAST = {"th-heads_parallel-batch2", "th-query_split_allgather-model2",
        "th-batch_split-batch2xmodel2", "th-batch_query_split-model4",
        "grouped-heads_parallel-model2"}


def _strategy(name):
  if name == "recompute":
    return strategies.RecomputeCore()
  return strategies.make_strategy(name)


def _harness(model, strategy, batch, padded, mesh_shape="", layout=""):
  """A one-layer model (Probe: mtf's padding mask from SEQUENCE_ID)."""
  probe = Probe(MODELS[model](strategy), "attention",
                sequence_id=SEQUENCE_ID[:batch] if padded else None)
  return harness.Harness([probe], d_model=16, vocab=VOCAB, batch=batch,
                         length=LENGTH, mesh_shape=mesh_shape, layout=layout,
                         config=su.session_config())


@pytest.fixture(scope="module")
def references():
  """{(model, batch, padded): (initial values, fetched)}: einsum, one
  device."""
  cache = {}

  def get(*key):
    if key not in cache:
      with kind("einsum"):
        run = _harness(key[0], strategies.HeadsParallel(), *key[1:])
      try:
        initial = run.variable_values()
        cache[key] = initial, run.fetch(
            ["loss", "logits"] + ["grad:" + n for n in sorted(run.grads)])
      finally:
        run.close()
    return cache[key]
  return get


def _run_cases():
  return [pytest.param(key, id=key, marks=() if key in FAST
                       else (pytest.mark.slow,)) for key in RUNS]


@pytest.mark.parametrize("key", _run_cases())
def test_strategy_fused_sharded_equals_einsum_unsharded(references, key):
  model, name, mesh_shape, extra, batch, padded = RUNS[key]
  strategy = _strategy(name)
  inner = MODELS[model](strategy)
  layout = ""
  if mesh_shape:
    layout = ";".join(r for r in (su.layout_for(inner, mesh_shape, strategy),
                                  extra) if r)
  initial, want = references(model, batch, padded)
  with kind("fused"):
    run = _harness(model, strategy, batch, padded, mesh_shape, layout)
  try:
    run.assign(initial)
    got = run.fetch(["loss", "logits"] + ["grad:" + n
                                          for n in sorted(run.grads)])
    types = {op.type for op in run.graph.get_operations()}
  finally:
    run.close()
  assert {"FusedAttentionCore", "FusedAttentionCoreGrad"} <= types
  assert "Softmax" not in types
  assert sorted(got) == sorted(want)
  assert any("relative_attention_bias" in k for k in got)
  errors = {k: relative_error(got[k], want[k]) for k in want}
  bad = {k: e for k, e in errors.items() if not e <= TOL}
  assert not bad, "fused %s differs from einsum unsharded: %s" % (key, bad)


@pytest.mark.parametrize("strategy", ["batch_split", "query_split_allgather"])
def test_fused_core_communicates_what_the_einsum_core_does(strategy):
  """The same all-to-alls and all-gathers; the same all-reduces, except
  that the query split's dP_l, dP_w are all-reduced as [h, h], not
  broadcast over the batch (b h^2 each, the einsum core's project_heads)."""
  b, h, p = 8, 4, 4
  config = comm.make_config("talking_heads", h, 2, 2, 8, 8, b)
  got = {k_: comm.measure(config, strategy, "model:%d" % p, kernel=k_)
         for k_ in ("einsum", "fused")}
  for key in ("alltoall", "allconcat", "max_slice_elements", "max_elements"):
    assert got["fused"][key] == got["einsum"][key], key
  saved = 2 * p * (b - 1) * h * h if strategy.startswith("query") else 0
  assert got["einsum"]["allreduce"] - got["fused"]["allreduce"] == saved


def test_greedy_decoding_fused_first_pass_equals_einsum(capsys):
  """first_part runs fused, the one-position steps the einsum core (one
  line says so); the decoded ids are the einsum core's."""
  decoded = {}
  for k_ in ("einsum", "auto"):
    core_kernel._NOTED.discard("decoding one position at a time")  # pylint: disable=protected-access
    with kind(k_):
      layer = su.make_layer("th", strategies.HeadsParallel())
      decode = su.GreedyDecode([layer], "", "")
    types = [op.type for op in decode.graph.get_operations()]
    decoded[k_] = (decode.run()[0], types.count("FusedAttentionCore"))
  err = capsys.readouterr().err
  assert err.count("[attention core] einsum, not fused: decoding one "
                   "position at a time\n") == 1
  assert decoded["einsum"][1] == 0 and decoded["auto"][1] == 1
  np.testing.assert_array_equal(decoded["auto"][0], decoded["einsum"][0])


# ---------------------------------------------------------------------------
# Where it does not apply: the einsum core, one line; "fused": an error.

def _tensors(dtype=tf.float32, query=True, dynamic=False):
  """Q, K, V, P_l, P_w (and R_Xl) of a talking-heads core, no lowering."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dims = attention.make_dims(("heads_k", 2), ("heads", 2), ("heads_v", 2),
                             2, 2)
  n = [N] if query else []

  def zeros(shape):
    return mtf.zeros(mesh, mtf.Shape(shape), dtype)
  q = zeros([BATCH] + n + [dims.heads_k, dims.d_k])
  k = zeros([BATCH, M, dims.heads_k, dims.d_k])
  v = zeros([BATCH, M, dims.heads_v, dims.d_v])
  p_l = zeros([dims.heads_k, dims.heads])
  p_w = zeros([dims.heads, dims.heads_v])
  r = [zeros([BATCH] + n + [dims.heads_k, dims.heads])] if dynamic else []
  return dict(q=q, k=k, v=v, memory_length=M, dims=dims, p_l=p_l, p_w=p_w,
              dynamic_l=r)


REFUSALS = {
    "dynamic": (dict(dynamic=True), {},
                "dynamic projections (their R tensors vary per query or "
                "key)"),
    "dropout": ({}, dict(dropout_fn=lambda u: u),
                "attention dropout in training (dropout_rate > 0)"),
    "bfloat16": (dict(dtype=tf.bfloat16), {},
                 "bfloat16 activations (the fused op takes float32 or "
                 "float64)"),
    "incremental": (dict(query=False), {}, "decoding one position at a time"),
    "memory_length": ({}, dict(layout=strategies.MeshLayout(
        "model:2", "memory_length:model")),
                      "dim 'memory_length' split over mesh axis 'model' "
                      "(the softmax runs over it)"),
    "split_heads": ({}, dict(layout=strategies.MeshLayout(
        "batch:2;model:2", "heads_k:model;heads_v:model")),
                    "dim 'heads_k' split over mesh axis 'model' "
                    "(talking-heads projections mix heads across devices)"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_not_applicable_runs_einsum_with_one_line(capsys, case):
  make, extra, reason = REFUSALS[case]
  core_kernel._NOTED.discard(reason)  # pylint: disable=protected-access
  for _ in range(2):
    with kind("auto"):
      assert core_kernel.fused_or_none(**_tensors(**make), **extra) is None
  assert capsys.readouterr().err == (
      "[attention core] einsum, not fused: %s\n" % reason)
  with kind("fused"):
    if case == "incremental":  # decoding steps run the einsum core anyway
      assert core_kernel.fused_or_none(**_tensors(**make), **extra) is None
      return
    with pytest.raises(ValueError) as e:
      core_kernel.fused_or_none(**_tensors(**make), **extra)
  assert str(e.value) == (
      "mtf_th.core_kernel.kind = \"fused\", but the fused attention core "
      "cannot run: %s; set mtf_th.core_kernel.kind = \"auto\" (the einsum "
      "core where the fused one cannot run) or \"einsum\"" % reason)


def test_unsplit_heads_and_size_one_axes_do_fuse_and_einsum_never():
  layout = strategies.MeshLayout("model:1;batch:2", "heads_k:model;batch:batch")
  with kind("auto"):
    o = core_kernel.fused_or_none(**_tensors(), layout=layout)
  assert isinstance(o.operation, core_kernel.FusedCore)
  assert o.shape.dimension_names == ["batch", "heads_v", "length", "d_v"]
  with kind("einsum"):
    assert core_kernel.fused_or_none(**_tensors()) is None


def test_op_not_loaded_runs_einsum_with_its_reason(capsys, monkeypatch):
  reason = "no C++ compiler: 'g++' (the default) not found; install g++"
  monkeypatch.setattr(fused_op, "_LOADED", [(None, reason)])
  core_kernel._NOTED.discard(reason)  # pylint: disable=protected-access
  with kind("auto"):
    assert core_kernel.fused_or_none(**_tensors()) is None
  assert capsys.readouterr().err == (
      "[attention core] einsum, not fused: %s\n" % reason)
  with kind("fused"), pytest.raises(ValueError, match="cannot run: no C"):
    core_kernel.fused_or_none(**_tensors())


def test_kind_is_checked_and_tpu_lowers_the_reference():
  with kind("fast"), pytest.raises(ValueError, match=(
      r"mtf_th.core_kernel.kind: unknown 'fast'; choose \"auto\", "
      r"\"fused\" or \"einsum\"")):
    core_kernel.core_kernel()
  op = core_kernel.fused_or_none(**_tensors()).operation
  assert isinstance(op.functions(object()), fused_op._Reference)  # pylint: disable=protected-access


def test_check_before_graph_names_the_layer_and_the_fix():
  dynamic = layers.DynamicProjectionsAttention(heads_k=4, heads=4, heads_v=4)
  dropout = layers.TalkingHeadsAttention(dropout_rate=0.1)
  split = layers.TalkingHeadsAttention(
      strategy=strategies.HeadsParallel())
  mesh = strategies.MeshLayout("model:2", "heads_k:model")
  with kind("fused"):
    for layer, kw, reason in (
        (dynamic, {}, "dynamic projections"),
        (dropout, {}, "attention dropout in training"),
        (split, dict(mesh=mesh), "dim 'heads_k' split over mesh axis "
         "'model'"),
        (split, dict(dtype="bfloat16"), "bfloat16 activations")):
      with pytest.raises(ValueError, match=reason) as e:
        core_kernel.check_before_graph([layer], **kw)
      assert ("in %s; set mtf_th.core_kernel.kind = \"auto\""
              % type(layer).__name__) in str(e.value)
    core_kernel.check_before_graph([dropout], train=False)  # eval: no dropout
    # a split strategy's core has the heads whole
    core_kernel.check_before_graph([layers.TalkingHeadsAttention(
        strategy=strategies.BatchSplit())], mesh=mesh)
    with pytest.raises(ValueError, match="not on a TPU"):
      core_kernel.check_before_graph([], tpu=True)
  with kind("auto"):
    core_kernel.check_before_graph([dynamic])


def test_train_refuses_fused_where_it_cannot_run_before_the_graph(tmp_path):
  proc = subprocess.run(
      [MTF_TH, "train", "--model_dir", str(tmp_path / "m"),
       "--gin_file=experiments/lm_variants/05_dp_x2l_8.gin",
       "--gin_file=models/lm_tiny.gin",
       "--gin_param=mtf_th.core_kernel.kind = 'fused'"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (
      "mtf_th train: error: mtf_th.core_kernel.kind = \"fused\", but the "
      "fused attention core cannot run: dynamic projections (their R "
      "tensors vary per query or key) in DynamicProjectionsAttention; set "
      "mtf_th.core_kernel.kind = \"auto\" (the einsum core where the fused "
      "one cannot run) or \"einsum\""), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "m").exists()
