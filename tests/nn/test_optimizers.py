"""LAMB, BERT's AdamW and the warm-up + linear-decay schedule against NumPy.

Each optimizer runs several steps on small mtf variables, fed gradients that
trip the global-norm clipping on some steps, on one device and with the
variables split over a 2-device mesh (LAMB's per-variable norms must then
be all-reduced, not taken per shard).  The NumPy transcriptions follow
ALBERT's lamb_optimizer.py / BERT's optimization.py line by line.
"""
import gin
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from mesh_tensorflow.transformer import utils as mtf_utils  # noqa: F401  (gin: utils.run)

from mtf_talking_heads.measure import harness
from mtf_talking_heads.nn import optimizers

STEPS = 5
LEARNING_RATES = (0.1, 0.05, 0.2, 0.02, 0.1)
# name -> shape; "layer_norm" is excluded from decay and trust ratio,
# "zero" starts at 0 (LAMB's ||w|| = 0 guard), "bias" is excluded too.
SHAPES = {"dense/kernel": (4, 6), "layer_norm/scale": (6,),
          "zero/kernel": (6, 2), "out/bias": (2,)}
DIMS = {"dense/kernel": ("rows", "cols"), "layer_norm/scale": ("cols",),
        "zero/kernel": ("cols", "out"), "out/bias": ("out",)}
SIZES = {"rows": 4, "cols": 6, "out": 2}


def _initial_weights():
  rng = np.random.RandomState(0)
  out = {name: rng.normal(size=shape).astype(np.float32)
         for name, shape in SHAPES.items()}
  out["zero/kernel"][:] = 0.0
  return out


def _gradients():
  """STEPS dicts of gradients; steps 1 and 3 are large (clipping applies)."""
  rng = np.random.RandomState(1)
  steps = []
  for i in range(STEPS):
    scale = 3.0 if i in (1, 3) else 0.1
    steps.append({name: (scale * rng.normal(size=shape)).astype(np.float32)
                  for name, shape in SHAPES.items()})
  return steps


# ----------------------------------------------------------------- NumPy


def _excluded(name):
  return any(p in name for p in optimizers.EXCLUDE_FROM_WEIGHT_DECAY)


def reference(kind, weights, grad_steps, learning_rates, weight_decay=0.01,
              beta_1=0.9, beta_2=0.999, epsilon=1e-6, clip_norm=1.0):
  """kind "lamb" (ALBERT's lamb_optimizer.py) or "adamw" (BERT's)."""
  w = {k: v.astype(np.float64) for k, v in weights.items()}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for grads, lr in zip(grad_steps, learning_rates):
    global_norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2)
                              for g in grads.values()))
    scale = clip_norm / max(global_norm, clip_norm)
    for name in w:
      g = grads[name].astype(np.float64) * scale
      m[name] = beta_1 * m[name] + (1 - beta_1) * g
      v[name] = beta_2 * v[name] + (1 - beta_2) * g ** 2
      update = m[name] / (np.sqrt(v[name]) + epsilon)
      if not _excluded(name):
        update = update + weight_decay * w[name]
      ratio = 1.0
      if kind == "lamb" and not _excluded(name):
        w_norm, u_norm = np.linalg.norm(w[name]), np.linalg.norm(update)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
      w[name] = w[name] - lr * ratio * update
  return w


# ------------------------------------------------------------------- mtf


