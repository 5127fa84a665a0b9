"""Measured memory of one training step on logical CPU devices.

What memory.py predicts, measured: a decoder-only transformer (mtf's
Unitransformer, `num_layers` x [attention layer, DenseReluDense]) takes one
training step (forward, backward and the optimizer's update of every
variable, in a single session.run) on a mesh of logical CPU devices.

The measurement is TensorFlow's own allocator accounting.  A run with
``RunOptions.FULL_TRACE`` returns, for every op on every device, the
allocation records of its tracking allocator (``RunMetadata.step_stats``:
``node_stats[i].memory[j].allocation_records``: a time stamp and a byte
count, negative when the buffer is freed, whoever frees it).  Replaying the
records of one device in time order gives the bytes that device held at
every moment of the step; its maximum is the device's peak of the step.
Why this and not ``tf.config.experimental.get_memory_info``: the logical
CPU devices share one process-wide CPU allocator (one number for all of
them), whose statistics are off unless TensorFlow is told to collect them,
and a graph-mode session does not reset its peak per step; the records are
per op, so per logical device, and cover exactly one step.

The variables (weights and optimizer slots) are allocated before the step
and are not in those records; their bytes per device are read from the
lowered graph (the slice variables mtf places on each device), so

  peak of device i = its slice variables + max over the step of its live
                     step allocations.

The session runs ops one at a time (inter_op_parallelism_threads = 1), as a
TPU core runs its program; with several inter-op threads the peak depends
on the order the threads happen to pick.

Example:
  config = MeasureConfig("talking_heads", heads=4, d_k=16, num_layers=2,
                         d_model=32, d_ff=64, vocab=64, batch=8, length=32,
                         mesh_shape="model:2")
  measure(config)["peak_bytes"]  # the largest per-device peak
"""
import collections

from mtf_talking_heads.core import compat
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import core_kernel
from mtf_talking_heads.nn import optimizers

MeasureConfig = collections.namedtuple("MeasureConfig", [
    "variant", "heads", "d_k", "num_layers", "d_model", "d_ff", "vocab",
    "batch", "length", "mesh_shape", "layout", "dynamic", "groups",
    "optimizer", "strategy", "recompute", "kernel"],
    defaults=("", (), None, "adafactor", "heads_parallel", False, "einsum"))
MeasureConfig.__doc__ = """One measured configuration.

variant: a model.py/costs variant ("multi_head", "talking_heads",
"project_logits", "project_weights", "grouped_talking_heads", or
"talking_heads" with `dynamic` terms); heads = heads_k = heads_v, d_v = d_k.
mesh_shape: e.g. "batch:2;model:2"; layout: "" for comm.default_layout
plus "batch:batch", "d_ff:model", "vocab:model" on the axes the mesh has.
optimizer: "adafactor", "adam" or "lamb" (memory.py's OPTIMIZER_SLOTS).
strategy: a sharding strategy name (strategies.STRATEGIES).
recompute: the core recomputed in the backward pass (strategies.RecomputeCore,
heads_parallel only).
kernel: the attention core's kernel, mtf_th.core_kernel.kind ("einsum" or
"fused": nn/core_kernel.py; memory.predict's kernel).
"""

# The measuring session's intra-op threads, and so memory.predict's threads
# (the fused gradient op's partial dK, dV depend on them).
THREADS = 1
OPTIMIZERS = {
    "adafactor": lambda: mtf.optimize.AdafactorOptimizer(learning_rate=0.01),
    "adam": lambda: optimizers.BertAdamOptimizer(learning_rate=0.01),
    "lamb": lambda: optimizers.LambOptimizer(learning_rate=0.01),
}


def attention_model(config):
  """The model.Model (kind "lm") that memory.py predicts `config` with."""
  att = model_lib.make_attention(config.variant, config.heads, config.d_k,
                                 dynamic=config.dynamic, groups=config.groups)
  return model_lib.make_model(
      "lm", config.num_layers, config.d_model, config.d_ff, config.vocab,
      config.batch, config.length, config.length, dec_self=att,
      relative_bias=False, optimizer=config.optimizer)


def _layer(config):
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  c = comm.make_config(config.variant, config.heads, config.d_k, config.d_k,
                       config.d_model, config.length, config.batch,
                       dynamic=config.dynamic, groups=config.groups)
  strategy = strategies.make_strategy(config.strategy)
  if config.recompute:
    strategy = strategies.RecomputeCore()
  return comm.make_layer(c, strategy)


