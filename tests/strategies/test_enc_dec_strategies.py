"""The strategies that own a whole layer also serve encoder-decoder models.

GatheredBatchSplit places Q, K, V and Y itself (its strategies.Frame cuts the
batch, M included), BatchQuerySplit and Auto choose per call, so the
attention over the encoder output (memory length 6 != query length 8, the
encoder's padding mask with a batch dim) has its own path.  A Bitransformer
(encoder: TalkingHeadsAttention; decoder: TalkingHeadsAttention and
TalkingHeadsEncoderAttention; d_model 16, vocab 32) is trained one step on
model:4 under each strategy, from the weights of an unsharded reference
(HeadsParallel(ordered=False), the paper's layout): loss, logits and every
gradient must equal the reference's.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies
import _strategy_util as su

D_MODEL, VOCAB, LENGTH, INPUT_LENGTH = 16, 32, 8, 6
MESH = "model:4"
LAYOUT = "heads_k:model;heads_v:model;core_shard:model"
TOL = 2e-5
HEADS = dict(heads_k=4, heads=8, heads_v=4, d_k=2, d_v=3)


def _stack(classes, strategy):
  stack = []
  for i, cls in enumerate(classes):
    layer = cls(strategy=strategy, **HEADS)
    layer.set_name("layer_%03d" % i)
    stack.append(layer)
  return transformer.LayerStack(stack)


class _Run(object):
  """Loss, logits and gradients of the Bitransformer on one mesh."""

  def __init__(self, make_strategy, batch, mesh_shape="", layout=""):
    harness.parse_mtf_defaults()
    rng = np.random.RandomState(7)
    inputs = rng.randint(2, VOCAB, (batch, INPUT_LENGTH)).astype(np.int32)
    inputs[-1, -2:] = 0  # padding: the encoder mask has a batch dim
    targets = rng.randint(2, VOCAB, (batch, LENGTH)).astype(np.int32)
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(1)
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      kwargs = dict(d_model=D_MODEL, max_length=LENGTH, layout=layout,
                    mesh_shape=mesh_shape)
      encoder = transformer.Unitransformer(
          layer_stack=_stack([layers.TalkingHeadsAttention],
                             make_strategy()),
          input_vocab_size=VOCAB, output_vocab_size=None,
          autoregressive=False, name="encoder", **kwargs)
      decoder = transformer.Unitransformer(
          layer_stack=_stack([layers.TalkingHeadsAttention,
                              layers.TalkingHeadsEncoderAttention],
                             make_strategy()),
          input_vocab_size=VOCAB, output_vocab_size=VOCAB,
          autoregressive=True, name="decoder", **kwargs)
      model = transformer.Bitransformer(encoder, decoder)
      batch_dim = mtf.Dimension("batch", batch)
      ids = lambda a, n: mtf.import_tf_tensor(  # noqa: E731
          mesh, tf.constant(a), [batch_dim, mtf.Dimension("length", n)])
      logits, loss = model.call_simple(
          inputs=ids(inputs, INPUT_LENGTH), targets=ids(targets, LENGTH),
          compute_loss=True, mode="train",
          variable_dtype=mtf.VariableDType(tf.float32, tf.float32,
                                           tf.float32))
      variables = mesh.graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      lowering = mtf.Lowering(
          mesh.graph, {mesh: harness.mesh_impl(mesh_shape, layout)},
          autostack=False)
      self.names = [v.name for v in variables]
      self._variables = variables
      self._fetch = dict(
          loss=lowering.export_to_tf_tensor(loss),
          logits=lowering.export_to_tf_tensor(logits),
          **{"grad:" + v.name: lowering.export_to_tf_tensor(g)
             for v, g in zip(variables, grads)})
      self._values = {v.name: lowering.export_to_tf_tensor(v.outputs[0])
                      for v in variables}
      self._init = tf.global_variables_initializer()
      self._copy = lowering.copy_masters_to_slices()

  def run(self, values=None):
    """({name: fetched}, {variable: value}), after loading `values`."""
    with tf.Session(graph=self.graph,
                    config=su.session_config()) as session:
      session.run(self._init)
      if values is not None:
        for v in self._variables:
          v.get_master().load(values[v.name], session)
      session.run(self._copy)
      return session.run(self._fetch), session.run(self._values)


@pytest.fixture(scope="module")
def references():
  cache = {}

  def get(batch):
    if batch not in cache:
      cache[batch] = _Run(lambda: strategies.HeadsParallel(ordered=False),
                          batch).run()
    return cache[batch]
  return get


@pytest.mark.parametrize("strategy_name, batch", [
    ("batch_split_gathered", 8),   # p = 4: two sequences per shard
    ("batch_query_split", 2),      # p_b = 2 batch x p_q = 2 query shards
    ("auto", 4),                   # whatever Auto picks for each layer
])
def test_enc_dec_sharded_equals_unsharded(references, strategy_name, batch):
  want, values = references(batch)
  run = _Run(lambda: strategies.make_strategy(strategy_name), batch, MESH,
             LAYOUT)
  assert sorted(run.names) == sorted(values)
  got, _ = run.run(values)
  for key, value in want.items():
    error = np.abs(got[key] - value).max() / max(np.abs(value).max(), 1e-12)
    assert error <= TOL, (key, error)
