"""Training: mtf_th.train_model (utils.run's train_model_fn) and train().

Owns the train loop as utils.run runs it: seeded and reproducible, resuming
from the latest checkpoint and skipping the batches already seen, logged by
hooks.ProgressHook, keeping the checkpoints evals need; a failing op ends
it with one TrainingError line (no retry), Ctrl-C or SIGTERM with
Interrupted, and an attempt that saved nothing leaves no events file.
"""
import os
import sys

import gin
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import models
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.runtime import stops
from mtf_talking_heads.training import checkpoints
from mtf_talking_heads.training import cluster as training_cluster
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import hooks as hooks_lib
from mtf_talking_heads.training import identity
from mtf_talking_heads.training import setup


def _op_error_message(e, model_dir, step):
  """One line: the failing op, the cause and what to change."""
  failure, fix = errors.op_failure(e)
  latest = checkpoints.latest_step(model_dir)
  where = "before the first step" if step is None else "at step %d" % step
  if latest is None:
    after = "%s holds no checkpoint yet" % model_dir
  else:
    after = ("the last checkpoint in %s (step %d) is intact and the same "
             "command resumes from it" % (model_dir, latest))
  return ("%s %s; not a preemption, so not retried. %s. %s."
          % (failure, where, fix, after[0].upper() + after[1:]))


def _events_files(model_dir):
  return set(tf.io.gfile.glob(os.path.join(model_dir, "events.out.tfevents.*")))


def _discard_failed_attempt(model_dir, start, events_before):
  """An attempt that saved no new checkpoint leaves no events file."""
  tf.summary.FileWriterCache.clear()  # close the writers before deleting
  if (checkpoints.latest_step(model_dir) or 0) > start:
    return
  for path in _events_files(model_dir) - events_before:
    tf.io.gfile.remove(path)


@gin.configurable(module="mtf_th", denylist=["estimator", "vocabulary"])
def train_model(estimator, vocabulary, sequence_length, batch_size,
                train_dataset_fn, train_steps, ensemble_inputs,
                dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False,
                seed=1234, log_every_steps=1, print_every_secs=10.0,
                keep_checkpoint_steps=(), write_graph=False, hooks=(),
                trace_every_steps=0):
  """utils.run's train_model_fn: mtf's train_model, reproducible and logged.

  Same arguments as mesh_tensorflow.transformer.utils.train_model, plus:

  Args:
    seed: graph-level seed (initialisation and any random op).
    log_every_steps: a train_log.csv row every this many steps.
    print_every_secs: a progress line at most this often.
    keep_checkpoint_steps: steps whose checkpoints are never deleted (e.g.
      the sweep's eval steps), besides the last utils.run.keep_checkpoint_max
      ones, the step this run starts from and the steps in
      eval_results.csv.
    write_graph: also write graph.pbtxt, model.ckpt-N.meta and the graph to
      the events file (each about the size of the graph, e.g. 10 MB).
    hooks: extra tf.train.SessionRunHook objects.
    trace_every_steps: N > 0 writes a full trace of every N-th step to
      <model_dir>/trace/timeline-<step>.json (Chrome trace format: one
      process per device, e.g. /job:worker/replica:0/task:1/device:CPU:0).
  Raises:
    TrainingError: an op failed (the first failure stops the run).
    Interrupted: Ctrl-C, or SIGTERM under `mtf_th`.
  """
  del vocabulary
  if checkpoint_input_pipeline:
    raise errors.ConfigError("checkpoint_input_pipeline is not supported by "
                             "mtf_th.train_model; it uses skip_seen_data")
  estimator_lib.configure_estimator(estimator, seed)
  model_dir = estimator.model_dir
  start = checkpoints.latest_step(model_dir) or 0
  if start >= train_steps:
    print("[train] %s is already at step %d >= train_steps %d; nothing to do"
          % (model_dir, start, train_steps), file=sys.stderr, flush=True)
    return

  def input_fn(params):
    del params
    dataset = train_dataset_fn(sequence_length=sequence_length,
                               vocabulary=None, dataset_split=dataset_split)
    dataset = dataset.repeat().batch(batch_size * (ensemble_inputs or 1),
                                     drop_remainder=True)
    if skip_seen_data and start > seen_data_init_step:
      tf.logging.info("Skipping %d steps of data.", start - seen_data_init_step)
      dataset = dataset.skip(start - seen_data_init_step)
    return dataset.prefetch(2)

  hook = hooks_lib.ProgressHook(model_dir, train_steps,
                                log_every_steps=log_every_steps,
                                print_every_secs=print_every_secs)
  keeper = _SaveMarkingKeeper(
      model_dir, list(keep_checkpoint_steps or ()) + [start])
  events_before = _events_files(model_dir)
  try:
    with estimator_lib.no_session_recovery(is_tpu(estimator)), \
        checkpoints.checkpoint_policy(model_dir, keeper, write_graph), \
        identity.recorded_at_first_save(model_dir):
      estimator.train(input_fn=input_fn, max_steps=train_steps,
                      hooks=[hooks_lib.OrderReadsBeforeWritesHook(), hook] +
                      _trace_hooks(model_dir, trace_every_steps) +
                      list(hooks or ()))
  except tf.errors.OpError as e:
    _discard_failed_attempt(model_dir, start, events_before)
    if stops.stop_signal() is not None:  # the op failed because of the stop
      raise errors.Interrupted(
          model_dir, checkpoints.latest_step(model_dir)) from None
    if start and isinstance(e, (tf.errors.NotFoundError,
                                tf.errors.InvalidArgumentError)) and (
                                    "checkpoint" in str(e).lower() or
                                    "restor" in str(e).lower() or
                                    "Key " in str(e)):
      raise errors.ConfigError(
          "the checkpoint in %s (step %d) does not match this configuration "
          "(%s). Use the gin files it was trained with (see its "
          "operative_config.gin) or a new --model_dir."
          % (model_dir, start, str(e).splitlines()[0])) from None
    raise (errors.lost_task_error(
        e, model_dir, checkpoints.latest_step(model_dir)) or
           errors.TrainingError(
               _op_error_message(e, model_dir, hook.last_step))) from None
  except KeyboardInterrupt:
    _discard_failed_attempt(model_dir, start, events_before)
    raise errors.Interrupted(
        model_dir, checkpoints.latest_step(model_dir)) from None
  except Exception:  # pylint: disable=broad-except
    if stops.stop_signal() is None:
      raise
    # a stop that landed in graph-building code, whose context managers
    # replace the KeyboardInterrupt (TF's variable_scope: "Improper nesting
    # of variable_scope"): still the stop's one line
    _discard_failed_attempt(model_dir, start, events_before)
    raise errors.Interrupted(
        model_dir, checkpoints.latest_step(model_dir)) from None
  reached = checkpoints.latest_step(model_dir) or 0
  if reached < train_steps and stops.stop_signal() is None:
    # the dataset is repeated: it ends early only when it yields nothing
    raise errors.TrainingError(
        "the training data ended at step %d of %d: task %r yields no "
        "example from its %s split (check its data, e.g. "
        "th_data.corpus_paths); fix it and train into a new --model_dir"
        % (reached, train_steps, models.query("MIXTURE_NAME"),
           dataset_split))


