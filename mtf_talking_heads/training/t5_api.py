"""t5's Python API (t5.models.MtfModel) with this package's layers, in one call.

Owns mtf_model(): the gin parsed as `mtf_th train` parses it (mtf's
defaults.gin first, then the package's files, then the bindings: without
defaults.gin t5's MtfModel fails with "Required bindings ... max_length"),
the same pre-flight, and an MtfModel built from what the gin binds for
utils.run (mesh, layout, batch, lengths, model type, optimizer, learning-rate
schedule, checkpoints).  The MtfModel it returns is t5's class with four
methods mended, so a notebook's train / eval / predict calls work unchanged:

  train    runs mtf_th.train_model (loop.py), as `mtf_th train` does: seeded
           (the same losses as `mtf_th train` with the same gin), resuming
           and skipping the batches seen, train_log.csv, under the
           model_dir lock.  (t5's runs mtf's unseeded train_model.)
  estimator  configured as the package's (seed, every logical CPU device,
           resource variables, initial weights seeded by name).
  eval     creates <model_dir>/<split>_eval first (t5's writes into it
           without creating it).
  predict  decodes with the configured vocabulary when none is given (t5's
           loads its default SentencePiece model from Cloud Storage).

Example:
  model = t5_api.mtf_model(
      "runs/t5_api", gin_files=["experiments/encdec_heads/06_talking_heads_8_16.gin",
                                "models/encdec_tiny.gin"])
  model.train("th_prefix_lm_bytes", steps=4)
  model.predict("inputs.txt", "outputs.txt", temperature=0.0)
"""
import functools
import os

import gin
from mesh_tensorflow.transformer import learning_rate_schedules
from t5.models import mesh_transformer
from t5.models import mtf_model as t5_mtf_model
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import models
from mtf_talking_heads.training import checks
from mtf_talking_heads.training import devices
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import loop
from mtf_talking_heads.training import settings as settings_lib


def _resolved(value):
  """A gin binding's value: @fn -> fn, @fn() -> fn(), else the value."""
  if isinstance(value, gin.config.ConfigurableReference):
    with gin.unlock_config():
      fn = value.scoped_configurable_fn
      return fn() if value.evaluate else fn
  return value


def _run_arg(name, default=None):
  """What utils.run receives as argument `name` from the parsed gin."""
  return _resolved(models.query("utils.run." + name, default))


def _learning_rate_schedule(train_steps):
  """utils.run's schedule: a function of the step (its total_train_steps
  bound as utils.run binds it), or a constant."""
  schedule = _run_arg("learning_rate_schedule")
  total = _run_arg("total_run_steps") or train_steps
  if isinstance(schedule, list):
    return functools.partial(learning_rate_schedules.product_learning_rate,
                             total_train_steps=total, factors=schedule)
  if callable(schedule):
    return functools.partial(schedule, total_train_steps=total)
  return schedule


class MtfModel(t5_mtf_model.MtfModel):
  """t5.models.MtfModel that trains and runs as the `mtf_th` commands do
  (see the module docstring); build it with mtf_model()."""

  def __init__(self, model_dir, tpu, seed=1234, vocabulary=None, **kwargs):
    super().__init__(model_dir, tpu, **kwargs)
    self._seed = seed
    self._vocabulary = vocabulary

  def estimator(self, vocabulary, *args, **kwargs):
    estimator = super().estimator(vocabulary, *args, **kwargs)
    estimator_lib.configure_estimator(estimator, self._seed)
    return estimator

  def train(self, mixture_or_task_name, steps, init_checkpoint=None,
            split="train"):
    """Trains up to global step `steps` with mtf_th.train_model."""
    vocabulary = mesh_transformer.get_vocabulary(mixture_or_task_name)
    dataset_fn = functools.partial(mesh_transformer.mesh_train_dataset_fn,
                                   mixture_or_task_name=mixture_or_task_name)
    tf.io.gfile.makedirs(self._model_dir)
    with estimator_lib.writer_lock(self._model_dir):
      loop.train_model(
          self.estimator(vocabulary, init_checkpoint), vocabulary,
          self._sequence_length, self.batch_size, dataset_fn, steps,
          self._ensemble_inputs, dataset_split=split,
          skip_seen_data=bool(_run_arg("skip_seen_data", False)))

  def eval(self, mixture_or_task_name, checkpoint_steps=None,
           summary_dir=None, split="validation", **kwargs):
    summary_dir = summary_dir or os.path.join(self._model_dir,
                                              "%s_eval" % split)
    tf.io.gfile.makedirs(summary_dir)
    return super().eval(mixture_or_task_name, checkpoint_steps, summary_dir,
                        split, **kwargs)

  def predict(self, input_file, output_file, checkpoint_steps=-1,
              beam_size=1, temperature=1.0, keep_top_k=-1, vocabulary=None):
    return super().predict(input_file, output_file, checkpoint_steps,
                           beam_size, temperature, keep_top_k,
                           vocabulary or self._vocabulary)


def mtf_model(model_dir, gin_files=(), gin_params=(), tpu=None,
              tpu_zone=None, gcp_project=None, **kwargs):
  """A t5.models.MtfModel of the model the gin files configure.

  Parses the gin as `mtf_th train` does (training.parse_gin: mtf's
  defaults.gin, gin_files, gin_params) and runs its pre-flight, then builds
  the MtfModel from the parsed utils.run bindings.

  Args:
    model_dir: checkpoints and logs (a `mtf_th train` model_dir: `mtf_th
      eval` and `mtf_th decode` read it too).
    gin_files: gin file names, e.g. an experiment file, then
      models/encdec_tiny.gin.
    gin_params: extra bindings, e.g. "mesh_shape = 'model:2'".
    tpu, tpu_zone, gcp_project: a Cloud TPU; None: the mesh on logical CPU
      devices.
    **kwargs: other MtfModel arguments (they win over the gin's).
  Returns:
    an MtfModel (a t5.models.MtfModel): .train(task, steps),
    .eval(task, checkpoint_steps), .predict(input_file, output_file), ...
  Raises:
    ConfigError: one line naming the parameter or file, before any graph.
  """
  estimator_lib.check_model_dir(model_dir)
  settings_lib.parse_gin(gin_files, gin_params)
  settings, _ = checks.preflight(tpu)
  estimator_lib.check_tpu(tpu, tpu_zone, gcp_project)
  arguments = dict(
      tpu_zone=tpu_zone, gcp_project=gcp_project,
      mesh_shape=settings.mesh_shape, layout_rules=settings.layout,
      mesh_devices=None if tpu else devices.mesh_devices(settings.mesh_shape),
      batch_size=settings.batch_size,
      sequence_length=settings.sequence_length,
      model_type=settings.model_type,
      autostack=_run_arg("autostack", True),
      learning_rate_schedule=_learning_rate_schedule(settings.train_steps),
      optimizer=_run_arg("optimizer"),
      keep_checkpoint_max=_run_arg("keep_checkpoint_max"),
      save_checkpoints_steps=_run_arg("save_checkpoints_steps"),
      iterations_per_loop=_run_arg("iterations_per_loop"),
      variable_filter=_run_arg("variable_filter"),
      ensemble_inputs=_run_arg("ensemble_inputs"),
      seed=models.query("mtf_th.train_model.seed", 1234),
      vocabulary=_run_arg("vocabulary"))
  arguments.update(kwargs)
  arguments = {k: v for k, v in arguments.items() if v is not None}
  return MtfModel(model_dir, tpu, **arguments)