def full_layout(config, layer):
  """The layout the measurement lowers with (see MeasureConfig)."""
  if config.layout:
    return config.layout
  axes = model_lib.parse_mesh(config.mesh_shape)
  mesh = ";".join("%s:%d" % (a, s) for a, s in axes.items() if s > 1)
  rules = comm.default_layout(layer, mesh or "batch:1")
  rules = [r for r in rules.split(";") if r and (
      axes[r.split(":")[1]] > 1)]
  if axes["model"] > 1:
    rules += ["d_ff:model", "vocab:model"]
  from mtf_talking_heads.nn import strategies  # pylint: disable=g-import-not-at-top
  strategy = strategies.make_strategy(config.strategy)
  if axes["model"] > 1:
    rules += ["%s:%s" % r for r in strategy.layout_rules()]
  return ";".join(rules)


def _mesh_string(config):
  axes = model_lib.parse_mesh(config.mesh_shape)
  return ";".join("%s:%d" % (a, s) for a, s in axes.items() if s > 1)


class StepGraph(object):
  """The training step of `config`, lowered on logical CPUs, initialised.

  lower=False builds the mtf graph only (mtf_graph, mtf_loss, layout):
  what auto_mtf reads, at any size.  train=False: the forward pass of an
  eval instead (mode "eval", the loss only: no gradients, no optimizer and
  so no slot variables).
  """

  def __init__(self, config, lower=True, train=True):
    harness.parse_mtf_defaults()
    layer_list = []
    for _ in range(config.num_layers):
      layer_list += [_layer(config),
                     transformer_layers.DenseReluDense(hidden_size=config.d_ff)]
    harness.name_layers(layer_list)  # else each block reuses block 0's
    mesh_shape = _mesh_string(config)
    layout = mtf.convert_to_layout_rules(full_layout(config, layer_list[0]))
    self.layout = layout
    self.graph = tf.Graph()
    with self.graph.as_default(), core_kernel.bound(config.kernel):
      tf.set_random_seed(1)
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      batch = mtf.Dimension("batch", config.batch)
      length = mtf.Dimension("length", config.length)
      model = transformer.Unitransformer(
          layer_stack=transformer.LayerStack(layer_list),
          d_model=config.d_model, input_vocab_size=config.vocab,
          output_vocab_size=config.vocab, autoregressive=True,
          max_length=config.length, name="decoder", layout=layout,
          positional_embedding=False,
          mesh_shape=mesh_shape)
      ids = np.random.RandomState(1).randint(
          1, config.vocab, size=(config.batch, config.length))
      ids = mtf.import_tf_tensor(mesh, tf.constant(ids, tf.int32),
                                 [batch, length])
      dtype = mtf.VariableDType(tf.float32, tf.float32, tf.float32)
      _, loss = model.call_simple(inputs=ids, targets=ids, compute_loss=True,
                                  mode="train" if train else "eval",
                                  variable_dtype=dtype)
      updates = []
      if train:
        variables = mtf_graph.trainable_variables
        grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
        tf.train.get_or_create_global_step()
        updates = OPTIMIZERS[config.optimizer]().apply_grads(grads, variables)
      self.mtf_graph, self.mtf_loss = mtf_graph, loss
      self.mesh_shape = config.mesh_shape
      self.session = None
      if not lower:
        return
      impl = harness.mesh_impl(mesh_shape, layout,
                               comm.PointToPointMeshImpl)
      self.lowering = mtf.Lowering(mtf_graph, {mesh: impl}, autostack=False)
      self.loss = self.lowering.export_to_tf_tensor(loss)
      self.train_op = tf.group([self.lowering.lowered_operation(op)
                                for op in updates] or [tf.no_op()])
      self.devices = list(impl.devices)
      self.variable_bytes = self._variable_bytes(mtf_graph)
      init = tf.global_variables_initializer()
      copy = self.lowering.copy_masters_to_slices()
    config_proto = tf.ConfigProto(inter_op_parallelism_threads=1,
                                  intra_op_parallelism_threads=THREADS,
                                  device_count={"CPU": len(self.devices)})
    self.session = tf.Session(graph=self.graph, config=config_proto)
    self.session.run(init)
    self.session.run(copy)

  def _variable_bytes(self, mtf_graph):
    """{device: bytes of the slice variables (weights, slots) on it}."""
    out = collections.OrderedDict((d, 0) for d in self.devices)
    for v in mtf_graph.all_variables:
      slices = self.lowering.variables[v].laid_out_tensor.all_slices
      for device, s in zip(self.devices, slices):
        out[device] += s.shape.num_elements() * s.dtype.size
    return out

  def run_traced(self):
    """RunMetadata of one traced training step."""
    md = tf.RunMetadata()
    self.session.run(
        [self.loss, self.train_op],
        options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
        run_metadata=md)
    return md

  def close(self):
    if self.session is not None:
      self.session.close()


