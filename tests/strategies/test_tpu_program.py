"""The TPU program of every strategy and variant, built as `--tpu` builds it.

On a TPU slice, mtf's utils.run (which `mtf_th train --tpu` runs) gives
TPUEstimator the model function of mtf's utils.tpu_estimator_model_fn;
TPUEstimator calls it inside the TPU computation (tpu.replicate over the
slice's cores) and it lowers the mtf graph with SimdMeshImpl: one program
for every core, TPU collectives.  These tests call that model function the
same way on CPU (graph construction only: nothing runs) for a TPU v4-8 (2 x 2
chips of one core, one host: the slice of docs/tpu.md with 4 devices) made
of a tf.tpu Topology and DeviceAssignment; the TPUContext TPUEstimator
passes is a stand-in with the four fields the model function reads.  The
variables are seeded by name around the call, as the package's estimator
does (nn/init_seeds.py).

Every program must hold (check_tpu_program): a SimdMeshImpl lowering; TPU
collectives only, one AllToAll per all-to-all mtf counted, one
CollectivePermute per shift, a CrossReplicaSum iff mtf counted an all-reduce
or all-concat (the decode loop's ops are counted in its while body); no op
inside the TPU computation on a CPU device (PlacementMeshImpl's placement)
and no host-only op (py_func, Print); every lowered tensor's per-core slice
(J, L, W, U, Q, K, V, O, the weights, their gradients ...) of the shape its
layout gives.

1. Training (loss, gradients, SGD update; autostack as gin/mtf_th.gin sets
   it; mtf's bfloat16 activations) of a one-layer Unitransformer, for every
   strategy of estimate/strategy_table.py and Auto times every variant of
   core/spec.py's VARIANT_TABLE (general bilinear has no strategy: heads
   on the model axis, on both meshes), layout: measure/comm.py's
   heads-parallel default plus the strategy's rules.  Each distinct code
   path once: a pair is built on model:4 or on batch:2,model:2 by turns
   (MESHES[(i + j) % 2] for strategy i and variant j), so every strategy
   and every variant is built on both meshes (a graph costs about 0.8 s of
   CPU to build; both meshes for every pair would add 35 s).  A pair the pre-flight refuses
   (Strategy.check, no graph: a split of grouped talking heads) must be
   refused with that line when the program is built.  For the talking-heads
   row of every strategy, the counters equal those of the same mtf graph
   lowered with PlacementMeshImpl (what `mtf_th comm` and the CPU tests
   measure): the same communication, element for element.
2. Decoding (PREDICT: Bitransformer.decode, the incremental steps in a
   tf.while_loop inside the TPU computation) of a Bitransformer with
   encoder, decoder and encoder-decoder attention: talking heads under
   every strategy, and general bilinear (its own cache of M).
3. The whole program of `mtf_th train --tpu` as launch/tpu.py configures a
   v4-8 (--parallelism model: model:4, bfloat16 activations, Auto for the
   TPU; experiments/encdec_heads talking heads + models/encdec_tiny.gin,
   Adafactor): launch/tpu.py's gin through training.parse_gin and
   training.preflight (its pre-flight), then training.estimator.run with
   the TPU's grpc:// address (the package's TPU path) builds the
   TPUEstimator and utils.run's model function (captured); its TRAIN and
   PREDICT programs pass the checks, its TRAIN program communicates
   exactly what the CPU program does (`mtf_th train` without --tpu: the same
   path, PlacementMeshImpl on logical CPU devices), and 8 of its 16
   all-to-alls send float32 gradients rounded to bfloat16 (SimdMeshImpl
   does every all-to-all in bfloat16; docs/tpu.md).
"""
import collections
import os
import re

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import utils as mtf_utils
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.python.tpu import device_assignment as device_assignment_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import topology as topology_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu  # pylint: disable=g-direct-tensorflow-import

from mtf_talking_heads.core import spec
from mtf_talking_heads.estimate import strategy_table
from mtf_talking_heads.measure import comm
from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import init_seeds
from mtf_talking_heads.nn import layers
from mtf_talking_heads.nn import strategies
from mtf_talking_heads.training import estimator as estimator_lib
import _cli_util