class _SaveMarkingKeeper(checkpoints.CheckpointKeeper):
  """The keeper, also marking each save in progress (runtime/stops.py: a
  forced stop waits for the save this process writes)."""

  def before_save(self, session, global_step_value):
    stops.save_started()
    super().before_save(session, global_step_value)

  def after_save(self, session, global_step_value):
    stops.save_ended()
    super().after_save(session, global_step_value)


def _trace_hooks(model_dir, every_steps):
  if not every_steps:
    return []
  return [tf.train.ProfilerHook(save_steps=every_steps, show_memory=False,
                                output_dir=os.path.join(model_dir, "trace"))]


def is_tpu(estimator):
  """A TPU run (its lost workers are preemptions); not a --cluster master."""
  return bool(estimator.config.master) and not training_cluster.active()


def train(model_dir, gin_files=(), gin_params=(), train_steps=None, tpu=None,
          tpu_zone=None, gcp_project=None):
  """Trains up to global step `train_steps`, resuming from model_dir.

  Args:
    model_dir: checkpoints, logs, operative_config.gin, train_log.csv.
    gin_files: gin files (e.g. an experiment file, then models/t5_tiny.gin).
    gin_params: extra bindings.
    train_steps: stop at this global step (default: utils.run.train_steps).
    tpu, tpu_zone, gcp_project: a Cloud TPU (launch/tpu.py); None = CPU.
  Returns:
    the rows of train_log.csv (dicts with step, loss, steps_per_sec,
    elapsed_sec).
  Raises:
    ConfigError: for any configuration problem, before a graph is built.
  """
  estimator_lib.check_model_dir(model_dir)
  extra = []
  if train_steps is not None:
    errors.positive_int("--train_steps", train_steps)
    extra.append("utils.run.train_steps = %d" % train_steps)
  prepared = setup.prepare(
      "train", model_dir, gin_files, gin_params, tpu, tpu_zone, gcp_project,
      writes=True, extra_params=extra, configure=lambda _: require_train_fn(),
      check=lambda s: errors.positive_int("train_steps", s.train_steps))
  with estimator_lib.writer_lock(model_dir):
    estimator_lib.run(model_dir, tpu, tpu_zone, gcp_project, None,
                      prepared.settings)
  return run_files.read_train_log(model_dir)


def require_train_fn():
  bound = models.query("utils.run.train_model_fn")
  if not (isinstance(bound, gin.config.ConfigurableReference)
          and bound.selector.endswith("train_model")
          and "mtf_th" in bound.selector):
    with gin.unlock_config():
      gin.bind_parameter("utils.run.train_model_fn", train_model)
