"""`mtf_th comm` and comm.py: figures against hand-derived formulas.

Configuration (small, model:P with P = 4, so N = P devices): batch b = 8,
length n = m = 8, d_model d = 8, h heads (h_k = h = h_v = 4), d_k = d_v = 2.
|X| = b n d (the residual stream), |Q| = |K| = |V| = |O| = b n h d_k.
mtf counts an all-reduce at N x the reduced slice, an all-gather at N x the
gathered slice, an all-to-all at N x its input slice (comm.py docstring), so
with N = P, per strategy (forward + backward; docs/sharding.md derives them):

  heads_parallel, multi-head   allreduce 2 P |X|    (Y; dX, Q/K/V paths summed)
  heads_parallel, talking h.   allreduce 2 P |X| + 2 P b n m h   (L; dW)
  batch_split_gathered         allconcat 2 P |X| (Y; dX),
                               alltoall  2 P (|P_q| + |P_k| + |P_v| + |P_o|)
                               (+ 4 P h^2): weights gathered, reduce-scattered
  batch_query_split            (batch 2: see its own test)
  batch_split                  alltoall  2 (|Q| + |K| + |V| + |O|)
                               (+ 4 P h^2 for P_l, P_w gathered in
                                reduce-scatter form), allreduce 2 P |X|
  query_split                  alltoall  2 (|Q| + P|K| + P|V| + |O|) (+ 4 P h^2)
  query_split_allgather        alltoall  2 (|Q| + |O|),
                               allconcat 2 P |K| (+ 2 P h^2),
                               allreduce 2 P |X| + 2 P |K| (+ 2 P b h^2:
                               dP_l, dP_w broadcast over the batch)

and ring bytes per device = 4 (P-1)/P (2 allreduce + alltoall + allconcat)/N.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import pytest

from mtf_talking_heads.commands import comm as comm_command
from mtf_talking_heads.measure import comm

B, N, D, H, DK, P = 8, 8, 8, 4, 2, 4
X = B * N * D
Q = B * N * H * DK
NMH = B * N * N * H
PROJ = H * H
MESH = "model:%d" % P


def _expected(variant, strategy):
  th = variant == "talking_heads"
  if strategy == "heads_parallel":
    return dict(allreduce=2 * P * X + (2 * P * NMH if th else 0),
                alltoall=0, allconcat=0,
                max_slice_elements=NMH if th else NMH // P)
  gathers = 4 * P * PROJ if th else 0
  if strategy == "batch_split":
    return dict(allreduce=2 * P * X, alltoall=8 * Q + gathers, allconcat=0,
                max_slice_elements=NMH // P)
  if strategy == "query_split":
    return dict(allreduce=2 * P * X, alltoall=2 * (2 * Q + 2 * P * Q) +
                gathers, allconcat=0, max_slice_elements=NMH // P)
  if strategy == "batch_split_gathered":
    # Y and dX all-gathered (X cut over the batch for free); the four
    # d x h x d_k weights and P_l, P_w gathered in reduce-scatter form
    weights = 4 * D * H * DK + (2 * PROJ if th else 0)
    return dict(allreduce=0, alltoall=2 * P * weights, allconcat=2 * P * X,
                max_slice_elements=NMH // P)
  assert strategy == "query_split_allgather"
  return dict(allreduce=2 * P * X + 2 * P * Q + (2 * P * B * PROJ if th
                                                  else 0),
              alltoall=4 * Q, allconcat=2 * P * Q + (2 * P * PROJ if th
                                                     else 0),
              max_slice_elements=NMH // P)


@pytest.fixture(scope="module")
def measured():
  cache = {}

  def get(variant, strategy):
    if (variant, strategy) not in cache:
      config = comm.make_config(variant, H, DK, DK, D, N, B)
      cache[variant, strategy] = comm.measure(config, strategy, MESH)
    return cache[variant, strategy]
  return get


CASES = [("multi_head", "heads_parallel"), ("multi_head", "batch_split")] + [
    ("talking_heads", s) for s in ("heads_parallel", "batch_split",
                                   "query_split", "query_split_allgather",
                                   "batch_split_gathered")]


@pytest.mark.parametrize("variant, strategy", CASES,
                         ids=["%s-%s" % c for c in CASES])
def test_counts_match_hand_derived_formulas(measured, variant, strategy):
  got = measured(variant, strategy)
  want = _expected(variant, strategy)
  for key, value in want.items():
    assert got[key] == value, (key, got[key], value)
  ring = 2 * want["allreduce"] + want["alltoall"] + want["allconcat"]
  assert got["ring_bytes_per_device"] == 4 * ring * (P - 1) // (P * P)
  assert got["max_elements"] == NMH
  assert got["einsum_replication"] == pytest.approx(
      got["einsum"] / got["einsum_unique"])


def test_batch_query_split_counts_at_a_small_batch():
  """Batch 2 on model:4: p_b = 2 batch shards x p_q = 2 query shards.

  Q, O: all-to-all each way (counted at |Q|, |O|); K, V: broadcast over the
  p_q query shards, then all-to-all each way (counted at p_q |K|, p_q |V|);
  P_l, P_w gathered in reduce-scatter form; Y and dX all-reduced as in
  multi-head.
  """
  b, p_q = 2, 2
  x, q = b * N * D, b * N * H * DK
  config = comm.make_config("talking_heads", H, DK, DK, D, N, b)
  got = comm.measure(config, "batch_query_split", MESH)
  assert got["allreduce"] == 2 * P * x
  assert got["alltoall"] == 2 * (2 * q + 2 * p_q * q) + 4 * P * PROJ
  assert got["allconcat"] == 0
  assert got["max_slice_elements"] * P == b * N * N * H
  assert got["ring_bytes_per_device"] == round(comm.predict(
      config, "batch_query_split", MESH))


def test_talking_heads_split_cores_beat_heads_parallel(measured):
  hp = measured("talking_heads", "heads_parallel")
  for strategy in ("batch_split", "query_split", "batch_split_gathered"):
    got = measured("talking_heads", strategy)
    assert got["ring_bytes_per_device"] < hp["ring_bytes_per_device"]
    # the core is split, not replicated: no more multiplies than multi-head
    assert got["einsum_replication"] <= measured(
        "multi_head", "heads_parallel")["einsum_replication"]


def test_ring_bytes_of_a_two_axis_mesh():
  """Each collective is priced with the size of its own group."""
  counters = [("allreduce/[0]/einsum_op", 800),     # over batch:2
              ("allreduce/[0, 1]/reduce_op", 160),  # over all 8 devices
              ("alltoall/1/reshape_op", 80),        # over model:4
              ("allconcat/1/reshape_op", 160),      # over model:4
              ("einsum", 30), ("einsum_unique", 20), ("output/Foo", 7)]
  got = comm.summarize_counters(counters, "batch:2;model:4")
  assert (got["allreduce"], got["alltoall"], got["allconcat"]) == (960, 80,
                                                                   160)
  assert (got["einsum"], got["einsum_unique"]) == (30, 20)
  want = (2 * (1 / 2) * 800 / 8 + 2 * (7 / 8) * 160 / 8 + (3 / 4) * 80 / 8 +
          (3 / 4) * 160 / 8)
  assert got["ring_elements_per_device"] == pytest.approx(want)


def test_default_layouts_keep_weights_sharded():
  th = comm.make_layer(comm.make_config("talking_heads", H, DK, DK, D, N, B))
  mha = comm.make_layer(comm.make_config("multi_head", H, DK, DK, D, N, B))
  assert comm.default_layout(th, "batch:2;model:4") == (
      "batch:batch;heads_k:model;heads_v:model")
  assert comm.default_layout(mha, "model:8") == "heads:model"
  logits = comm.make_layer(comm.make_config("project_logits", H, DK, DK, D,
                                            N, B, heads_k=8))
  # P_l[heads_k, heads] may not have both dims on "model"
  assert comm.default_layout(logits, "model:4") == "heads_k:model"
  with pytest.raises(ValueError, match="'rows'.*--layout"):
    comm.default_layout(th, "rows:2;model:4")


# ------------------------------------------------------------------- CLI
ARGS = ["--heads", str(H), "--d_k", str(DK), "--d_v", str(DK), "--d_model",
        str(D), "--length", str(N), "--mesh_shape", MESH]


def test_cli_prints_one_row_per_strategy(capsys, measured):
  rc = comm_command.main(["--variant", "multi_head", "--batch", str(B),
                          "--strategy", "heads_parallel", "--format", "md"]
                         + ARGS)
  out = capsys.readouterr().out.splitlines()
  assert rc == 0
  assert out[0] == "| " + " | ".join(comm.COLUMNS) + " |"
  cells = [c.strip() for c in out[2].strip("|").split("|")]
  want = measured("multi_head", "heads_parallel")
  assert cells[:5] == ["multi_head", "heads_parallel", MESH, "heads:model",
                       str(2 * P * X)]
  assert int(cells[-1]) == want["ring_bytes_per_device"]
  assert len(out) == 3


def test_cli_all_skips_what_cannot_apply(capsys):
  rc = comm_command.main(["--variant", "talking_heads", "--batch", "2"]
                         + ARGS)
  captured = capsys.readouterr()
  assert rc == 0
  rows = captured.out.splitlines()
  assert rows[0] == ",".join(comm.COLUMNS)
  assert [r.split(",")[1] for r in rows[1:]] == [
      "heads_parallel", "query_split_allgather", "query_split",
      "batch_query_split"]
  assert "batch_split does not apply" in captured.err
  assert "'batch'" in captured.err and "'model'" in captured.err


@pytest.mark.parametrize("argv, words", [
    (["--variant", "talking_heads", "--batch", "8", "--strategy",
      "query_split", "--length", "6"], ["'length'", "'model'"]),
    (["--variant", "talking_heads", "--batch", "8", "--layout",
      "heads_k:model;heads:model"], ["'heads_k'", "'heads'", "'model'"]),
    (["--variant", "general_bilinear", "--batch", "8"], ["variant"]),
    (["--variant", "talking_heads", "--batch", "0"], ["batch"]),
], ids=["indivisible-length", "obstacle-1", "no-strategies", "batch-0"])
def test_cli_errors_exit_2_naming_the_problem(capsys, argv, words):
  args = list(ARGS)
  if "--length" in argv:
    i = args.index("--length")
    del args[i:i + 2]
  rc = comm_command.main(argv + args)
  err = capsys.readouterr().err
  assert rc == 2
  assert err.startswith("mtf_th comm: error:")
  for word in words:
    assert word in err, (word, err)


def test_batch_split_keeps_every_attention_weight_sharded():
  """Each device stores 1/P of P_q, P_k, P_v, P_o (and P_l, P_w)."""
  from mtf_talking_heads.measure import harness  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  config = comm.make_config("talking_heads", H, DK, DK, D, N, B)
  strategy = strategies.BatchSplit()
  layer = comm.make_layer(config, strategy)
  layout = comm.full_layout(comm.default_layout(layer, MESH), strategy.layout_rules())
  run = harness.Harness([layer], d_model=D, vocab=16, batch=B, length=N,
                        mesh_shape=MESH, layout=layout, optimizer_step=True,
                        run=False, mesh_impl_cls=comm.PointToPointMeshImpl)
  names = {}
  for v in run.lowering.graph.trainable_variables:
    short = v.name.split("/")[-1]
    if short in ("p_q", "p_k", "p_v", "p_o", "p_l", "p_w"):
      impl = run.lowering.mesh_impl(v)
      names[short] = impl.slice_size(v.outputs[0].shape) * P
      assert names[short] == v.outputs[0].shape.size, short
  assert sorted(names) == ["p_k", "p_l", "p_o", "p_q", "p_v", "p_w"]


# `mtf_th comm` rows of the existing strategies as the code measured them
# before the layer handed Q, K, V and Y to the strategy (commit 36a93c2):
# allreduce, alltoall, allconcat, ring bytes per device.  Talking heads
# h_k = h_v = 4, h = 8, d_k = 2, d_v = 3, d_model 8, length 8, batch 8 on
# batch:2;model:4 (the two-axis mesh: the outer-dim paths), and the
# logits-only variant (h_k = 8, h = 4: heads unsplit, allconcats) on model:2.
UNCHANGED = {
    ("talking_heads", "batch:2;model:4"): {
        "heads_parallel": (46472, 0, 0, 32452),
        "query_split_allgather": (21256, 2560, 5632, 16516),
        "query_split": (14088, 13824, 0, 13252),
        "batch_split": (14088, 6144, 0, 10372)},
    ("project_logits", "model:2"): {
        "heads_parallel": (6144, 0, 0, 12288),
        "query_split_allgather": (6144, 2048, 3648, 17984),
        "query_split": (3584, 6272, 1536, 14976),
        "batch_split": (2048, 4224, 3072, 11392)},
}


@pytest.mark.parametrize("variant, mesh", sorted(UNCHANGED),
                         ids=["%s-%s" % k for k in sorted(UNCHANGED)])
def test_existing_strategies_counters_unchanged(capsys, variant, mesh):
  """One `mtf_th comm --strategy NAME` per strategy of the table (`--strategy
  all` would lower the newer strategies too, whose rows are not pinned)."""
  heads = ["--heads_k", "8", "--heads", "4"] if variant == "project_logits" \
      else ["--heads_k", "4", "--heads", "8", "--heads_v", "4"]
  for strategy, want in UNCHANGED[variant, mesh].items():
    rc = comm_command.main(
        ["--variant", variant, "--d_k", "2", "--d_v", "3", "--d_model", "8",
         "--length", "8", "--batch", "8", "--mesh_shape", mesh,
         "--strategy", strategy] + heads)
    assert rc == 0
    rows = [r.split(",") for r in capsys.readouterr().out.splitlines()[1:]]
    assert [r[1] for r in rows] == [strategy]
    got = tuple(int(rows[0][i]) for i in (4, 5, 6, 9))
    assert got == want, strategy