D_MODEL, VOCAB, BATCH, LENGTH = 16, 32, 8, 8
MESHES = ("model:4", "batch:2,model:2")
STRATEGIES = strategy_table.NAMES + (strategy_table.AUTO,)
TRAIN, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.PREDICT
TPU_COLLECTIVES = ("CrossReplicaSum", "AllToAll", "CollectivePermute")
HOST_ONLY = ("PyFunc", "PyFuncStateless", "EagerPyFunc", "Print", "PrintV2",
             "StringFormat")
TPU_ADDRESS = "grpc://10.0.0.2:8470"  # never contacted


# ------------------------------------------------------------------ the slice
def v4_8_assignment():
  """DeviceAssignment of a TPU v4-8: 2 x 2 chips of one core, one host."""
  coordinates = [[x, y, 0, 0] for y in range(2) for x in range(2)]
  topology = topology_lib.Topology(
      mesh_shape=[2, 2, 1, 1],
      device_coordinates=np.array([coordinates], np.int32))
  return device_assignment_lib.device_assignment(
      topology, computation_shape=[1, 1, 1, 1], num_replicas=4)


class _TPUContext(object):
  """What mtf's model function reads of TPUEstimator's params["context"]."""

  num_hosts = 1

  def __init__(self, assignment):
    self.device_assignment = assignment
    self.num_replicas = assignment.num_replicas

  def tpu_host_placement_function(self, host_id):
    return "/job:worker/replica:0/task:%d/device:CPU:0" % host_id


Program = collections.namedtuple("Program", ["graph", "lowering", "outputs"])


def features(model_type, mode, batch=BATCH, lengths=None, vocab=VOCAB,
             packed=False):
  """The features TPUEstimator's infeed hands the model function: ids, and
  (packed) the segment ids and positions of packed examples."""
  lengths = lengths or {"inputs": LENGTH, "targets": LENGTH}
  rng = np.random.RandomState(0)
  keys = (["inputs"] if mode == PREDICT else
          ["inputs", "targets"] if model_type == "bitransformer" else
          ["targets"])
  out = {}
  for key in keys:
    shape = (batch, lengths[key])
    out[key] = tf.constant(rng.randint(1, vocab, shape), tf.int32)
    if packed:
      out[key + "_segmentation"] = tf.ones(shape, tf.int32)
      out[key + "_position"] = tf.constant(
          np.tile(np.arange(shape[1], dtype=np.int32), (batch, 1)))
  return out


def build_program(model_fn, mode, features_fn, use_tpu=True):
  """Calls `model_fn` as TPUEstimator does on a v4-8 (use_tpu=False: as
  Estimator does on CPU); returns Program(graph, lowering, outputs)."""
  graph = tf.Graph()
  built = {}

  def call():
    params = {"context": _TPUContext(built["assignment"])} if use_tpu else {}
    estimator_spec = model_fn(features_fn(mode), None, mode, params=params)
    hooks = (estimator_spec.prediction_hooks if mode == PREDICT else
             estimator_spec.training_hooks or
             estimator_spec.training_chief_hooks)
    built["lowering"], = [h._lowering for h in hooks  # pylint: disable=protected-access
                          if isinstance(h, mtf.MtfRestoreHook)]
    if mode == PREDICT:
      return [estimator_spec.predictions["outputs"]]
    with tf.control_dependencies([estimator_spec.train_op]):
      return [tf.identity(estimator_spec.loss)]

  with graph.as_default(), init_seeds.name_seeded_variables():
    tf.set_random_seed(1234)
    tf.train.create_global_step()
    if use_tpu:
      built["assignment"] = v4_8_assignment()
      outputs = tpu.replicate(call, inputs=[[]] * 4,
                              device_assignment=built["assignment"])
    else:
      outputs = call()
  return Program(graph, built["lowering"], outputs)


# --------------------------------------------------------------- the checks
def counter_totals(counters):
  """{counter name: summed elements}: communication and multiplies."""
  totals = collections.Counter()
  for key, value in counters:
    if _kind(key) in ("allreduce", "alltoall", "allconcat", "shift",
                      "einsum", "einsum_unique"):
      totals[key] += value
  return dict(totals)


def _kind(key):
  return key.split("/")[0].split("[")[0]


def _entries(counters, kind):
  return sum(1 for key, _ in counters if _kind(key) == kind)


