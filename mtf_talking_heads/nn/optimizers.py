"""BERT's and ALBERT's pre-training optimizers and schedule, for mtf.

mesh_tensorflow.optimize has Adafactor, SGD, momentum and BERT's
AdamWeightDecayOptimizer, but no LAMB.  This module adds:

  LambOptimizer               ALBERT's optimizer (You et al. 2019, "Large
                              Batch Optimization for Deep Learning"), as in
                              the ALBERT code's lamb_optimizer.py.
  BertAdamOptimizer           mtf's AdamWeightDecayOptimizer (BERT's AdamW)
                              with BERT's settings and gradient clipping.
  clip_by_global_norm         tf.clip_by_global_norm on mtf tensors: BERT's
                              and ALBERT's optimization.py clip every
                              gradient to a global norm of 1.0 first.
  warmup_linear_decay         BERT's and ALBERT's learning-rate schedule:
                              linear warm-up, then linear decay to 0.
  check_settings              the pre-flight check of the bindings above.

Both optimizers keep the update of the reference code: Adam moments without
bias correction, weight decay added to the update (not to the loss), and
no weight decay for normalisation scales and biases.  The names excluded by
default are the reference's ("LayerNorm", "layer_norm", "bias") plus mtf's
"rms_norm" (mtf's transformer normalises with RMS norm, whose scale plays
LayerNorm's part).

LAMB's trust ratio ||w|| / ||update|| is per variable ("per layer").  The
norms are mtf reductions to a scalar, so on a mesh that splits a variable
each device's partial sum of squares is all-reduced: the ratio is the one
of the whole variable, never of a shard (tests/nn/test_optimizers.py checks a
variable split over 2 devices against NumPy).  Under mtf's autostacking
(utils.run.autostack) the variables are stacked only after these ops are
built; the ops still read each original variable through its own slice.

gin (gin/models/albert_base.gin, bert_base.gin)::

  utils.run.optimizer = @mtf_th.LambOptimizer
  utils.run.learning_rate_schedule = @mtf_th.warmup_linear_decay
  mtf_th.warmup_linear_decay.learning_rate = 0.00176
  mtf_th.warmup_linear_decay.warmup_steps = 3125
"""
import re

import gin
import mesh_tensorflow as mtf
from mesh_tensorflow import optimize
import tensorflow.compat.v1 as tf

# The reference code's exclusion list, plus mtf's RMS-norm scales.
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "rms_norm", "bias")
CLIP_NORM = 1.0  # BERT's and ALBERT's optimization.py


def clip_by_global_norm(grads, clip_norm):
  """Scales grads by clip_norm / max(global norm, clip_norm).

  Like tf.clip_by_global_norm: the global norm is that of all gradients
  together, so the direction of the whole update is kept.

  Args:
    grads: a list of mtf.Tensor (None entries stay None).
    clip_norm: a positive float.
  Returns:
    the list of scaled gradients, same shapes (e.g. [d_model=4, d_ff=8]).
  """
  present = [g for g in grads if g is not None]
  if not present:
    return list(grads)
  squares = [mtf.reduce_sum(mtf.square(mtf.to_float(g))) for g in present]
  global_norm = mtf.sqrt(mtf.add_n(squares))
  scale = clip_norm / mtf.maximum(global_norm, clip_norm)
  return [None if g is None else g * mtf.cast(scale, g.dtype) for g in grads]


def _matches_any(patterns, name):
  return any(re.search(p, name) for p in patterns or ())


def _check_positive(name, value):
  if not isinstance(value, (int, float)) or isinstance(value, bool) or (
      value <= 0):
    raise ValueError("%s must be a positive number, got %r" % (name, value))


def _check_unit_interval(name, value):
  if not isinstance(value, (int, float)) or not 0 <= value < 1:
    raise ValueError("%s must be in [0, 1), got %r (ALBERT/BERT: beta_1 "
                     "0.9, beta_2 0.999)" % (name, value))


