"""The same seed gives the same initial weights on every mesh (init_seeds.py).

The fast test builds, for every attention variant of gin/attention/ in the
tiny T5 (encoder, decoder and encoder-decoder attention), the model's
variables exactly as mtf's utils.tpu_estimator_model_fn does (gin, then
utils.build_model with the mesh shape and layout, then call_simple in train
mode, in init_seeds.name_seeded_variables as configure_estimator runs the
model function) and compares the initial values of every master variable
(what checkpoint 0 saves) across meshes.  No lowering: the masters and their
initializers exist before it, and lowering only adds per-device slices that
are copied from the masters.  The slow test checks checkpoint 0 of two real
training runs (training.train, what `mtf_th train` runs, in this process).
"""
import contextlib

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from mtf_talking_heads import training
from mtf_talking_heads.nn import init_seeds
from mtf_talking_heads.training import model_size
from mtf_talking_heads.training import settings as settings_lib

MESHES = ["model:1", "model:2", "model:4", "model:8", "batch:2,model:4"]
# (attention file, extra macros): every attention class of layers.py
VARIANTS = [
    ("multi_head", []),
    ("talking_heads", []),
    ("project_logits", []),
    ("project_weights", []),
    ("dynamic_projections", []),
    ("grouped_talking_heads", [  # the groups, not the heads, on "model"
        "groups = 8", "heads = 16",
        "layout = 'batch:batch,groups:model,d_ff:model,vocab:model'"]),
    ("general_bilinear", []),
]
SMALL = ["num_layers = 1", "d_model = 32", "d_ff = 64", "heads = 8",
         "d_k = 4", "d_v = 4", "inputs_length = 16", "targets_length = 8"]


def initial_values(attention, extra, mesh_shape, seed=1234,
                   name_seeded=True, op_first=False):
  """{variable name: initial value} of the tiny T5 with `attention`; with
  op_first, one random op is created before the model's variables."""
  settings_lib.parse_gin(
      ["models/t5_base.gin", "attention/%s.gin" % attention,
       "models/t5_tiny.gin"],
      SMALL + extra + ["mesh_shape = %r" % mesh_shape])
  settings = settings_lib.Settings()
  model = model_size.build_model(settings, settings.layout,
                                 settings.mesh_shape)
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(seed)
    if op_first:
      tf.random.uniform([1])
    mtf_graph = mtf.Graph()
    with (init_seeds.name_seeded_variables() if name_seeded
          else contextlib.nullcontext()):
      model_size.call_model(model, settings, mtf.Mesh(mtf_graph, "my_mesh"))
    masters = {v.name: v.get_master() for v in mtf_graph.all_variables}
    with tf.Session(graph=graph) as session:
      session.run(tf.global_variables_initializer())
      return session.run(masters)


def _differing(a, b):
  assert sorted(a) == sorted(b)
  return sorted(k for k in a if not np.array_equal(a[k], b[k]))


@pytest.mark.parametrize("attention,extra", VARIANTS,
                         ids=[v[0] for v in VARIANTS])
def test_initial_weights_do_not_depend_on_the_mesh(attention, extra):
  base = initial_values(attention, extra, MESHES[0])
  assert any("layer_000" in k for k in base)
  # T5's relative-position biases (initializer=None) are compared too
  assert any(k.endswith("/relative_attention_bias") for k in base)
  for mesh_shape in MESHES[1:]:
    other = initial_values(attention, extra, mesh_shape)
    assert _differing(base, other) == [], mesh_shape


def test_without_name_seeds_creation_order_changes_the_weights():
  """The cause, kept visible: seeded by TF's per-graph op counter, one op
  created before the model's variables (as a strategy that builds its ops in
  another order does: until 2026-11-27 GatheredBatchSplit, which Auto picked
  on model:4, created the relative bias first) changes the weights drawn
  after it.  Seeded by variable name, every variable keeps its value, the
  relative-position biases included (mtf creates them with initializer=None:
  name_seeded_variables gives them TF's default glorot_uniform, seeded), and
  the relative biases keep the distribution TF's default gives them."""
  args = ("talking_heads", [], "model:1")
  counted = initial_values(*args, name_seeded=False)
  shifted = initial_values(*args, name_seeded=False, op_first=True)
  assert len(_differing(counted, shifted)) >= len(counted) // 2
  biases = [k for k in counted if k.endswith("/relative_attention_bias")]
  assert biases and all(k in _differing(counted, shifted) for k in biases)
  named = initial_values(*args)
  assert _differing(named, initial_values(*args, op_first=True)) == []
  for k in biases:  # glorot_uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out))
    limit = np.sqrt(6.0 / sum(named[k].shape))
    assert np.abs(named[k]).max() <= limit
    assert np.abs(counted[k]).max() <= limit
    assert np.abs(named[k]).max() > 0.8 * limit
    assert not np.array_equal(named[k], counted[k])


