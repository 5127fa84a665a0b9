"""mtf_th plan: candidates, their numbers, the refusal line, bad input."""
import csv
import io
import os

import pytest

import _cli_util

from mtf_talking_heads.estimate import hardware as hardware_lib
from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import planner
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.estimate import step_time
from mtf_talking_heads.estimate import strategy_table

MTF_TH = _cli_util.MTF_TH
TH24 = "experiments/t5_heads/07_talking_heads_24_32.gin"
TH48 = "experiments/t5_heads/08_talking_heads_48_16.gin"


def _cli(argv, capsys):
  from mtf_talking_heads import cli  # pylint: disable=g-import-not-at-top
  status = cli.main(["plan"] + argv)
  out, err = capsys.readouterr()
  return status, out, err


def test_paper_setup_fits(capsys):
  # Table 1's talking heads 24 x 32 at the paper's batch 128 on a v3-32:
  # 4 sequences per core fit (6.74 GiB of 16), data parallel or with a
  # model axis of 2 (the paper's T5 vocabulary: --vocab 32128)
  status, out, err = _cli(["--gin_file", TH24, "--hardware", "tpu_v3",
                           "--devices", "32", "--format", "csv", "--vocab",
                           "32128"], capsys)
  assert status == 0, err
  rows = list(csv.DictReader(io.StringIO(out)))
  assert len(rows) == 10  # --top's default
  first = [r for r in rows if r["mesh_shape"] == "batch:32,model:1"][0]
  assert (first["strategy"], first["fits"], first["memory_gib"]) == (
      "heads_parallel", "yes", "6.74")
  model = model_lib.model_from_gin([TH24])
  mem = memory.predict(model, "batch:32,model:1", "mtf_th",
                       layout="batch:batch")
  assert float(first["memory_gib"]) == pytest.approx(
      mem["total"] / 2 ** 30, abs=0.006)
  assert float(first["step_s"]) == pytest.approx(
      step_time.predict(model, "tpu_v3", "batch:32,model:1",
                        "mtf_th")["step_s"], abs=1e-4)
  assert "mesh_shape = 'batch:32;model:1'" in first["gin"]
  # every row fits, sorted by step time
  times = [float(r["step_s"]) for r in rows]
  assert times == sorted(times) and {r["fits"] for r in rows} == {"yes"}


def test_split_strategy_rows_and_bindings():
  model = model_lib.model_from_gin([TH24], ["batch_size = 16"])
  cands = planner.plan(model, "tpu_v4", 8)
  names = {(c.mesh_shape, c.strategy) for c in cands}
  assert ("batch:1,model:8", "batch_split") in names
  # the query splits need the length divisible by the model axis: the
  # decoder's 114 targets are not
  assert ("batch:1,model:8", "query_split") not in names
  assert ("batch:4,model:2", "query_split") in names
  split = [c for c in cands if c.mesh_shape == "batch:1,model:8" and
           c.strategy == "batch_split"][0]
  assert "mtf_th.TalkingHeadsAttention.strategy = @mtf_th.BatchSplit()" in \
      split.gin
  assert any("core_shard:model" in g for g in split.gin)
  heads = [c for c in cands if c.mesh_shape == "batch:1,model:8" and
           c.strategy == "heads_parallel"][0]
  # the split core keeps 1/8 of W where heads-parallel keeps it whole
  assert split.memory["core"] < heads.memory["core"]


def test_split_strategy_ring_elements_are_prices_on_the_heads_layout():
  # project logits 12 heads, h_k 24, d_k = d_v 64, d_model 768, n = m 512,
  # 16 examples, model:8, batch_split: heads_k:model (prices'
  # heads_parallel_layout, as comm.default_layout) splits Q, K but not V, O
  # (their heads_v is "heads"); f = 7/8, X = 16*512*768:
  #   4 f X + 2 f/8 (Q + K) + f (V + O) + 2 f P_l
  att = model_lib.make_attention("project_logits", 12, 64, heads_k=24)
  f, x = 7 / 8, 16 * 512 * 768
  qk, vo = 16 * 512 * 24 * 64, 16 * 512 * 12 * 64
  assert prices.attention_elements(
      "batch_split", att, 768, 512, 512, 16, 8) == (
      4 * f * x + 2 * f / 8 * 2 * qk + f * 2 * vo + 2 * f * 24 * 12)
  weights = model_lib.make_attention("project_weights", 12, 64, heads_v=24)
  model = model_lib.paper_model(12, 64)._replace(enc_self=weights,
                                           dec_self=weights, encdec=weights)
  assert planner.layout(model, 8) == (
      "batch:batch,heads:model,d_ff:model,vocab:model")