def _check_adam_args(cls_name, weight_decay_rate, beta_1, beta_2, epsilon,
                     clip_norm):
  _check_unit_interval("%s.beta_1" % cls_name, beta_1)
  _check_unit_interval("%s.beta_2" % cls_name, beta_2)
  _check_positive("%s.epsilon" % cls_name, epsilon)
  if not isinstance(weight_decay_rate, (int, float)) or weight_decay_rate < 0:
    raise ValueError("%s.weight_decay_rate must be >= 0, got %r (0.01 in "
                     "BERT and ALBERT)" % (cls_name, weight_decay_rate))
  if clip_norm is not None:
    _check_positive("%s.clip_norm (None: no clipping)" % cls_name, clip_norm)


class _ClipsGlobalNorm(object):
  """apply_grads clips all gradients to one global norm first."""

  clip_norm = None

  def apply_grads(self, grads, variables):
    if self.clip_norm is not None:
      grads = clip_by_global_norm(grads, self.clip_norm)
    return super().apply_grads(grads, variables)


def _adam_moments(optimizer, grad, var):
  """(m, v, next_m, next_v): Adam's slots and their new values (no bias
  correction, as in BERT's and ALBERT's code).  Slots are named
  <var>/adam_m and <var>/adam_v, as there."""
  m = mtf.get_variable(var.mesh, var.name + "/adam_m", var.shape,
                       initializer=tf.zeros_initializer(), trainable=False)
  v = mtf.get_variable(var.mesh, var.name + "/adam_v", var.shape,
                       initializer=tf.zeros_initializer(), trainable=False)
  next_m = optimizer.beta_1 * m + (1.0 - optimizer.beta_1) * grad
  next_v = optimizer.beta_2 * v + (1.0 - optimizer.beta_2) * mtf.square(grad)
  return m, v, next_m, next_v


def _norm(x):
  """The L2 norm of all of x, a scalar (all-reduced over the mesh)."""
  return mtf.sqrt(mtf.reduce_sum(mtf.square(x)))


def trust_ratio(weights, update):
  """LAMB's ||w|| / ||update||, or 1 where either norm is 0.

  Args:
    weights: the variable's value, e.g. [d_model=4, d_ff=8].
    update: the Adam update plus weight decay, same shape.
  Returns:
    a scalar mtf.Tensor (shape []).
  """
  w_norm = _norm(weights)
  u_norm = _norm(update)
  both = mtf.logical_and(mtf.greater(w_norm, 0.0), mtf.greater(u_norm, 0.0))
  safe_u = mtf.where(both, u_norm, mtf.ones_like(u_norm))
  return mtf.where(both, w_norm / safe_u, mtf.ones_like(w_norm))