def test_seed_and_name_decide():
  a = initial_values("talking_heads", [], "model:1", seed=1)
  b = initial_values("talking_heads", [], "model:1", seed=2)
  assert len(_differing(a, b)) >= len(a) // 2  # random ones differ
  assert init_seeds.variable_seed("a/p_q") != init_seeds.variable_seed("a/p_k")
  assert 0 < init_seeds.variable_seed("") < 2 ** 31


@pytest.mark.slow
def test_mtf_th_train_checkpoint_0_is_the_same_on_model_1_and_model_4(
    tmp_path):
  """Experiments/t5_heads/07 (24 heads): Auto runs heads_parallel on
  model:1 and batch_split_gathered on model:4."""
  readers = []
  for mesh_shape in ("model:1", "model:4"):
    model_dir = str(tmp_path / mesh_shape.replace(":", ""))
    training.train(model_dir, [
        "experiments/t5_heads/07_talking_heads_24_32.gin",
        "models/t5_tiny.gin"], ["mesh_shape = %r" % mesh_shape,
                                "num_layers = 1", "d_model = 32",
                                "d_ff = 64"], train_steps=1)
    readers.append(tf.train.load_checkpoint(model_dir + "/model.ckpt-0"))
  names = sorted(readers[0].get_variable_to_shape_map())
  assert names == sorted(readers[1].get_variable_to_shape_map())
  assert any("TalkingHeadsAttention/p_q" in n for n in names)
  assert any(n.endswith("/relative_attention_bias") for n in names)
  for name in names:
    np.testing.assert_array_equal(readers[0].get_tensor(name),
                                  readers[1].get_tensor(name), err_msg=name)


def test_configure_estimator_runs_the_model_fn_name_seeded_once(tmp_path):
  """What every mtf_th path (train, finetune, eval, decode, scoring) does
  to utils.run's estimator: its model function then draws each variable's
  initial value from the op seed variable_seed(name), and configuring the
  estimator again does not wrap it twice."""
  from mtf_talking_heads.training import estimator as estimator_lib  # pylint: disable=g-import-not-at-top

  def model_fn(features, labels, mode):
    del features, labels, mode
    return tf.get_variable("layer/w", [2],
                           initializer=tf.random_normal_initializer())

  estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
  estimator_lib.configure_estimator(estimator, 1234)
  wrapped = estimator._model_fn  # pylint: disable=protected-access
  estimator_lib.configure_estimator(estimator, 1234)
  assert estimator._model_fn is wrapped is not model_fn  # pylint: disable=protected-access
  with tf.Graph().as_default():
    variable = wrapped(None, None, "train")
    (draw,) = [op for op in tf.get_default_graph().get_operations()
               if op.type == "RandomStandardNormal"]
    assert draw.get_attr("seed2") == init_seeds.variable_seed("layer/w")
  assert variable.name == "layer/w:0"


def test_no_initializer_becomes_tfs_default_with_the_names_seed():
  """relative_attention_bias (mtf creates it with initializer=None): TF's
  glorot_uniform with the name's seed, the same numbers; not for ints."""
  name = "encoder/block_000/layer_000/SelfAttention/relative_attention_bias"
  with tf.Graph().as_default():
    tf.set_random_seed(1234)
    got = init_seeds.seeded_initializer(None, name)([32, 4])
    want = tf.glorot_uniform_initializer(
        seed=init_seeds.variable_seed(name))([32, 4])
    other = tf.glorot_uniform_initializer(
        seed=init_seeds.variable_seed(name + "_other"))([32, 4])
    with tf.Session() as sess:
      got, want, other = sess.run([got, want, other])
  np.testing.assert_array_equal(got, want)
  assert got.std() > 0 and not np.array_equal(got, other)
  assert init_seeds.seeded_initializer(None, name, tf.int32) is None
