"""Build, lower and run small mtf transformer graphs on a mesh of CPU devices.

Shared by the tests (sharded == unsharded, decode == teacher-forced), the
`mtf_th comm` accounting and the benchmarks, so that every measurement uses
the same unit: a Unitransformer over the given layers, forward + backward
(+ optionally one optimizer step), lowered with PlacementMeshImpl.

Example:
  run = harness.Harness(layers=[TalkingHeadsAttention(heads_k=4, ...)],
                        d_model=16, vocab=32, batch=4, length=8,
                        mesh_shape="model:4", layout="heads:model")
  out = run.fetch(["loss", "logits"] + run.grad_names)
"""

import gin
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.nn import models

def parse_mtf_defaults():
  """Parses mtf's defaults.gin once (LayerStack sublayers etc.), no dropout."""
  if not getattr(parse_mtf_defaults, "done", False):
    with gin.unlock_config():
      gin.parse_config_file(models.MTF_DEFAULTS_GIN)
      gin.parse_config("dropout_rate = 0.0")
    parse_mtf_defaults.done = True


def mesh_impl(mesh_shape, layout, impl_cls=None, devices=None):
  """PlacementMeshImpl (or subclass `impl_cls`) on logical CPUs for `mesh_shape`.

  devices: the mesh's devices in slot order (default: this process's
  logical CPUs), e.g. cluster.device_names(2, 1) for two servers.
  """
  shape = mtf.convert_to_shape(mesh_shape)
  devices = devices or compat.split_cpu(max(shape.size, 1))
  return (impl_cls or mtf.placement_mesh_impl.PlacementMeshImpl)(
      shape, mtf.convert_to_layout_rules(layout), devices[:max(shape.size, 1)])


def _to_export_dtype(x):
  """x cast to float32 for export, unless it is float64 (kept for precision)."""
  return x if x.dtype == tf.float64 else mtf.cast(x, tf.float32)


def name_layers(layers):
  """Names the layers layer_000, layer_001, ... in place; returns them
  (mtf's LayerStack scopes variables by name: check_names)."""
  for i, layer in enumerate(layers):
    layer.set_name("layer_%03d" % i)
  return layers


def check_names(layers):
  """Refuses two layers of one stack that would share weights: two of one
  name, or two unnamed layers of one class.

  mtf's LayerStack scopes each layer's variables by the layer's name, so two
  unnamed layers of one class would share one set of weights (the fault that
  once made memory_measure's 2-layer models 1-layer models with two passes).

  Raises:
    ValueError: naming the two positions and the fix.
  """
  seen, names = {}, {}
  for i, layer in enumerate(layers):
    name = getattr(layer, "name", None)
    if name:
      if name in names:
        raise ValueError(
            "layers[%d] and layers[%d] are both named %r: they would share "
            "one set of weights; give each layer its own name"
            % (names[name], i, name))
      names[name] = i
      continue
    kind = type(layer).__name__
    if kind in seen:
      raise ValueError(
          "layers[%d] and layers[%d] are both unnamed %s: they would share "
          "one set of weights; name them (layer.set_name('layer_%03d'))"
          % (seen[kind], i, kind, i))
    seen[kind] = i