def test_strategy_tables_are_sharding_strategies():
  # strategy_table.py (TensorFlow-free, read by the planner, memory.py and
  # prices.py) names the strategies nn/strategies builds, with their classes
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  names = set(strategies.STRATEGIES)
  assert set(strategy_table.NAMES) == names
  model = model_lib.paper_model(24, 32, "talking_heads", heads_k=24, heads_v=24)
  for name in names:
    gin = planner.gin_bindings(model, "batch:4,model:2", name, False)
    made = strategies.make_strategy(name)
    assert ("mtf_th.TalkingHeadsAttention.strategy = @mtf_th.%s()"
            % type(made).__name__) in gin
    assert ("mtf_th.QuerySplit.reduce_scatter = False" in gin) == (
        getattr(made, "reduce_scatter", True) is False)


def test_nothing_fits_one_line_and_status_1(capsys):
  # the paper's batch 128 on a v2-8: 16 sequences per 8 GiB core; even
  # with the core recomputed talking heads 48 x 16 needs 9.53 GiB (the
  # paper's vocabulary); the next v2 slice is a v2-32
  status, out, err = _cli(["--gin_file", TH48, "--hardware", "tpu_v2",
                           "--devices", "8", "--vocab", "32128"], capsys)
  assert status == 1 and not out
  assert err.count("\n") == 1, err
  assert err == (
      "mtf_th plan: nothing fits: the smallest is 9.53 GiB per device "
      "(batch:8,model:1, heads_parallel+recompute) against 7.20 GiB usable "
      "of 8.00 GiB on tpu_v2 (10% margin), batch 128 on 8 devices; it "
      "would fit with --batch 64 (8 per device) or --devices 32 (a larger "
      "slice)\n")


def test_bert_768_heads_fits_nowhere_as_docs_costs_md_says(capsys):
  """docs/costs.md quotes this line for the 768-head BERT row (dropout 0.1:
  no recomputed core) on a v3-32, with its task's vocabulary (th_mlm:
  8100 ids, padded to 8192) as benchmarks/auto_mtf_layout.py prices it."""
  status, out, err = _cli(
      ["--gin_file", "experiments/bert_heads/10_talking_heads_768_1.gin",
       "--hardware", "tpu_v3", "--devices", "32"], capsys)
  line = err.strip()
  assert status == 1 and not out
  assert line == (
      "mtf_th plan: nothing fits: the smallest is 302.41 GiB per device "
      "(batch:16,model:2, batch_split) against 14.40 GiB usable of 16.00 GiB "
      "on tpu_v3 (10% margin), batch 256 on 32 devices; it would fit with "
      "--batch 8 (0.25 per device) or --devices 1024 (a larger slice)")
  with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                         "costs.md")) as f:
    assert line in " ".join(f.read().split())


def test_recompute_rows_trade_memory_for_time():
  model = model_lib.model_from_gin([TH24])
  cands = {(c.mesh_shape, c.recompute): c
           for c in planner.plan(model, "tpu_v3", 8)
           if c.strategy == "heads_parallel"}
  plain, again = cands[("batch:8,model:1", False)], cands[("batch:8,model:1",
                                                            True)]
  assert (plain.fits, again.fits) == (False, True)
  assert again.memory["core"] == 0 and plain.memory["core"] > 0
  assert again.step_s > plain.step_s
  assert "mtf_th.TalkingHeadsAttention.strategy = @mtf_th.RecomputeCore()" \
      in again.gin


