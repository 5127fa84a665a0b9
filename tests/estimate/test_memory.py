"""memory.py: hand-computed cases, and predictions against TensorFlow's
allocator peak of one training step, and of one eval's forward pass, on
logical CPU devices (within 20%).

The measured cases are 2 of memory_measure.CONFIGS' 16 (benchmarks/memory.py
runs all, docs/costs.md records the run): one device, and a split strategy
on four devices.  The benchmark has the rest: the batch x model mesh (27 s
more here), auto_mtf's estimate (its scheduler is slow) and the recomputed
core (its measured peak moves most between processes, docs/costs.md).
RecomputeCore's gradients are checked against
the core it recomputes.
"""
import os
import re

import pytest

from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import model as model_lib

F32 = "mtf_th_float32"


def _lm(variant="multi_head", heads=2, d_k=64, d_model=128, d_ff=256,
        vocab=256, batch=2, length=8, layers=1, optimizer="adafactor", **kw):
  tied = variant in ("multi_head", "general_bilinear")
  att = model_lib.make_attention(
      variant, heads, d_k,
      heads_k=None if tied or variant == "project_weights" else heads,
      heads_v=None if tied or variant == "project_logits" else heads, **kw)
  return model_lib.make_model("lm", layers, d_model, d_ff, vocab, batch,
                              length, length, dec_self=att,
                              relative_bias=False, optimizer=optimizer)


def test_adafactor_slots_by_hand():
  # P_q, P_k, P_v, P_o [128, 64, 2]: second-largest dim 64 < 128, one full
  # slot each; wi [128, 256], wo [256, 128], embedding [256, 128]: factored
  # (row + column: 384 each); 3 norms [128]: a full slot each.
  weights, slots, largest = memory.state_elements(_lm())
  attention = 4 * 128 * 64 * 2
  assert weights == attention + 3 * 128 * 256 + 3 * 128
  assert slots == attention + 3 * (128 + 256) + 3 * 128
  assert largest == 128 * 256


def test_adam_keeps_two_slots_and_model_axis_splits():
  weights, slots, _ = memory.state_elements(_lm(optimizer="adam"))
  assert slots == 2 * weights
  # on model:2 everything but the three norms is split
  split, _, _ = memory.state_elements(_lm(), model_axis=2)
  assert split == (weights - 3 * 128) / 2 + 3 * 128


@pytest.mark.parametrize("variant,kept", [
    ("multi_head", 1), ("project_logits", 2), ("project_weights", 2),
    ("talking_heads", 3)])
def test_core_tensors_kept_per_variant(variant, kept):
  # b n m h elements, float32, per layer: W; J, W; W, U; J, W, U
  r = memory.predict(_lm(variant, heads=4, d_k=16, layers=2), "batch:1", F32)
  assert r["core"] == 2 * kept * (2 * 8 * 8 * 4) * 4


def test_heads_parallel_keeps_w_whole_for_talking_heads():
  # model:2, heads_k and heads_v split: J / 2, W whole (L = J P_l is
  # all-reduced), U / 2; a split strategy cuts all three
  model = _lm("talking_heads", heads=4, d_k=16, batch=4)
  a = 4 * 8 * 8 * 4 * 4
  assert memory.predict(model, "model:2", F32)["core"] == a / 2 + a + a / 2
  assert memory.predict(model, "model:2", F32,
                        strategy="batch_split")["core"] == 3 * a / 2
  # the layout of gin/layouts/heads_parallel.gin (heads:model) keeps J, U
  # whole and splits W
  assert memory.predict(model, "model:2", F32,
                        layout="heads:model,d_ff:model,vocab:model"
                        )["core"] == a + a / 2 + a


def test_total_is_the_sum_of_its_parts_and_bf16_halves_activations():
  model = _lm("talking_heads", heads=4, d_k=16, batch=8, length=32)
  r = memory.predict(model, "batch:2", F32)
  parts = ("weights", "gradients", "optimizer", "activations", "core",
           "temporaries")
  assert r["total"] == sum(r[p] for p in parts)
  bf16 = memory.predict(model, "batch:2", "mtf")
  assert bf16["activations"] == r["activations"] / 2
  assert bf16["weights"] == r["weights"]  # float32 masters either way


def test_recompute_keeps_no_core_tensor():
  model = _lm("talking_heads", heads=4, d_k=16, batch=8, length=32)
  assert memory.predict(model, recompute=True)["core"] == 0