class Harness(object):
  """A Unitransformer over `layers`, lowered on `mesh_shape` with `layout`.

  devices, target, config: the mesh's devices in slot order and the
  session's target and ConfigProto (default: this process's logical CPUs,
  an in-process session), e.g. a cluster of `mtf_th server` tasks.
  encoder_layers: layers of an encoder; then the model is an mtf
  Bitransformer (encoder over the ids, `layers` the decoder, which needs
  encoder-decoder attention among them) trained to copy the ids.
  positional_embedding: False for models with relative position biases.

  Attributes after construction:
    graph: the tf.Graph; lowering: the mtf.Lowering (counters etc.);
    outputs: {"loss", "logits"} tf tensors; grads: {variable name: tf tensor};
    train_op: one SGD step (if optimizer_step=True).
  """

  def __init__(self, layers, d_model=16, vocab=32, batch=4, length=8,
               mesh_shape="", layout="", autoregressive=True,
               activation_dtype=tf.float32, master_dtype=tf.float32,
               seed=1234, optimizer_step=False, learning_rate=0.1,
               inputs=None, name="decoder", run=True, mesh_impl_cls=None,
               devices=None, target="", config=None, encoder_layers=None,
               positional_embedding=True):
    parse_mtf_defaults()
    check_names(layers)
    check_names(encoder_layers or [])
    # one LayoutRules for the model and the mesh implementation, as t5's
    # utils.run does (strategies.Auto may add its rule while the model builds)
    layout = mtf.convert_to_layout_rules(layout)
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(seed)
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      self.batch_dim = mtf.Dimension("batch", batch)
      self.length_dim = mtf.Dimension("length", length)
      self.model = transformer.Unitransformer(
          layer_stack=transformer.LayerStack(layers), d_model=d_model,
          input_vocab_size=vocab, output_vocab_size=vocab,
          autoregressive=autoregressive, max_length=length, name=name,
          positional_embedding=positional_embedding,
          layout=layout, mesh_shape=mesh_shape)  # read by sharding strategies
      if encoder_layers is not None:  # a Bitransformer reading the ids
        self.model = transformer.Bitransformer(
            transformer.Unitransformer(
                layer_stack=transformer.LayerStack(encoder_layers),
                d_model=d_model, input_vocab_size=vocab,
                output_vocab_size=None, autoregressive=False,
                max_length=length, name="encoder",
                positional_embedding=positional_embedding, layout=layout,
                mesh_shape=mesh_shape),
            self.model)
      if inputs is None:
        inputs = np.random.RandomState(seed).randint(1, vocab,
                                                     size=(batch, length))
      self.inputs = np.asarray(inputs, np.int32)
      ids = mtf.import_tf_tensor(
          mesh, tf.constant(self.inputs), [self.batch_dim, self.length_dim])
      variable_dtype = mtf.VariableDType(master_dtype, master_dtype,
                                         activation_dtype)
      logits, loss = self.model.call_simple(
          inputs=ids, targets=ids, compute_loss=True, mode="train",
          variable_dtype=variable_dtype)  # encoder-decoder: ids -> ids
      variables = mtf_graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      update_ops = []
      if optimizer_step:
        update_ops = mtf.optimize.SgdOptimizer(learning_rate).apply_grads(
            grads, variables)
      # exported as float32 (float64 stays float64); the casts are mtf ops,
      # so they must exist before lowering
      exported = {"loss": _to_export_dtype(loss),
                  "logits": _to_export_dtype(logits)}
      exported_grads = [_to_export_dtype(g) for g in grads]
      # autostack=False keeps one master per variable, so assign() works
      self.lowering = mtf.Lowering(
          mtf_graph, {mesh: mesh_impl(mesh_shape, layout, mesh_impl_cls,
                                      devices)},
          autostack=False)
      self.outputs = {name: self.lowering.export_to_tf_tensor(t)
                      for name, t in exported.items()}
      self.grads = {v.name: self.lowering.export_to_tf_tensor(g)
                    for v, g in zip(variables, exported_grads)}
      self.variables = {v.name: self.lowering.export_to_tf_tensor(
          v.outputs[0]) for v in variables}
      self.train_op = (tf.group([self.lowering.lowered_operation(op)
                                 for op in update_ops])
                       if update_ops else None)
      # the per-device gradient tensors the update ops consume (see step())
      self._grad_slices = sorted(
          {t for g in grads if g is not None
           for t in self.lowering.tensors[g].to_laid_out_tensor().all_slices},
          key=lambda t: t.name) if update_ops else []
      self._mtf_variables = variables
      self.init_op = tf.global_variables_initializer()
      self.copy_op = self.lowering.copy_masters_to_slices()
      self.session = None
      if run:  # run=False: lowering only (accounting of big configurations)
        self.session = tf.Session(target, graph=self.graph, config=config)
        self.session.run(self.init_op)
        self.session.run(self.copy_op)

  @property
  def counters(self):
    """mtf's exact per-collective element counts, summed per counter name.

    Lowering.counters is a list of (name, count) with repeated names.
    """
    totals = {}
    for name, count in self.lowering.counters:
      totals[name] = totals.get(name, 0) + count
    return totals

  def variable_values(self):
    return self.session.run(self.variables)

  def assign(self, values):
    """Sets variables {name: ndarray} (names as in self.variables)."""
    with self.graph.as_default():
      for v in self._mtf_variables:
        if v.name in values:
          v.get_master().load(values[v.name], self.session)
      self.session.run(self.copy_op)

  def fetch(self, names=("loss", "logits")):
    """Runs and returns {name: value} for output or gradient names."""
    table = dict(self.outputs)
    table.update({"grad:" + k: v for k, v in self.grads.items()})
    return self.session.run({n: table[n] for n in names})

  def step(self):
    """Runs one optimizer step (optimizer_step=True).

    The gradients are computed in one session.run and fed to the update ops
    in a second: in a single run nothing orders an update of one weight
    before or after the gradient ops that read it (a TF1 variable read
    aliases its buffer), so the step differed from run to run (3.7e-5
    relative on a weight after one SGD step).
    """
    grads = self.session.run(self._grad_slices)
    self.session.run(self.train_op,
                     feed_dict=dict(zip(self._grad_slices, grads)))

  def close(self):
    if self.session is not None:
      self.session.close()
