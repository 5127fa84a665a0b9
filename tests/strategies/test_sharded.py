"""Sharded == unsharded: forward, every gradient, and one optimizer step.

Each model is a Unitransformer with one attention layer and a DenseReluDense
(d_ff = 32), vocab 32 (padded by mtf to 128), d_model 16, batch 4, length 8.
For each model one unsharded reference (mesh "", one device) is built; every
sharded run loads the reference's initial weights and must reproduce its
loss, logits and all gradients, and after one SGD step its weights, loss and
logits.  The layout splits one dim at a time on "model" (each heads dim in
turn - P_l[heads_k, heads] cannot have both on one mesh dim - then d_ff,
then vocab); the batch:2 x model:4 mesh adds batch:batch.  d_ff and vocab
are split with the talking-heads model only: the attention variant does not
touch them, so crossing them with every variant repeated the same test.  Every layout is
first accepted by validation.check_layers, so these runs are also positive
cases of the pre-graph checks.

model:2, model:4 and model:8 lower through one code path (mtf's ring on a
1-D mesh; only the split count differs), batch:2 x model:4 through another
(the 2-D mesh): each (model, dim) runs on batch:2 x model:4 and on one 1-D
mesh (RING_MESH; each size several times), 20 sharded runs; on its two other
1-D meshes it gets the pre-flight alone (validation.check_layers accepts the
layout; no graph).  The runs are marked slow; the cases in FAST run in
`make test-fast` too.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
from mesh_tensorflow.transformer import transformer_layers
import pytest

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import validation
from _equiv_util import relative_error
import _strategy_util as su

D_MODEL, D_FF, VOCAB, PADDED_VOCAB, BATCH, LENGTH = 16, 32, 32, 128, 4, 8
TOL = 1e-5  # max |sharded - unsharded| / max |unsharded|, float32

# name -> (attention layer factory, heads dims to shard in turn)
MODELS = {
    "th": (lambda: layers.TalkingHeadsAttention(
        heads_k=16, heads=8, heads_v=24, d_k=4, d_v=4),
           ("heads_k", "heads", "heads_v")),
    "mha": (lambda: layers.MultiHeadAttention(heads=8, d_k=4, d_v=4),
            ("heads",)),
    "dynamic": (lambda: layers.DynamicProjectionsAttention(
        heads_k=8, heads=16, heads_v=8, d_k=4, d_v=4, dynamic_init_scale=1.0),
                ("heads_k", "heads", "heads_v")),
    "gbma": (lambda: layers.GeneralBilinearAttention(heads=8), ("heads",)),
}
MESHES = {
    "model2": ("model:2", ""),
    "model4": ("model:4", ""),
    "model8": ("model:8", ""),
    "batch2xmodel4": ("batch:2;model:4", "batch:batch"),
}
# dims outside attention, split with the "th" model only
OTHER_DIMS = ("d_ff", "vocab")
# representative subset for `make test-fast`: every model, each heads dim, d_ff,
# vocab, every mesh size incl. model:8 and batch x model
FAST = {
    "th-heads_k-model4", "th-heads-batch2xmodel4", "mha-heads-model8",
    "dynamic-heads_v-model2", "gbma-heads-model4", "th-d_ff-model2",
    "th-vocab-model4",
}


# (model, dim) -> the 1-D mesh it runs on (the other two: pre-flight only);
# model:8 twice (an 8-device graph costs about four 2-device ones to build)
RING_MESH = {
    ("th", "heads_k"): "model4", ("th", "heads"): "model8",
    ("th", "heads_v"): "model2", ("th", "d_ff"): "model2",
    ("th", "vocab"): "model4", ("mha", "heads"): "model8",
    ("dynamic", "heads_k"): "model4", ("dynamic", "heads"): "model2",
    ("dynamic", "heads_v"): "model2", ("gbma", "heads"): "model4",
}


def _matrix():
  """Every (model, dim, mesh), and whether it runs (else pre-flight only)."""
  for model, (_, heads_dims) in MODELS.items():
    for dim in heads_dims + (OTHER_DIMS if model == "th" else ()):
      for mesh in MESHES:
        yield (model, dim, mesh), mesh in ("batch2xmodel4",
                                           RING_MESH[model, dim])


def _cases(runs=True):
  return su.matrix_cases(_matrix(), FAST, runs)


def _layers(model):
  attention = MODELS[model][0]()
  attention.set_name("attention")
  ffn = transformer_layers.DenseReluDense(hidden_size=D_FF)
  ffn.set_name("ffn")
  return [attention, ffn]


def _harness(model, mesh_shape="", layout=""):
  return harness.Harness(
      _layers(model), d_model=D_MODEL, vocab=VOCAB, batch=BATCH,
      length=LENGTH, mesh_shape=mesh_shape, layout=layout,
      optimizer_step=True, config=su.session_config())


def _run(run):
  """Forward + gradients, one SGD step, then weights, loss and logits."""
  names = ["loss", "logits"] + ["grad:" + n for n in sorted(run.grads)]
  before = run.fetch(names)
  run.step()
  after = {"after:" + k: v for k, v in run.variable_values().items()}
  after.update({"after:" + k: v
                for k, v in run.fetch(["loss", "logits"]).items()})
  before.update(after)
  return before


class _References(object):
  """One unsharded run per model, built on first use, shared by the module."""

  def __init__(self):
    self._cache = {}

  def __call__(self, model):
    if model not in self._cache:
      run = _harness(model)
      initial = run.variable_values()
      results = _run(run)
      run.close()
      self._cache[model] = (initial, results)
    return self._cache[model]


@pytest.fixture(scope="module")
def references():
  return _References()


def _checked_layout(model, dim, mesh):
  """(mesh_shape, layout) splitting `dim` on "model", which the
  pre-graph checks accept."""
  mesh_shape, extra_rule = MESHES[mesh]
  layout = ";".join(r for r in ("%s:model" % dim, extra_rule) if r)
  validation.check_layers(
      [_layers(model)[0]], D_MODEL, mesh_shape, layout, BATCH, LENGTH,
      num_devices=8, extra_shapes=validation.transformer_tensor_shapes(
          D_MODEL, D_FF, PADDED_VOCAB, BATCH, LENGTH))
  return mesh_shape, layout


@pytest.mark.parametrize("model, dim, mesh", _cases(runs=False))
def test_preflight_accepts_the_other_1d_meshes(model, dim, mesh):
  """The same lowering as the RING_MESH run at another split count."""
  mesh_shape, layout = _checked_layout(model, dim, mesh)
  assert mesh_shape in ("model:2", "model:4", "model:8"), mesh_shape
  assert layout == "%s:model" % dim


@pytest.mark.parametrize("model, dim, mesh", _cases())
def test_sharded_equals_unsharded(references, model, dim, mesh):
  mesh_shape, layout = _checked_layout(model, dim, mesh)
  initial, want = references(model)

  run = _harness(model, mesh_shape, layout)
  try:
    assert sorted(run.variables) == sorted(initial)
    run.assign(initial)
    got = _run(run)
    counters = run.counters
  finally:
    run.close()

  # the layout really splits: sharded runs communicate
  assert any(k.startswith(("allreduce", "allconcat", "alltoall")) and v > 0
             for k, v in counters.items()), counters
  assert sorted(got) == sorted(want)
  errors = {k: relative_error(got[k], want[k]) for k in want}
  assert any(k.startswith("grad:") for k in errors)
  bad = {k: e for k, e in errors.items() if not e <= TOL}
  assert not bad, "sharded differs from unsharded: %s" % bad
  # the step changed the weights (so "after" compares something new)
  assert any(relative_error(want["after:" + k], v) > 1e-4
             for k, v in initial.items())