def test_bad_arguments():
  with pytest.raises(ValueError, match="strategy 'nope' has no memory model"):
    memory.predict(_lm(), strategy="nope")
  with pytest.raises(ValueError, match="batch 2 is not divisible by the "
                     "mesh's batch axis"):
    memory.predict(_lm(), "batch:4")
  with pytest.raises(ValueError, match="--hardware 'tpu_v9' is unknown"):
    memory.device_memory("tpu_v9")
  assert memory.device_memory("tpu_v2") == 8 * memory.GiB


def test_fused_core_keeps_statistics_and_masks_not_j_w_u():
  """The fused core keeps, per layer, the log-sum-exp [b, h, n] and the
  causal mask [n, m] (packed: the causal and segment masks [b, n, m] and a
  relative bias [b, n, m, h]); a heads-parallel core with split projected
  heads, dynamic projections, dropout and bfloat16 keep the einsum core's
  tensors."""
  model = _lm("talking_heads", heads=4, d_k=16, batch=2, length=8, layers=2)
  fused = memory.predict(model, "batch:1", F32, kernel="fused")
  assert fused["core"] == 2 * (2 * 8 * 4 + 8 * 8) * 4
  packed = memory.predict(model, "batch:1", F32, kernel="fused",
                          packed=True)
  assert packed["core"] == 2 * (2 * 8 * 4 + 2 * 2 * 8 * 8) * 4
  relative = memory.predict(model._replace(relative_bias=True), "batch:1",
                            F32, kernel="fused", packed=True)
  assert relative["core"] == 2 * (2 * 8 * 4 + 2 * (2 + 4) * 8 * 8) * 4
  einsum = memory.predict(model, "batch:1", F32)["core"]
  assert einsum == 2 * 3 * (2 * 8 * 8 * 4) * 4
  # where it does not apply: the einsum core's
  assert memory.predict(model, "model:2", F32, kernel="fused")["core"] == \
      memory.predict(model, "model:2", F32)["core"]
  for kw in (dict(dropout=True), dict(impl="mtf")):
    args = dict(dict(impl=F32), **kw)
    assert memory.predict(model, "batch:1", kernel="fused", **args)[
        "core"] == memory.predict(model, "batch:1", **args)["core"]
  dynamic = _lm("talking_heads", heads=4, d_k=16, dynamic=("x2l",))
  assert memory.predict(dynamic, "batch:1", F32, kernel="fused")["core"] == \
      memory.predict(dynamic, "batch:1", F32)["core"]
  # a split strategy's core takes it, with the heads split
  assert memory.predict(model, "model:2", F32, strategy="batch_split",
                        kernel="fused")["core"] == 2 * (2 * 8 * 4 / 2 + 64) * 4
  with pytest.raises(ValueError, match="kernel 'flash' has no memory model"):
    memory.predict(model, kernel="flash")


def test_fused_gradient_chunks_follow_the_kernel_source():
  """fused_grad_chunks transcribes fused_core.cc's block size and chunk
  count: its constant and the lines of the rule are read from the source."""
  path = os.path.join(os.path.dirname(memory.__file__), os.pardir, "nn",
                      "fused", "fused_core.cc")
  with open(path) as f:
    source = f.read()
  constant = re.search(r"kGradBlockElements = ([\d\s*]+);", source).group(1)
  assert eval(constant) == memory.FUSED_GRAD_BLOCK_ELEMENTS  # pylint: disable=eval-used
  for line in ("bq = std::min(bq, d->N / 8);",
               "bq = std::max<int64>(8, std::min<int64>(64, bq / 8 * 8));",
               "1, std::min<int64>(d.blocks, (want + outer - 1) / outer));"):
    assert line in source
  assert memory.fused_grad_chunks(8, 1, 512, 512, 24) == 8  # 32 blocks
  assert memory.fused_grad_chunks(64, 1, 512, 512, 24) == 32
  assert memory.fused_grad_chunks(8, 8, 512, 512, 24) == 1
  assert memory.fused_grad_chunks(8, 3, 512, 512, 24) == 3
  assert memory.fused_grad_chunks(8, 1, 8, 8, 4) == 1  # one block of 8