def _short(device):
  return "CPU:%s" % device.rsplit(":", 1)[-1]


def step_peaks(run_metadata, devices):
  """{device: (peak live bytes of the step, [(node, bytes) live then])}.

  Replays every op's allocation records of one device in time order.
  """
  wanted = {_short(d): d for d in devices}
  out = {}
  for dev_stats in run_metadata.step_stats.dev_stats:
    device = wanted.get(_short(dev_stats.device))
    if device is None:
      continue
    records = []
    for node in dev_stats.node_stats:
      for mem in node.memory:
        for r in mem.allocation_records:
          records.append((r.alloc_micros, r.alloc_bytes, node.node_name))
    records.sort(key=lambda r: (r[0], -r[1]))
    live, peak, at = 0, 0, 0
    for i, (_, nbytes, _) in enumerate(records):
      live += nbytes
      if live > peak:
        peak, at = live, i
    by_node = collections.Counter()
    for _, nbytes, name in records[:at + 1]:
      by_node[name] += nbytes
    prev = out.get(device, (0, []))
    if peak >= prev[0]:
      out[device] = (peak, [(n, b) for n, b in by_node.most_common()
                            if b > 0])
  return out


def measure(config, graph=None):
  """Measured per-device memory of one training step of `config`.

  Returns:
    dict: peak_bytes (the largest device's variables + step peak),
    devices {device: dict(variables, step_peak, peak)}, live_at_peak (the
    largest device's [(op name, bytes)] live at its peak).
  """
  own = graph is None
  graph = graph or StepGraph(config)
  try:
    graph.run_traced()  # the first run allocates the kernels' caches
    peaks = step_peaks(graph.run_traced(), graph.devices)
  finally:
    if own:
      graph.close()
  devices = collections.OrderedDict()
  for d in graph.devices:
    step, _ = peaks.get(d, (0, []))
    devices[d] = dict(variables=graph.variable_bytes[d], step_peak=step,
                      peak=graph.variable_bytes[d] + step)
  worst = max(devices, key=lambda d: devices[d]["peak"])
  return dict(peak_bytes=devices[worst]["peak"], devices=devices,
              live_at_peak=peaks.get(worst, (0, []))[1],
              layout=";".join("%s:%s" % p for p in sorted(
                  compat.layout_pairs(graph.layout))))


def load_auto_mtf(name):
  """mesh_tensorflow.auto_mtf.<name>, importable without ortools.

  auto_mtf/__init__.py imports layout_optimizer, which needs ortools (not a
  dependency of mesh-tensorflow's wheel, not pinned here); memory_estimator,
  graph_interface and scheduler do not.  When ortools is missing the
  package is registered without running its __init__, and the submodule
  imported from its folder.
  """
  import importlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  package = "mesh_tensorflow.auto_mtf"
  try:
    importlib.import_module(package)
  except ImportError:
    module = types.ModuleType(package)
    module.__path__ = [os.path.join(os.path.dirname(mtf.__file__),
                                    "auto_mtf")]
    sys.modules[package] = module
  return importlib.import_module("%s.%s" % (package, name))


def auto_mtf_peak(graph):
  """auto_mtf's memory estimate of `graph` (a StepGraph), bytes per device.

  mesh_tensorflow.auto_mtf.memory_estimator.MemoryEstimator over the step's
  mtf graph (its outputs: the loss and the update ops), the tensors sized
  per device under the graph's layout, the schedule from auto_mtf's own
  scheduler.minimize_peak_memory (as its layout optimizer does): the
  largest sum of per-device tensor sizes in memory at one operation.
  """
  estimator_module = load_auto_mtf("memory_estimator")
  scheduler = load_auto_mtf("scheduler")
  mesh_shape = mtf.Shape([mtf.Dimension(n, s) for n, s in
                          model_lib.parse_mesh(graph.mesh_shape).items()])
  estimator = estimator_module.MemoryEstimator(graph.mtf_graph, mesh_shape,
                                               [graph.mtf_loss])
  interface = estimator.get_graph_interface()
  layout = {}
  for dim, axis in compat.layout_pairs(graph.layout):
    layout[dim] = axis
  sizes = {d.name: d.size for d in mesh_shape.dims}
  schedule = scheduler.minimize_peak_memory(interface, "LIST")
  peak = 0
  for contents in interface.compute_memory_contents_under_schedule(schedule):
    peak = max(peak, sum(interface.get_tensor_size(t, layout, sizes)
                         for t in contents))
  return peak


