"""Initial weights that depend only on the run's seed and each variable's name.

TF1 gives a random op created without a seed of its own the graph seed and a
counter of the unseeded random ops created before it in the graph
(tensorflow/python/framework/random_seed.get_seed).  Every mtf variable's
initializer is such an op, so a variable's initial value depended on the
order in which the model created its variables.  That order depends on the
mesh: the sharding strategy strategies.Auto picks (from the mesh shape, the
layout and the sizes) decides whether an attention layer creates its
relative-position bias before or after its projections.  With the same seed,
the tiny T5 with talking heads (experiments/t5_heads/07, models/t5_tiny.gin)
got one checkpoint 0 on model:1 and another on model:4, where Auto picks
batch_split_gathered: encoder/block_000/layer_000's p_q, p_k, p_v, p_o, p_l,
p_w and relative_attention_bias had traded values (each drew the next one's
random stream); the step-1 loss was 9.6213 vs 9.5736.

Fix, once for every variable: a variable-scope custom getter gives each
seedable initializer (tf.compat.v1 random initializers have a ``seed``
attribute) the op seed variable_seed(<full variable name>) when it has none.
TF combines it with the graph seed (the run's seed, mtf_th.train_model.seed),
so the initial value of a variable is a function of (seed, name, shape,
initializer) only: the same on every mesh, layout and strategy.  A floating
variable created with initializer=None (mtf's relative_attention_bias),
which TF would fill with its default glorot_uniform op, unseeded (and so
follow the op counter), gets that same glorot_uniform distribution with the
op seed variable_seed(name) (tests/nn/test_init_seeds.py shows both).

Example:
  with tf.Graph().as_default():
    tf.set_random_seed(1234)
    with init_seeds.name_seeded_variables():
      logits, loss = model.call_simple(...)   # every variable seeded by name
"""
import contextlib
import copy
import zlib

import tensorflow.compat.v1 as tf
from tensorflow.python.util import tf_decorator  # pylint: disable=g-direct-tensorflow-import


def variable_seed(name):
  """The op seed of the initializer of variable `name` (a stable hash).

  Args:
    name: the variable's full name, e.g.
      "encoder/block_000/layer_000/TalkingHeadsAttention/p_q".
  Returns:
    an int in [1, 2**31 - 1] (never 0, which TF reads as "no seed").
  """
  return zlib.crc32(name.encode("utf-8")) % (2 ** 31 - 1) + 1


def seeded_initializer(initializer, name, dtype=None):
  """A copy of `initializer` whose op seed is variable_seed(name).

  Initializers without a ``seed`` attribute (zeros, ones, constants) draw
  nothing at random and are returned as they are; so is one that already
  has a seed.  None (TF's default) of a floating `dtype` becomes TF's
  default for it, glorot_uniform, with that seed; of another dtype (TF's
  default: zeros) it stays None.
  """
  if initializer is None:
    if tf.as_dtype(dtype or tf.float32).is_floating:
      return tf.glorot_uniform_initializer(seed=variable_seed(name))
    return None
  if getattr(initializer, "seed", 0) is not None:
    return initializer
  seeded = copy.copy(initializer)
  seeded.seed = variable_seed(name)
  return seeded


def _seeded_getter(getter, name, *args, **kwargs):
  """Variable-scope custom getter: seeds the initializer from the name."""
  kwargs["initializer"] = seeded_initializer(kwargs.get("initializer"), name,
                                             kwargs.get("dtype"))
  return getter(name, *args, **kwargs)


@contextlib.contextmanager
def name_seeded_variables():
  """Every tf.get_variable in this context (mtf's variables included) gets
  its initializer seeded by its full name; names are unchanged."""
  with tf.variable_scope(tf.get_variable_scope(),
                         custom_getter=_seeded_getter,
                         auxiliary_name_scope=False):
    yield


def seeded_model_fn(model_fn):
  """`model_fn` (an Estimator model function) run in name_seeded_variables.

  The wrapper keeps model_fn's signature (Estimator passes only the
  arguments a model function names), and wrapping twice is a no-op.
  """
  if getattr(model_fn, "_mtf_th_name_seeded", False):
    return model_fn

  def wrapper(*args, **kwargs):
    with name_seeded_variables():
      return model_fn(*args, **kwargs)

  wrapped = tf_decorator.make_decorator(model_fn, wrapper)
  wrapped._mtf_th_name_seeded = True  # pylint: disable=protected-access
  return wrapped