def test_fused_gradient_prices_a_partial_dk_dv_per_extra_chunk(monkeypatch):
  """With fewer (example, group) pairs on a device than threads, the
  gradient op adds a partial dK and dV per chunk past the first: 3 more of
  each (64 x 4 x 16 elements) at 4 threads for one example of talking
  heads; none for 4 examples, or for multi-head's 4 one-head groups."""
  def temporaries(variant, batch, threads):
    model = _lm(variant, heads=4, d_k=16, batch=batch, length=64, vocab=16)
    return memory.predict(model, "batch:1", F32, kernel="fused",
                          threads=threads)["temporaries"]
  assert temporaries("talking_heads", 1, 4) - temporaries(
      "talking_heads", 1, 1) == 3 * 2 * (64 * 4 * 16) * 4
  assert temporaries("talking_heads", 4, 4) == temporaries(
      "talking_heads", 4, 1)
  assert temporaries("multi_head", 1, 4) == temporaries("multi_head", 1, 1)
  # batch_split: a device's slice holds 2 of the 4 examples, so 8 threads
  # make 4 chunks of it: 3 more of its K and V (4 x 64 x 4 x 16 / 2 each)
  split = _lm("talking_heads", heads=4, d_k=16, batch=4, length=64,
              vocab=16)
  eight, one = (memory.predict(split, "model:2", F32, "batch_split",
                               kernel="fused", threads=t)["temporaries"]
                for t in (8, 1))
  assert eight - one == 3 * 2 * (4 * 64 * 4 * 16 / 2) * 4
  monkeypatch.setattr(memory, "cpu_threads", lambda: 4)
  assert temporaries("talking_heads", 1, None) == temporaries(
      "talking_heads", 1, 4)


def test_fit_check_and_plan_take_the_fused_core_on_cpu():
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  files = ["experiments/lm_heads/06_talking_heads_8_16.gin"]
  config = gin_text.GinConfig(files)
  assert fit_check.kernel_of(config, "cpu") == "fused"
  assert fit_check.kernel_of(config, "tpu_v3") == "einsum"
  einsum = gin_text.GinConfig(files, ["mtf_th.core_kernel.kind = 'einsum'"])
  assert fit_check.kernel_of(einsum, "cpu") == "einsum"


# ---------------------------------------------------------------------------
# Measured: benchmarks/memory.py's configurations.

MEASURED = ("th_h4_n32_1", "th_h8_n32_m4_bsplit", "th_h4_n64_1_fused")


@pytest.fixture(scope="module")
def measured():
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  return {name: (m, p) for name, m, p, _ in
          memory_measure.compare(MEASURED, auto_mtf=False)}


@pytest.mark.parametrize("name", MEASURED)
def test_prediction_within_20_percent_of_allocator_peak(measured, name):
  m, p = measured[name]
  assert 0.8 <= p / m <= 1.2, (name, m, p)


@pytest.fixture(scope="module")
def measured_forward():
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  return {name: (m, p) for name, m, p, _ in
          memory_measure.compare(MEASURED, auto_mtf=False, forward=True)}


@pytest.mark.parametrize("name", MEASURED)
def test_forward_prediction_within_20_percent_of_allocator_peak(
    measured_forward, name):
  """predict_forward (what eval and decode check before they start)."""
  m, p = measured_forward[name]
  assert 0.8 <= p / m <= 1.2, (name, m, p)


def test_estimate_doctests():
  """The shape examples of the estimators' docstrings run as written."""
  import doctest  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import spec  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import costs  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  tried = 0
  for module in (memory, model_lib, step_time, costs, spec):
    result = doctest.testmod(module)
    assert result.failed == 0, module.__name__
    tried += result.attempted
  assert tried >= 17


def test_forward_takes_the_strategy_auto_may_pick_and_decode_its_caches():
  """The eval/decode pre-flight prices the smallest applicable strategy
  (heads-parallel talking heads keeps W whole; a split strategy does not),
  and a decode adds every decoder layer's K and V."""
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  model = _lm("talking_heads", heads=8, d_k=16, batch=8, length=64, layers=2)
  heads = memory.predict_forward(model, "model:4", F32)["total"]
  split = memory.predict_forward(model, "model:4", F32,
                                 strategy="batch_split")["total"]
  assert split < heads / 2
  assert fit_check.smallest_forward(model, "model:4", F32) == split
  # 2 layers x (K + V) x 8 x 64 x 8 heads x 16 / 4 devices, float32
  caches = 2 * 2 * 8 * 64 * 8 * 16 / 4 * 4
  eval_, decode = (memory.predict_forward(model, "model:4", F32,
                                          decode=d)["activations"]
                   for d in (False, True))
  assert decode == eval_ + caches