def program_nodes(graph):
  """NodeDefs of `graph` and of the functions it calls (the body of a
  tf.while_loop: the decode loop's ops live there)."""
  graph_def = graph.as_graph_def()
  return list(graph_def.node), [node for f in graph_def.library.function
                                for node in f.node_def]


def check_tpu_program(program):
  """Asserts what makes `program` a TPU program; returns its collectives.

  Returns:
    {TPU collective op type: count}, e.g. {"CrossReplicaSum": 4}.
  """
  lowering = program.lowering
  assert {type(impl) for impl in lowering.mesh_to_impl.values()} == {
      mtf.simd_mesh_impl.SimdMeshImpl}
  top, in_functions = program_nodes(program.graph)
  inside = [n for n in top if "_tpu_replicate" in n.attr] + in_functions
  assert len(inside) > 100
  assert [n.name for n in inside if "CPU" in n.device] == []
  assert [n.name for n in top + in_functions if n.op in HOST_ONLY] == []
  ops = collections.Counter(n.op for n in top + in_functions)
  counters = lowering.counters
  assert ops["AllToAll"] == _entries(counters, "alltoall")
  assert ops["CollectivePermute"] == _entries(counters, "shift")
  assert bool(ops["CrossReplicaSum"]) == bool(
      _entries(counters, "allreduce") + _entries(counters, "allconcat"))
  wrong = {}
  for t, laid in lowering.tensors.items():
    if isinstance(laid, mtf.LazyAllreduceSum):  # not reduced: do not build it
      laid = laid.laid_out_input
    got = laid.to_laid_out_tensor().one_slice.shape.as_list()
    want = lowering.mesh_impl(t).slice_shape(t.shape)
    if got != want:
      wrong[t.name] = (got, want)
  assert wrong == {}
  return {t: ops[t] for t in TPU_COLLECTIVES if ops[t]}


def placement_counters(program):
  """Counters of the program's mtf graph lowered with PlacementMeshImpl
  (measure/comm.py's point-to-point all-to-all: the same counters)."""
  (mesh, impl), = program.lowering.mesh_to_impl.items()
  with program.graph.as_default():
    cpu = comm.PointToPointMeshImpl(impl.shape, impl.layout_rules,
                                    [""] * impl.size)
    return mtf.Lowering(program.lowering.graph, {mesh: cpu},
                        autostack=False).counters


# ------------------------------------------------------ the one-layer models
def variant_spec(variant):
  """Tiny heads of `variant`; h_k, h_v != h where it has P_l, P_w."""
  row = spec.VARIANT[variant]
  kwargs = dict(heads=4, d_k=2, d_v=2)
  if row.project_logits:
    kwargs["heads_k"] = 8
  if row.project_weights:
    kwargs["heads_v"] = 8
  if variant == spec.DYNAMIC:
    kwargs["dynamic"] = spec.DYNAMIC_TERMS
  if variant == spec.GROUPED:
    kwargs.update(heads=8, heads_k=8, heads_v=8, groups=4)
  return spec.make_spec(variant, **kwargs)


def takes_strategy(variant):
  return issubclass(layers.VARIANTS[variant][0], layers.AttentionLayer)


def make_layer(variant, strategy, enc_dec=False):
  kwargs = {} if strategy is None else dict(
      strategy=strategies.make_strategy(strategy))
  return layers.layer_for_spec(variant_spec(variant), enc_dec=enc_dec,
                               **kwargs)


def layout_of(variant, strategy, mesh_shape):
  """measure/comm.py's heads-parallel layout plus the strategy's rules."""
  if strategy is None:
    return ("batch:batch;" if "batch" in mesh_shape else "") + "heads:model"
  layout = comm.default_layout(make_layer(variant, strategy), mesh_shape)
  return comm.full_layout(
      layout, strategies.make_strategy(strategy).layout_rules())


def refusal(variant, strategy, mesh_shape):
  """The pre-flight's line (Strategy.check, no graph), or None."""
  if strategy is None:
    return None
  try:
    strategies.make_strategy(strategy).check(
        make_layer(variant, strategy).dims, mesh_shape,
        layout_of(variant, strategy, mesh_shape), BATCH, LENGTH)
  except ValueError as e:
    return str(e)
  return None