@pytest.mark.parametrize("argv,pattern", [
    (["--gin_file", TH24, "--hardware", "tpu_v3", "--devices", "0"],
     "--devices must be a positive integer, got 0"),
    (["--gin_file", TH24, "--hardware", "tpu_v9", "--devices", "8"],
     "argument --hardware: invalid choice: 'tpu_v9'"),
    (["--hardware", "tpu_v3", "--devices", "8"], "give --gin_file FILE"),
    (["--gin_file", TH24, "--hardware", "tpu_v3", "--devices", "8",
      "--margin", "1.5"], "--margin must be in [0, 1), got 1.5"),
    (["--gin_file", TH24, "--hardware", "tpu_v3", "--devices", "3"],
     "--devices 3: tpu_v3 has no slice of 3 devices; its slices have 8, 32,"),
    (["--gin_file", TH24, "--hardware", "cpu", "--devices", "3"],
     "no mesh of 3 devices splits this model (batch:3,model:1: batch 128 is "
     "not divisible by the mesh's batch axis (3); batch:1,model:3: vocab "
     "(8192) is not divisible"),
])
def test_bad_arguments_exit_2(argv, pattern, capsys):
  status, out, err = _cli(argv, capsys)
  assert status == 2 and not out
  assert pattern in err and err.count("\n") == 1, err


