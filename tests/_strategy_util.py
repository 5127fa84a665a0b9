"""Helpers shared by test_strategies, test_sharded and test_kernel_ranks.

* `MODELS`, `make_layer`: the small attention layers the strategy tests use.
* `layout_for`: the heads-parallel default layout plus a strategy's rules.
* `impl_cls`: the mesh implementation for a mesh shape (8 devices:
  comm.PointToPointMeshImpl, the same mtf graph in half the build time).
* `matrix_cases`: a sharding matrix's pytest cases (the runs, or the
  pre-flight-only checks), shared with test_sharded.
* `GreedyDecode`: greedy decoding (mtf's "first_part" + "incremental" modes)
  of a Unitransformer, lowered on a mesh; run it or inspect it.
* `session_config`: the tests' session ConfigProto (TF's graph rewrites off
  on the Eigen kernels).
* `core_kernel`: mtf_th.core_kernel.kind bound for a block (the einsum
  core's tests pin "einsum").
"""
import os

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import core_kernel as core_kernel_lib
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies

D_MODEL, VOCAB, BATCH, LENGTH = 16, 32, 8, 8

MODELS = {
    "mha": lambda s: layers.MultiHeadAttention(heads=8, d_k=2, d_v=3,
                                               strategy=s),
    "th": lambda s: layers.TalkingHeadsAttention(
        heads_k=8, heads=16, heads_v=8, d_k=2, d_v=3, strategy=s),
    "logits": lambda s: layers.ProjectLogitsAttention(
        heads_k=16, heads=8, d_k=2, d_v=3, strategy=s),
    "dynamic": lambda s: layers.DynamicProjectionsAttention(
        heads_k=8, heads=8, heads_v=16, d_k=2, d_v=3, dynamic_init_scale=1.0,
        strategy=s),
}


def matrix_cases(matrix, fast, runs=True):
  """pytest params of a sharding matrix.

  Args:
    matrix: yields ((model, strategy or dim, mesh), whether it runs).
    fast: ids of the runs `make test-fast` keeps (the others are slow).
    runs: True for the cases that run, False for the pre-flight-only ones.
  Returns:
    pytest.param(model, x, mesh) with id "model-x-mesh".
  """
  cases = []
  for key, run in matrix:
    if run != runs:
      continue
    case_id = "-".join(key)
    marks = () if case_id in fast or not runs else (pytest.mark.slow,)
    cases.append(pytest.param(*key, id=case_id, marks=marks))
  return cases


def core_kernel(kind):
  """mtf_th.core_kernel.kind = kind while the block builds graphs (then
  the binding it had); e.g. "einsum" for tests of the einsum core's own
  tensors, slices and counts."""
  return core_kernel_lib.bound(kind)


def session_config():
  """ConfigProto for the tests' sessions: TF's graph rewrites off on Eigen.

  This process's logical CPUs (compat.split_cpu), with grappler's
  meta-optimizer disabled and the classic graph optimizer at L0 (no
  constant folding, no common subexpressions): the ops run as lowered, and
  the first run of a set of fetches costs about a sixth of the CPU
  (measured on the 8-device dynamic-projections graph of test_sharded,
  21166 ops: 17 -> 2.9 CPU-s; the same loss to the last bit).  Under
  TF_ENABLE_ONEDNN_OPTS=1 (`make test-onednn`) the rewrites stay on, as in
  training: grappler's remapper is what fuses ops into oneDNN kernels.
  (oneDNN's Softmax refuses a 6-dim input with and without the rewrites,
  checked on TF 2.15.1.)

  Returns:
    a tf.ConfigProto.
  """
  config = compat.default_session_config()  # with the logical devices
  if os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "1":
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.OptimizerOptions.L0
  return config


def make_layer(model, strategy):
  """The layer MODELS[model] with `strategy`, named "attention"."""
  layer = MODELS[model](strategy)
  layer.set_name("attention")
  return layer


def impl_cls(mesh_shape):
  """PointToPointMeshImpl for 8 devices, else None (mtf's default ring)."""
  size = strategies.MeshLayout(mesh_shape, "").mesh_shape.size
  return comm.PointToPointMeshImpl if size == 8 else None


def layout_for(layer, mesh_shape, strategy):
  """comm.default_layout of `layer` plus the rules `strategy` needs."""
  return comm.full_layout(
      comm.default_layout(layer, mesh_shape),
      strategy.layout_rules())


class GreedyDecode(object):
  """Greedy decoding (first_part + incremental) of a model of `layers`.

  The graph is built and lowered in __init__ (no session); `run` decodes.
  With one layer, its first_part output is unused (only the caches are), so
  TF prunes that core when it runs; a second layer keeps the first's.

  Attributes:
    graph: the tf.Graph; lowering: the mtf.Lowering.
  """

  def __init__(self, layers_, mesh_shape, layout, mesh_impl_cls=None,
               batch=BATCH):
    harness.parse_mtf_defaults()
    layout = mtf.convert_to_layout_rules(layout)  # one object, as t5 shares
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(1)
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      model = transformer.Unitransformer(
          layer_stack=transformer.LayerStack(layers_), d_model=D_MODEL,
          input_vocab_size=VOCAB, output_vocab_size=VOCAB,
          autoregressive=True, max_length=LENGTH, layout=layout,
          mesh_shape=mesh_shape)
      prefix = np.zeros((batch, LENGTH), np.int32)
      prefix[:, :2] = np.random.RandomState(0).randint(1, VOCAB, (batch, 2))
      ids = mtf.import_tf_tensor(
          mesh, tf.constant(prefix),
          [mtf.Dimension("batch", batch), mtf.Dimension("length", LENGTH)])
      decoded = model.sample_autoregressive(
          ids, temperature=0.0, stop_at_token=10 * VOCAB,
          variable_dtype=mtf.VariableDType(tf.float32, tf.float32,
                                           tf.float32))
      self.lowering = mtf.Lowering(
          mtf_graph,
          {mesh: harness.mesh_impl(mesh_shape, layout, mesh_impl_cls)},
          autostack=False)
      self._decoded = self.lowering.export_to_tf_tensor(decoded)
      self._variables = {v.name: v for v in mtf_graph.trainable_variables}
      self._exported = {n: self.lowering.export_to_tf_tensor(v.outputs[0])
                        for n, v in self._variables.items()}
      self._init_op = tf.global_variables_initializer()
      self._copy_op = self.lowering.copy_masters_to_slices()

  def run(self, values=None):
    """Decodes; returns (decoded ids, {variable name: value}).

    Args:
      values: optional {variable name: ndarray} to decode with (else the
        random initialisation).
    """
    with self.graph.as_default(), tf.Session(
        graph=self.graph, config=session_config()) as session:
      session.run(self._init_op)
      for name, v in self._variables.items():
        if values is not None:
          v.get_master().load(values[name], session)
      session.run(self._copy_op)
      return session.run(self._decoded), session.run(self._exported)