def run_mtf(optimizer_cls, mesh_shape, layout, autostack,
            activation_dtype=tf.float32):
  """Runs STEPS updates; returns {name: final weights} and the slot names.

  activation_dtype: the variables' activation dtype (bfloat16 as on a TPU:
  float32 master weights, bfloat16 values and gradients).
  """
  weights, grad_steps = _initial_weights(), _gradients()
  graph = tf.Graph()
  with graph.as_default():
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "mesh")
    lr = tf.placeholder(tf.float32, [])
    feeds, variables, grads = {}, [], []
    for name, shape in SHAPES.items():
      mtf_shape = mtf.Shape([mtf.Dimension(d, SIZES[d]) for d in DIMS[name]])
      var = mtf.get_variable(
          mesh, name, mtf_shape, dtype=mtf.VariableDType(
              tf.float32, tf.float32, activation_dtype),
          initializer=tf.constant_initializer(weights[name])).operation
      feeds[name] = tf.placeholder(tf.float32, shape)
      variables.append(var)
      grads.append(mtf.import_tf_tensor(
          mesh, tf.cast(feeds[name], activation_dtype), mtf_shape))
    update_ops = optimizer_cls(learning_rate=lr).apply_grads(grads, variables)
    # (before lowering: autostacking renames variables to stacked/...)
    slots = sorted(v.name for v in mtf_graph.all_variables
                   if not v.trainable)
    lowering = mtf.Lowering(
        mtf_graph, {mesh: harness.mesh_impl(mesh_shape, layout)},
        autostack=autostack)
    train_op = tf.group([lowering.lowered_operation(op) for op in update_ops])
    read = {v.name: tf.cast(lowering.export_to_tf_tensor(v.outputs[0]),
                            tf.float32) for v in variables}
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      for step, rate in zip(grad_steps, LEARNING_RATES):
        feed = {feeds[k]: g for k, g in step.items()}
        feed[lr] = rate
        sess.run(train_op, feed)
      return sess.run(read), slots


CASES = [
    ("one_device", "", "", False),
    ("split_over_2_devices", "model:2", "cols:model", False),
    ("split_over_2_devices_autostacked", "model:2", "cols:model", True),
]


@pytest.mark.parametrize("name,mesh_shape,layout,autostack", CASES,
                         ids=[c[0] for c in CASES])
@pytest.mark.parametrize("kind", ["lamb", "adamw"])
def test_optimizer_matches_numpy(kind, name, mesh_shape, layout, autostack):
  del name
  cls = {"lamb": optimizers.LambOptimizer,
         "adamw": optimizers.BertAdamOptimizer}[kind]
  got, slots = run_mtf(cls, mesh_shape, layout, autostack)
  want = reference(kind, _initial_weights(), _gradients(), LEARNING_RATES)
  for key in SHAPES:
    np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=2e-6,
                               err_msg=key)
  assert slots == sorted(k + s for k in SHAPES for s in ("/adam_m", "/adam_v"))


@pytest.mark.parametrize("kind", ["lamb", "adamw"])
def test_bfloat16_activations_as_on_a_tpu(kind):
  """Weight decay reads the bfloat16 value of a float32 master weight
  (mtf's AdamWeightDecayOptimizer added it to the float32 update:
  "Dtypes must be equal"); the result is the float32 one to bfloat16's
  precision."""
  cls = {"lamb": optimizers.LambOptimizer,
         "adamw": optimizers.BertAdamOptimizer}[kind]
  got, _ = run_mtf(cls, "", "", False, activation_dtype=tf.bfloat16)
  want = reference(kind, _initial_weights(), _gradients(), LEARNING_RATES)
  for key in SHAPES:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-2, atol=2e-2,
                               err_msg=key)


def test_trust_ratio_and_clipping_change_the_update():
  """The reference differs from plain AdamW and from no clipping, so the
  test above sees both features (not a vacuous match)."""
  w, g = _initial_weights(), _gradients()
  lamb = reference("lamb", w, g, LEARNING_RATES)
  adamw = reference("adamw", w, g, LEARNING_RATES)
  unclipped = reference("lamb", w, g, LEARNING_RATES, clip_norm=1e9)
  assert np.abs(lamb["dense/kernel"] - adamw["dense/kernel"]).max() > 1e-2
  assert np.abs(lamb["dense/kernel"] - unclipped["dense/kernel"]).max() > 1e-3
  # excluded variables get no trust ratio: identical under both
  np.testing.assert_allclose(lamb["layer_norm/scale"],
                             adamw["layer_norm/scale"], rtol=1e-12)
  # w = 0: ratio 1, so the zero kernel's first step is exactly AdamW's
  first_lamb = reference("lamb", w, g[:1], LEARNING_RATES[:1])
  first_adamw = reference("adamw", w, g[:1], LEARNING_RATES[:1])
  np.testing.assert_allclose(first_lamb["zero/kernel"],
                             first_adamw["zero/kernel"], rtol=1e-12)
  assert np.abs(first_lamb["zero/kernel"]).min() > 0
  assert np.abs(lamb["zero/kernel"] - adamw["zero/kernel"]).max() > 1e-3