def test_plan_imports_no_tensorflow(tmp_path):
  proc, heavy = _cli_util.heavy_imports(
      ["plan", "--gin_file", TH24, "--hardware", "tpu_v3", "--devices", "32",
       "--top", "1"], cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not heavy, heavy[:3]
  assert proc.stdout.count("\n") == 3  # header, rule, one row


# ---------------------------------------------------------------------------
# Pre-flight (fit_check): launch/tpu.py's warning, mtf_th train's refusal.

def _launch():
  return _cli_util.load_script(os.path.join("launch", "tpu.py"),
                               "launch_tpu_plan")


def _launch_argv(accelerator, parallelism):
  return ["--dry_run", "--name", "th24", "--zone", "z", "--project", "p",
          "--model_dir", "gs://b/th24", "--experiment", TH24,
          "--accelerator", accelerator, "--parallelism", parallelism]


def test_launch_warns_when_the_slice_is_too_small(capsys):
  tpu = _launch()
  # batch 128 data parallel on a v2-8: 16 sequences per 8 GiB core
  assert tpu.main(_launch_argv("v2-8", "batch")) == 0
  out, err = capsys.readouterr()
  err = err.splitlines()
  # train on the slice: Auto predicts for its TPU, not the CPU default
  assert '--gin_param=mtf_th.Auto.hardware = "tpu_v2"' in out.splitlines()[3]
  warnings = [l for l in err if "warning" in l]
  # the task's vocabulary (th_span_corruption: 8100 ids, padded 8192) as
  # `mtf_th plan ... --mesh_shape batch:8 --all` prices heads_parallel
  assert warnings == [
      "launch/tpu.py: warning: predicted 22.67 GiB per device for mesh "
      "batch:8 on tpu_v2, more than the 7.20 GiB usable (10% left free); it "
      "may run out of memory: see mtf_th plan --gin_file "
      "experiments/t5_heads/07_talking_heads_24_32.gin --hardware tpu_v2 "
      "--devices 8"]
  # the paper's v3-32, 4 sequences per core: no warning
  assert tpu.main(_launch_argv("v3-32", "batch")) == 0
  assert "warning" not in capsys.readouterr().err


def test_train_refuses_on_cpu_a_step_that_cannot_fit():
  import argparse  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.commands import common  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(gin_file=["models/t5_base.gin"],
                            gin_param=["batch_size = 65536"], tpu=None)
  with pytest.raises(training.ConfigError) as e:
    common.memory_check(args, training)
  line = str(e.value)
  # the fused core (on CPU unless mtf_th.core_kernel.kind = "einsum"):
  # packed T5 keeps its relative bias [b, n, m, h] and masks [b, n, m];
  # the vocabulary is the default task's, 8192 padded (vocabulary.priced_vocab)
  assert line.startswith("predicted 41664.18 GiB per device for mesh "
                         "model:1 (1 device) but this machine's ")
  assert "(10% left free): give a smaller scale file" in line
  assert line.endswith(
      "see mtf_th plan --gin_file models/t5_base.gin --hardware cpu "
      "--devices 1")
  args.gin_param = ["batch_size = 2"]
  common.memory_check(args, training)  # fits: no error
  args.tpu = "th24"  # a TPU run is launch/tpu.py's to check
  args.gin_param = ["batch_size = 65536"]
  common.memory_check(args, training)


# ---------------------------------------------------------------- Auto's pick
# strategies.Auto prices each candidate that applies with prices.predict on
# the layer's mesh and picks with planner.price_layer and planner.pick: the
# choice is computed here without TensorFlow (tests/strategies/test_auto.py checks
# that Auto.choose agrees on one case).


def _auto_pick(att, d_model, n, b, p, hardware, model=None):
  """(bytes pick, Auto's pick, fits, [Priced]) for one layer on model:p."""
  dims = prices.named_dims(att, d_model)
  mesh = prices.Layout("model:%d" % p, [(prices.BATCH, "batch")] +
                       prices.heads_parallel_layout(dims) +
                       [("core_shard", "model")])
  rings = {s: prices.predict(s, dims, mesh, b, n, d_model, (), "model", n)
           for s in strategy_table.NAMES if planner.applies(s, att, b, n, p)}
  by_bytes = min(rings, key=lambda s: (rings[s], list(rings).index(s)))
  shape = "batch:1,model:%d" % p
  priced = planner.price_layer(
      rings, att, d_model, n, n, b, p, hardware, model=model,
      mesh_shape=shape, layout=model and planner.layout(model, p))
  best, fits = planner.pick(priced, planner.usable_bytes(hardware, p))
  return by_bytes, best.name, fits, priced


def test_auto_pick_when_bytes_and_time_agree():
  # docs/sharding.md's example: talking heads 24 x 32, batch 2, length 512
  att = model_lib.make_attention("talking_heads", 24, 32, heads_k=24,
                                 heads_v=24)
  by_bytes, picked, fits, _ = _auto_pick(att, 768, 512, 2, 8, "tpu_v3")
  assert by_bytes == picked == "batch_query_split" and fits


def test_auto_pick_when_time_and_bytes_disagree():
  # logits projection, 4 heads of 64, length 64, batch 2 on model:4: heads-
  # parallel sends the fewest bytes (147456 elements against 208920) but
  # keeps the softmax of every head on every device; batch_query_split
  # splits it 4 ways and is predicted faster
  att = model_lib.make_attention("project_logits", 4, 64, heads_k=4)
  by_bytes, picked, fits, priced = _auto_pick(att, 256, 64, 2, 4, "tpu_v3")
  assert (by_bytes, picked, fits) == ("heads_parallel", "batch_query_split",
                                      True)
  seconds = {c.name: c.seconds for c in priced}
  assert seconds["batch_query_split"] < seconds["heads_parallel"]


def test_auto_prices_the_fused_core_where_the_run_uses_it(monkeypatch):
  """price_layer(kernel="fused") prices the split strategies' cores, which
  the fused core runs, without their n x m x heads tensors; heads-parallel
  talking heads with its heads split keeps the einsum core's price.  (Two
  threads, whatever this machine has: fused_grad_chunks.)"""
  monkeypatch.setattr(memory, "cpu_threads", lambda: 2)
  att = model_lib.make_attention("talking_heads", 8, 32, heads_k=8,
                                 heads_v=8)
  model = model_lib.make_model("lm", 2, 256, 1024, 512, 4, 1024, 1024,
                               dec_self=att, relative_bias=False)
  dims = prices.named_dims(att, 256)
  mesh = prices.Layout("model:2", [(prices.BATCH, "batch")] +
                       prices.heads_parallel_layout(dims) +
                       [("core_shard", "model")])
  rings = {s: prices.predict(s, dims, mesh, 4, 1024, 256, (), "model", 1024)
           for s in ("heads_parallel", "batch_split")}
  memory_of = {kernel: {c.name: c.memory for c in planner.price_layer(
      rings, att, 256, 1024, 1024, 4, 2, "cpu", model=model,
      mesh_shape="batch:1,model:2", layout=planner.layout(model, 2),
      kernel=kernel)} for kernel in ("einsum", "fused")}
  assert memory_of["fused"]["heads_parallel"] == memory_of["einsum"][
      "heads_parallel"]
  assert memory_of["fused"]["batch_split"] < memory_of["einsum"][
      "batch_split"] / 2
  # priced for the packed batches `mtf_th train` builds, as plan() does:
  # with T5's relative bias, per example [b, n, m, h] (fused_bias)
  relative = model._replace(relative_bias=True)
  priced, = planner.price_layer(
      {"batch_split": rings["batch_split"]}, att, 256, 1024, 1024, 4, 2,
      "cpu", model=relative, mesh_shape="batch:1,model:2",
      layout=planner.layout(relative, 2), kernel="fused")
  assert priced.memory == memory.predict(
      relative, "batch:1,model:2", "mtf_th_float32", "batch_split",
      layout=planner.layout(relative, 2), kernel="fused",
      packed=True)["total"]


def test_auto_pick_when_the_fastest_does_not_fit():
  # logits projection 24 x 64, length 2048, batch 2, 25 layers on a v2-8
  # as model:8: query_split is the fastest but keeps K and V whole (7.45
  # GiB per core, over the 7.20 usable); batch_query_split fits (7.198)
  att = model_lib.make_attention("project_logits", 24, 64, heads_k=24)
  model = model_lib.make_model("lm", 25, 768, 3072, 32128, 2, 2048, 2048,
                               dec_self=att, relative_bias=False)
  _, picked, fits, priced = _auto_pick(att, 768, 2048, 2, 8, "tpu_v2", model)
  by = {c.name: c for c in priced}
  assert min(priced, key=lambda c: c.seconds).name == "query_split"
  usable = planner.usable_bytes("tpu_v2", 8)
  assert by["query_split"].memory > usable >= by["batch_query_split"].memory
  assert (picked, fits) == ("batch_query_split", True)
  # nothing fits on a smaller device: the smallest, and fits is False
  best, fits = planner.pick(priced, 1 * memory.GiB)
  assert (best.name, fits) == ("batch_query_split", False)


def test_plan_ranks_with_the_same_seconds_as_auto():
  # plan()'s step time is step_time's heads-parallel step plus, per attention
  # layer, strategy_seconds(strategy) - strategy_seconds(heads_parallel)
  att = model_lib.make_attention("talking_heads", 8, 16, heads_k=8, heads_v=8)
  model = model_lib.make_model("lm", 2, 128, 256, 512, 8, 64, 64, dec_self=att,
                               relative_bias=False)
  hw = hardware_lib.get_hardware("tpu_v3")
  impl = hardware_lib.implementation("mtf_th")
  rows = {(c.mesh_shape, c.strategy): c for c in planner.plan(
      model, "tpu_v3", 4, recompute_options=(False,))}
  base = rows["batch:1,model:4", "heads_parallel"].step_s
  for s in ("batch_split", "query_split"):
    want = base + 2 * sum(
        sign * planner.strategy_seconds(
            name, prices.attention_elements(name, att, 128, 64, 64, 8, 4), att,
            128, 64, 64, 8, 4, hw, impl)[0]
        for sign, name in ((1, s), (-1, "heads_parallel")))
    assert rows["batch:1,model:4", s].step_s == pytest.approx(want)


def test_pasting_a_recompute_rows_bindings_silences_the_fit_warning():
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  model = model_lib.model_from_gin([TH24])
  cands = {(c.mesh_shape, c.recompute): c
           for c in planner.plan(model, "tpu_v3", 8)
           if c.strategy == "heads_parallel"}
  for recompute in (False, True):
    params = cands[("batch:8,model:1", recompute)].gin
    line = fit_check.warning("launch/tpu.py", [TH24], params, "tpu_v3")
    if recompute:  # the row fits: no warning (gin's short name too)
      assert line is None, line
      short = [b.replace("@mtf_th.RecomputeCore", "@RecomputeCore")
               for b in params]
      assert short != params
      assert fit_check.warning("launch/tpu.py", [TH24], short,
                               "tpu_v3") is None
    else:  # it does not, and no other strategy of this mesh fits either
      assert line.startswith("launch/tpu.py: warning: predicted "), line
      assert "mtf_th plan --gin_file %s --hardware tpu_v3" % TH24 in line