def test_eval_preflight_refuses_only_what_no_strategy_fits(monkeypatch):
  """prechecks.forward_memory on the base T5 talking heads 24 x 32 on
  model:4 with its gin's layout (heads:model): heads-parallel 7.18 GiB per
  device, batch_split 1.58 with the fused core an eval runs (2.87 with the
  einsum core, bound in the gin; the task's vocabulary,
  commands/vocabulary.py); a decode, one position at a time on the einsum
  core, 7.10 (the K and V caches, heads_k and heads_v whole).  RAM between
  the two strategies is not refused, below the smallest is; a decode needs
  its caches on top."""
  from mtf_talking_heads import commands  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.commands import prechecks  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  gin = ["experiments/t5_heads/07_talking_heads_24_32.gin"]
  params = ["mesh_shape = 'model:4'"]

  def check(usable_gib, what, extra=()):
    monkeypatch.setattr(planner, "usable_bytes",
                        lambda hardware, devices: usable_gib * memory.GiB)
    return prechecks.forward_memory("unused", gin, params + list(extra),
                                    what)

  assert check(4.0, "eval") is None  # fits batch_split, not heads-parallel
  assert check(2.5, "eval") is None  # fused: 1.58
  with pytest.raises(commands.UsageError, match=r"predicted 1\.58 GiB per "
                     r"device for eval's forward pass"):
    check(1.5, "eval")
  with pytest.raises(commands.UsageError, match=r"predicted 2\.87 GiB per "
                     r"device for eval's forward pass"):
    check(2.5, "eval", ["mtf_th.core_kernel.kind = 'einsum'"])
  with pytest.raises(commands.UsageError, match=r"predicted 7\.10 GiB"):
    check(4.0, "decode")
  assert check(7.5, "decode") is None


def test_unknown_measured_config_refused_before_any_graph():
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="unknown config th_h4_n32_l; choose "
                     "from mh_h4_n32_1, "):
    memory_measure.compare(["th_h4_n32_1", "th_h4_n32_l"])


def test_measured_layers_have_weights_of_their_own():
  """The measured LM's blocks do not share one scope's variables (unnamed
  layers of a LayerStack would): its weights are what memory.py counts."""
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  config = memory_measure.MeasureConfig(**dict(
      memory_measure.BASE, variant="talking_heads", heads=4, length=16,
      mesh_shape="batch:1"))
  graph = memory_measure.StepGraph(config, lower=False, train=False)
  names = [v.name for v in graph.mtf_graph.all_variables]
  assert len([n for n in names if n.endswith("/p_q")]) == 2, names
  elements = sum(v.shape.size for v in graph.mtf_graph.all_variables)
  predicted = memory.predict_forward(memory_measure.attention_model(config),
                                     "batch:1", F32)["weights"]
  assert elements * 4 == predicted


def test_recompute_core_gradients_equal_the_core_it_recomputes():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.measure import harness  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import layers  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  out = []
  for strategy in (strategies.HeadsParallel(), strategies.RecomputeCore()):
    layer = layers.TalkingHeadsAttention(heads_k=4, heads=4, heads_v=4,
                                         d_k=8, d_v=8, strategy=strategy)
    run = harness.Harness([layer], d_model=16, vocab=32, batch=4, length=8,
                          mesh_shape="model:2",
                          layout="heads_k:model;heads_v:model")
    out.append(run.fetch(["loss"] + ["grad:" + k for k in run.grads]))
    run.close()
  assert sorted(out[0]) == sorted(out[1])
  for name in out[0]:
    np.testing.assert_allclose(out[1][name], out[0][name], atol=1e-6)
  with pytest.raises(ValueError, match="cannot recompute a core with "
                     "custom gradients"):
    strategies.RecomputeCore(strategies.BatchSplit())


def test_every_modelled_optimizer_is_priced_and_read():
  # model.OPTIMIZERS is checked by make_model; step time and memory price
  # each one, and the gin reader maps mtf's optimizer classes onto them
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  names = set(model_lib.OPTIMIZERS)
  assert names == set(step_time.OPTIMIZER_PASSES) == set(
      memory.OPTIMIZER_SLOTS) == set(model_lib._OPTIMIZER_CLASSES.values())  # pylint: disable=protected-access