def test_weight_decay_exclusions():
  opt = optimizers.LambOptimizer(learning_rate=1.0)
  assert opt.uses_weight_decay("transformer/layer_000/dense/kernel")
  for name in ("transformer/rms_norm/scale", "encoder/LayerNorm/gamma",
               "x/layer_norm/scale", "out/bias"):
    assert not opt.uses_weight_decay(name)
    assert not opt.uses_layer_adaptation(name)
  opt = optimizers.LambOptimizer(learning_rate=1.0, weight_decay_rate=0.0)
  assert not opt.uses_weight_decay("dense/kernel")
  assert opt.uses_layer_adaptation("dense/kernel")


@pytest.mark.parametrize("kwargs,message", [
    ({"beta_1": 1.0}, "mtf_th.LambOptimizer.beta_1 must be in [0, 1)"),
    ({"beta_2": -0.1}, "mtf_th.LambOptimizer.beta_2"),
    ({"epsilon": 0}, "mtf_th.LambOptimizer.epsilon must be a positive"),
    ({"weight_decay_rate": -1}, "weight_decay_rate must be >= 0"),
    ({"clip_norm": 0.0}, "clip_norm (None: no clipping) must be a positive"),
])
def test_bad_arguments_name_the_parameter(kwargs, message):
  with pytest.raises(ValueError) as e:
    optimizers.LambOptimizer(learning_rate=1.0, **kwargs)
  assert message in str(e.value)


# -------------------------------------------------------------- schedule


def bert_schedule(step, total, peak, warmup):
  """BERT's / ALBERT's optimization.py in NumPy."""
  decayed = peak * (1 - min(step, total) / total)
  return peak * step / warmup if step < warmup else decayed


@pytest.mark.parametrize("peak,warmup,total", [
    (1e-4, 10000, 1000000),      # BERT
    (0.00176, 3125, 125000),     # ALBERT
])
def test_warmup_linear_decay_matches_bert(peak, warmup, total):
  steps = [0, 1, warmup // 2, warmup - 1, warmup, warmup + 1, total // 2,
           total - 1, total, total + 10]
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    rate = optimizers.warmup_linear_decay(step, total, learning_rate=peak,
                                          warmup_steps=warmup)
    with tf.Session() as sess:
      got = [sess.run(rate, {step: s}) for s in steps]
  want = [bert_schedule(s, total, peak, warmup) for s in steps]
  # float32, as in BERT: 1 - step / total loses digits near the end
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=peak * 1e-6)
  assert got[steps.index(warmup)] == pytest.approx(peak * (1 - warmup / total))
  assert got[-1] == 0.0


def test_schedule_errors_name_the_parameter():
  with pytest.raises(ValueError, match="warmup_linear_decay.learning_rate"):
    optimizers.check_schedule(0.0, 10)
  with pytest.raises(ValueError, match="warmup_steps must be an integer"):
    optimizers.check_schedule(1e-4, -1)
  with pytest.raises(ValueError, match="raise train_steps or lower"):
    optimizers.check_schedule(1e-4, 100, total_train_steps=100)


def test_check_settings_reads_gin():
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config("""
        import mtf_talking_heads.nn.optimizers
        utils.run.optimizer = @mtf_th.LambOptimizer
        utils.run.learning_rate_schedule = @mtf_th.warmup_linear_decay
        utils.run.total_run_steps = 50
        mtf_th.warmup_linear_decay.learning_rate = 0.00176
        mtf_th.warmup_linear_decay.warmup_steps = 100
    """, skip_unknown=True)
  try:
    with pytest.raises(ValueError, match="train_steps .50. must be larger"):
      optimizers.check_settings()
    with gin.unlock_config():
      gin.bind_parameter("utils.run.total_run_steps", 1000)
      gin.bind_parameter("mtf_th.LambOptimizer.beta_2", 1.5)
    with pytest.raises(ValueError, match="LambOptimizer.beta_2"):
      optimizers.check_settings()
    with gin.unlock_config():
      gin.bind_parameter("mtf_th.LambOptimizer.beta_2", 0.999)
    optimizers.check_settings()
  finally:
    with gin.unlock_config():
      gin.clear_config()
    harness.parse_mtf_defaults.done = False