@gin.configurable(module="mtf_th")
class LambOptimizer(_ClipsGlobalNorm, optimize.Optimizer):
  """LAMB, as ALBERT pre-trains with it, for mesh-tensorflow.

  For each variable w with gradient g (after clipping all gradients to one
  global norm, clip_norm):

    m = beta_1 m + (1 - beta_1) g          v = beta_2 v + (1 - beta_2) g^2
    u = m / (sqrt(v) + epsilon) + weight_decay_rate * w   (decay unless excluded)
    r = ||w|| / ||u||  (1 if either is 0; 1 for excluded variables)
    w = w - learning_rate * r * u

  Example: a weight [d_model=768, d_ff=3072] gets two slots of the same
  shape, <name>/adam_m and <name>/adam_v; ||w|| and ||u|| are scalars over
  all 768 x 3072 entries, however the mesh splits d_ff.

  Args:
    learning_rate: a float or scalar tf.Tensor (utils.run passes the
      schedule's value).
    weight_decay_rate: 0.01 in ALBERT.
    beta_1, beta_2, epsilon: 0.9, 0.999, 1e-6 in ALBERT.
    exclude_from_weight_decay: regexes of variable names without decay.
    exclude_from_layer_adaptation: regexes of names without the trust ratio
      (None: the weight-decay exclusions, as in ALBERT's code).
    clip_norm: global gradient norm clipped to (None: no clipping).
  """

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6,
               exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY,
               exclude_from_layer_adaptation=None, clip_norm=CLIP_NORM):
    _check_adam_args("mtf_th.LambOptimizer", weight_decay_rate, beta_1,
                     beta_2, epsilon, clip_norm)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())
    if exclude_from_layer_adaptation is None:
      exclude_from_layer_adaptation = self.exclude_from_weight_decay
    self.exclude_from_layer_adaptation = tuple(exclude_from_layer_adaptation)
    self.clip_norm = clip_norm

  def uses_weight_decay(self, name):
    return bool(self.weight_decay_rate) and not _matches_any(
        self.exclude_from_weight_decay, name)

  def uses_layer_adaptation(self, name):
    return not _matches_any(self.exclude_from_layer_adaptation, name)

  def apply_grad(self, grad, var):
    """The update ops of one variable (see the class docstring)."""
    if grad is None:
      tf.logging.warning("Gradient is None for variable %s", var.name)
      return []
    grad = mtf.to_float(grad)
    m, v, next_m, next_v = _adam_moments(self, grad, var)
    update = next_m / (mtf.sqrt(next_v) + self.epsilon)
    weights = mtf.to_float(var.value)  # bfloat16 activations (TPU)
    if self.uses_weight_decay(var.name):
      update += self.weight_decay_rate * weights
    step = self.learning_rate * update
    if self.uses_layer_adaptation(var.name):
      step *= trust_ratio(weights, update)
    return [mtf.assign_sub(var, step), mtf.assign(m, next_m),
            mtf.assign(v, next_v)]


@gin.configurable(module="mtf_th")
class BertAdamOptimizer(_ClipsGlobalNorm, optimize.AdamWeightDecayOptimizer):
  """BERT's optimizer: mtf's AdamWeightDecayOptimizer with BERT's settings.

  mtf's class is BERT's AdamW transcribed (no bias correction, decoupled
  weight decay); this subclass adds BERT's defaults (weight decay
  0.01, beta_1 0.9, beta_2 0.999, epsilon 1e-6, no decay for norms and
  biases) and BERT's clipping of all gradients to a global norm of 1.0.

  Example: a weight [d_model=768, d_ff=3072] gets the slots
  <name>/adam_m and <name>/adam_v, both [d_model=768, d_ff=3072].

  Args:
    learning_rate: a float or scalar tf.Tensor.
    weight_decay_rate, beta_1, beta_2, epsilon, exclude_from_weight_decay:
      as mtf's AdamWeightDecayOptimizer.
    clip_norm: global gradient norm clipped to (None: no clipping).
  """

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6,
               exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY,
               clip_norm=CLIP_NORM):
    _check_adam_args("mtf_th.BertAdamOptimizer", weight_decay_rate, beta_1,
                     beta_2, epsilon, clip_norm)
    super().__init__(learning_rate, weight_decay_rate=weight_decay_rate,
                     beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                     exclude_from_weight_decay=list(
                         exclude_from_weight_decay or ()))
    self.clip_norm = clip_norm

  def apply_grad(self, grad, var):
    """mtf's update, with the weight decay read from the float32 value of
    the variable: mtf's own adds its activation-dtype value to the float32
    update, which fails with bfloat16 activations ("Dtypes must be
    equal", mesh-tensorflow 0.1.21), as on a TPU."""
    if grad is None:
      tf.logging.warning("Gradient is None for variable %s", var.name)
      return []
    m, v, next_m, next_v = _adam_moments(self, mtf.to_float(grad), var)
    update = next_m / (mtf.sqrt(next_v) + self.epsilon)
    if self._do_use_weight_decay(var.name):
      update += self.weight_decay_rate * mtf.to_float(var.value)
    return [mtf.assign_sub(var, self.learning_rate * update),
            mtf.assign(m, next_m), mtf.assign(v, next_v)]