# (name, MeasureConfig kwargs): every variant, 4-16 heads, length 16-64,
# 1-4 devices, the split strategies, the recomputed core, Adafactor and
# Adam.
CONFIGS = (
    ("mh_h4_n32_1", dict(variant="multi_head", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("th_h4_n32_1", dict(variant="talking_heads", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("pl_h4_n32_1", dict(variant="project_logits", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("pw_h4_n32_1", dict(variant="project_weights", heads=4, length=32,
                         mesh_shape="batch:1")),
    ("th_h8_n32_m2", dict(variant="talking_heads", heads=8, length=32,
                          mesh_shape="model:2")),
    ("th_h4_n64_m2", dict(variant="talking_heads", heads=4, length=64,
                          mesh_shape="model:2")),
    ("mh_h8_n64_m4", dict(variant="multi_head", heads=8, length=64,
                          mesh_shape="model:4")),
    ("th_h8_n16_b2m2", dict(variant="talking_heads", heads=8, length=16,
                            mesh_shape="batch:2,model:2")),
    ("gth_h8_g2_n32_m2", dict(variant="grouped_talking_heads", heads=8,
                              groups=2, length=32, mesh_shape="model:2")),
    ("dp_h4_n32_m2", dict(variant="talking_heads", heads=4, length=32,
                          dynamic=("x2l", "m2w"), mesh_shape="model:2")),
    ("th_h4_n32_b2", dict(variant="talking_heads", heads=4, length=32,
                          mesh_shape="batch:2")),
    ("th_h8_n32_m4_bsplit", dict(variant="talking_heads", heads=8, length=32,
                                 mesh_shape="model:4",
                                 strategy="batch_split")),
    ("th_h8_n32_m2_qsplit", dict(variant="talking_heads", heads=8, length=32,
                                 mesh_shape="model:2",
                                 strategy="query_split")),
    ("mh_h16_n64_m2_adam", dict(variant="multi_head", heads=16, length=64,
                                mesh_shape="model:2", optimizer="adam")),
    ("th_h8_n64_m2", dict(variant="talking_heads", heads=8, length=64,
                          mesh_shape="model:2")),
    ("th_h8_n64_m2_recompute", dict(variant="talking_heads", heads=8,
                                    length=64, mesh_shape="model:2",
                                    recompute=True)),
    # the fused core (nn/core_kernel.py): its statistics and mask, not J, W, U
    ("th_h4_n64_1_fused", dict(variant="talking_heads", heads=4, length=64,
                               mesh_shape="batch:1", kernel="fused")),
    ("mh_h8_n64_b2_fused", dict(variant="multi_head", heads=8, length=64,
                                mesh_shape="batch:2", kernel="fused")),
    ("th_h8_n64_m4_bsplit_fused", dict(variant="talking_heads", heads=8,
                                       length=64, mesh_shape="model:4",
                                       strategy="batch_split",
                                       kernel="fused")),
)
BASE = dict(d_k=16, num_layers=2, d_model=32, d_ff=64, vocab=128, batch=8)


def compare(names=None, auto_mtf=True, forward=False):
  """[(name, measured bytes, predicted bytes, auto_mtf bytes or None)].

  forward=True: an eval's forward pass (StepGraph(train=False)) against
  memory.predict_forward, instead of a training step against
  memory.predict.

  Raises:
    ValueError: a name of `names` that CONFIGS lacks (before any graph).
  """
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(names or ()) - {name for name, _ in CONFIGS})
  if unknown:
    raise ValueError("unknown config %s; choose from %s" % (
        ", ".join(unknown), ", ".join(name for name, _ in CONFIGS)))
  out = []
  for name, kw in CONFIGS:
    if names and name not in names:
      continue
    config = MeasureConfig(**dict(BASE, **kw))
    graph = StepGraph(config, train=not forward)
    try:
      measured = measure(config, graph)["peak_bytes"]
      # auto_mtf's graph_interface fails on the fused core's graph (a
      # KeyError freeing an optimizer tensor): einsum rows only
      estimated = (auto_mtf_peak(graph) if auto_mtf and
                   config.kernel == "einsum" else None)
    finally:
      graph.close()
    model = attention_model(config)
    if forward:
      predicted = memory.predict_forward(model, config.mesh_shape,
                                         "mtf_th_float32",
                                         strategy=config.strategy,
                                         kernel=config.kernel)["total"]
    else:
      predicted = memory.predict(model, config.mesh_shape, "mtf_th_float32",
                                 strategy=config.strategy,
                                 recompute=config.recompute,
                                 kernel=config.kernel,
                                 threads=THREADS)["total"]
    out.append((name, measured, predicted, estimated))
  return out