def unit_model_fn(variant, strategy, mesh_shape, model_dir, decoder=False):
  """mtf's TPU model function of a one-layer Unitransformer ("lm"), or
  (decoder=True) of a Bitransformer: encoder self-attention, decoder self-
  and encoder-decoder attention, all of `variant` with `strategy`."""
  harness.parse_mtf_defaults()
  layout = mtf.convert_to_layout_rules(layout_of(variant, strategy,
                                                 mesh_shape))
  shape = mtf.convert_to_shape(mesh_shape)

  def unit(layer_list, name, autoregressive, output_vocab_size=VOCAB):
    return transformer.Unitransformer(
        layer_stack=transformer.LayerStack(harness.name_layers(layer_list)),
        d_model=D_MODEL, input_vocab_size=VOCAB,
        output_vocab_size=output_vocab_size, autoregressive=autoregressive,
        max_length=LENGTH, name=name, layout=layout, mesh_shape=shape)

  if decoder:
    model = transformer.Bitransformer(
        unit([make_layer(variant, strategy)], "encoder", False, None),
        unit([make_layer(variant, strategy),
              make_layer(variant, strategy, enc_dec=True)], "decoder", True))
  else:
    model = unit([make_layer(variant, strategy)], "decoder", True)
  return mtf_utils.tpu_estimator_model_fn(
      model_type="bitransformer" if decoder else "lm",
      transformer_model=model, vocabulary=None, model_dir=model_dir,
      use_tpu=True, mesh_shape=shape, layout_rules=layout,
      batch_size=BATCH, sequence_length={"inputs": LENGTH, "targets": LENGTH},
      autostack=True, keep_checkpoint_max=1, save_checkpoints_steps=100,
      learning_rate_schedule=0.01, optimizer=mtf.optimize.SgdOptimizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tpu_program"))


# ---------------------------------------------------------------- 1. train
def _train_cases():
  """Every (variant, strategy) once, on MESHES[(i + j) % 2]; a variant
  without strategies on both."""
  for j, variant in enumerate(spec.VARIANTS):
    pairs = ([(strategy, MESHES[(i + j) % 2])
              for i, strategy in enumerate(STRATEGIES)]
             if takes_strategy(variant) else [(None, m) for m in MESHES])
    for strategy, mesh in pairs:
      yield pytest.param(variant, strategy, mesh, id="%s-%s-%s" % (
          variant, strategy or "no_strategy", mesh.replace(",", "x")))


def test_cases_cover_both_meshes():
  """Each strategy and each variant is built on both meshes."""
  built = collections.defaultdict(set)
  for case in _train_cases():
    variant, strategy, mesh = case.values
    built[variant].add(mesh)
    built[strategy or variant].add(mesh)
  assert set(built) == set(spec.VARIANTS) | set(STRATEGIES)
  assert {k: v for k, v in built.items() if v != set(MESHES)} == {}


@pytest.mark.parametrize("variant,strategy,mesh", list(_train_cases()))
def test_training_program(variant, strategy, mesh, model_dir):
  model_fn = unit_model_fn(variant, strategy, mesh, model_dir)
  features_fn = lambda mode: features("lm", mode)  # noqa: E731
  refused = refusal(variant, strategy, mesh)
  if refused is not None:
    with pytest.raises(ValueError, match="^" + re.escape(refused)):
      build_program(model_fn, TRAIN, features_fn)
    return
  program = build_program(model_fn, TRAIN, features_fn)
  collectives = check_tpu_program(program)
  assert program.outputs[0][0].shape.as_list() == []  # each core's loss
  assert collectives["CrossReplicaSum"] >= 1  # heads or batch on an axis
  if variant == spec.TALKING_HEADS:
    assert counter_totals(program.lowering.counters) == counter_totals(
        placement_counters(program))


# --------------------------------------------------------------- 2. decode
def _decode_cases():
  for i, strategy in enumerate(STRATEGIES):
    yield pytest.param(spec.TALKING_HEADS, strategy, MESHES[i % 2],
                       id="talking_heads-" + strategy)
  for variant in spec.VARIANTS:
    if not takes_strategy(variant):
      yield pytest.param(variant, None, MESHES[0], id=variant)


@pytest.mark.parametrize("variant,strategy,mesh", list(_decode_cases()))
def test_decoding_program(variant, strategy, mesh, model_dir):
  model_fn = unit_model_fn(variant, strategy, mesh, model_dir, decoder=True)
  program = build_program(model_fn, PREDICT,
                          lambda mode: features("bitransformer", mode))
  check_tpu_program(program)
  loops = [op for op in program.graph.get_operations() if op.type == "While"]
  assert len(loops) == 1 and "_tpu_replicate" in loops[0].node_def.attr
  assert program.outputs[0][0].shape.as_list() == [BATCH, LENGTH]


# -------------------------------------------------------- 3. the whole run
@pytest.fixture(scope="module")
def launch_tpu():
  return _cli_util.load_script(os.path.join("launch", "tpu.py"),
                               "launch_tpu_program")


def _captured_model_fn(monkeypatch, launch_tpu, model_dir, tpu_address):
  """launch/tpu.py's v4-8 configuration through training.estimator.run:
  (the model function utils.run built, its arguments, the estimator)."""
  args = launch_tpu._build_parser().parse_args([  # pylint: disable=protected-access
      "--dry_run", "--name", "th", "--zone", "z", "--project", "p",
      "--accelerator", "v4-8", "--parallelism", "model",
      "--model_dir", "gs://b/th",
      "--experiment", "experiments/encdec_heads/06_talking_heads_8_16.gin",
      "--gin_file", "models/encdec_tiny.gin"])
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  training.parse_gin(*launch_tpu.gin_args(args))  # launch/tpu.py's pre-flight
  settings, _ = training.preflight(tpu=tpu_address)
  captured = {}
  real = mtf_utils.tpu_estimator_model_fn

  def capture(**kwargs):
    captured["kwargs"] = kwargs
    captured["model_fn"] = real(**kwargs)
    return captured["model_fn"]

  monkeypatch.setattr(mtf_utils, "tpu_estimator_model_fn", capture)
  estimator_lib.run(model_dir, tpu_address, None, None,
                    lambda estimator, *a, **k: captured.update(
                        estimator=estimator), settings)
  monkeypatch.undo()
  return captured


def test_whole_program_of_train_tpu(monkeypatch, launch_tpu, model_dir):
  tpu_run = _captured_model_fn(monkeypatch, launch_tpu, model_dir,
                               TPU_ADDRESS)
  kwargs = tpu_run["kwargs"]
  assert (kwargs["use_tpu"], str(kwargs["mesh_shape"]),
          tpu_run["estimator"].config.master) == (
              TPU_ADDRESS, "Shape[model=4]", TPU_ADDRESS)

  def features_fn(mode):
    return features("bitransformer", mode, kwargs["batch_size"],
                    kwargs["sequence_length"], vocab=200,
                    packed=mode == TRAIN)

  trained = build_program(tpu_run["model_fn"], TRAIN, features_fn)
  assert check_tpu_program(trained)["CrossReplicaSum"] >= 1
  # SimdMeshImpl does every all-to-all in bfloat16 ("a bug with float32
  # alltoall"): Auto's split core sends the float32 gradients of Q, K, V
  # rounded to bfloat16 on a TPU, in full float32 on CPU
  all_to_all = [op for op in trained.graph.get_operations()
                if op.type == "AllToAll"]
  assert {op.get_attr("T") for op in all_to_all} == {tf.bfloat16}
  rounded = [op for op in all_to_all if op.inputs[0].op.type == "Cast" and
             op.inputs[0].op.inputs[0].dtype == tf.float32]
  assert (len(all_to_all), len(rounded)) == (16, 8)
  decoded = build_program(tpu_run["model_fn"], PREDICT, features_fn)
  check_tpu_program(decoded)
  cpu_run = _captured_model_fn(monkeypatch, launch_tpu, model_dir, None)
  on_cpu = build_program(cpu_run["model_fn"], TRAIN, features_fn,
                         use_tpu=False)
  assert {type(i) for i in on_cpu.lowering.mesh_to_impl.values()} == {
      mtf.placement_mesh_impl.PlacementMeshImpl}
  assert counter_totals(trained.lowering.counters) == counter_totals(
      on_cpu.lowering.counters)