def check_schedule(learning_rate, warmup_steps, total_train_steps=None):
  """Raises ValueError naming the gin parameter if the schedule is unusable."""
  _check_positive("mtf_th.warmup_linear_decay.learning_rate", learning_rate)
  if not isinstance(warmup_steps, int) or warmup_steps < 0:
    raise ValueError("mtf_th.warmup_linear_decay.warmup_steps must be an "
                     "integer >= 0, got %r" % (warmup_steps,))
  if total_train_steps is not None and (
      not isinstance(total_train_steps, int) or
      total_train_steps <= warmup_steps):
    raise ValueError(
        "train_steps (%r) must be larger than mtf_th.warmup_linear_decay."
        "warmup_steps (%r): the schedule decays to 0 at train_steps; raise "
        "train_steps or lower warmup_steps" % (total_train_steps,
                                                warmup_steps))


@gin.configurable(module="mtf_th")
def warmup_linear_decay(step, total_train_steps, learning_rate=gin.REQUIRED,
                        warmup_steps=gin.REQUIRED, start_step=0):
  """BERT's and ALBERT's learning rate at `step`.

    step < warmup_steps:  learning_rate * step / warmup_steps
    otherwise:            learning_rate * (1 - step / total_train_steps)

  with step and total_train_steps counted from start_step: 0 in
  pre-training; fine-tuning (training.finetune binds it to the pre-trained
  checkpoint's step) warms up and decays over its own steps only, as BERT's
  and ALBERT's fine-tuning do.

  (their optimization.py: tf.train.polynomial_decay to 0 with power 1 over
  total_train_steps, replaced by the linear warm-up while step <
  warmup_steps).  utils.run passes total_train_steps =
  utils.run.total_run_steps (gin/mtf_th.gin: %train_steps).

  Example: learning_rate 1e-4, warmup 10000, 1000000 steps: 5e-5 at step
  5000, 1e-4 at 10000, 5e-5 at 500000, 0 at 1000000.

  Args:
    step: the global step, a scalar tf.Tensor.
    total_train_steps: the last global step, an int.
    learning_rate: the peak rate.
    warmup_steps: an int >= 0, counted from start_step.
    start_step: the global step the schedule starts from.
  Returns:
    a float32 scalar tf.Tensor.
  """
  total_train_steps -= start_step
  check_schedule(learning_rate, warmup_steps, total_train_steps)
  step = tf.cast(tf.cast(step, tf.int64) - start_step, tf.float32)
  decayed = learning_rate * (
      1.0 - tf.minimum(step, float(total_train_steps)) / total_train_steps)
  if not warmup_steps:
    return decayed
  warming = learning_rate * step / float(warmup_steps)
  return tf.where(step < warmup_steps, warming, decayed)


def check_settings():
  """Pre-flight check of this module's gin bindings (no graph).

  Instantiates the bound optimizer class when it is one of this module's
  (its constructor checks its arguments) and checks the schedule's
  arguments against utils.run.total_run_steps.  Raises ValueError naming
  the parameter and the fix; does nothing for other optimizers/schedules.
  """
  from mtf_talking_heads.nn import models  # pylint: disable=g-import-not-at-top
  optimizer = models.query("utils.run.optimizer")
  if isinstance(optimizer, gin.config.ConfigurableReference) and (
      optimizer.selector.startswith("mtf_th.") or
      "mtf_talking_heads.nn.optimizers" in optimizer.selector):
    with gin.unlock_config():
      optimizer.scoped_configurable_fn(learning_rate=1.0)
  schedule = models.query("utils.run.learning_rate_schedule")
  if isinstance(schedule, gin.config.ConfigurableReference) and (
      schedule.selector.endswith("warmup_linear_decay")):
    total = models.query("utils.run.total_run_steps")
    start = models.query("mtf_th.warmup_linear_decay.start_step") or 0
    check_schedule(models.query("mtf_th.warmup_linear_decay.learning_rate"),
                   models.query("mtf_th.warmup_linear_decay.warmup_steps"),
                   total - start if isinstance(total, int) else total)
