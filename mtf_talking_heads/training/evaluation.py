"""Evaluation: held-out ln(PPL) of checkpoints.

Owns mtf_th.evaluate_checkpoints (the gin-configurable eval settings), the
finite, deterministic held-out dataset (also decoding's source of inputs)
and evaluate(): the mean token cross-entropy in nats over the split's
target tokens, per checkpoint, written to eval_results.csv as soon as that
checkpoint is scored (a stopped eval keeps the ones it printed).
"""
import functools
import sys

import gin
from mesh_tensorflow.transformer import dataset as transformer_dataset
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import cluster as training_cluster
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import setup


@gin.configurable(module="mtf_th")
def evaluate_checkpoints(mixture_or_task_name=None, split="validation",
                         max_eval_examples=None,
                         seed=estimator_lib.EVAL_SEED):
  """Gin-configurable evaluation settings (bound in gin/objectives/*.gin).

  Args:
    mixture_or_task_name: the task whose held-out split is scored.
    split: the split ("validation").
    max_eval_examples: score at most this many examples (None: all).
    seed: seed of the corruption noise of the held-out examples, so every
      checkpoint is scored on identical inputs.
  Returns:
    dict of the settings.
  """
  return {"mixture_or_task_name": mixture_or_task_name, "split": split,
          "max_eval_examples": max_eval_examples, "seed": seed}


def eval_dataset(task_name, sequence_length, split, seed, max_examples,
                 pack=True):
  """A finite, deterministic dataset of held-out examples (unbatched).

  Every held-out example once: a mixture's tasks are interleaved by its
  rates (seed `seed`) until all are read, where seqio's own mixing stops
  when the first task runs out (stop_on_empty_dataset), which would leave
  out a seed-dependent part of the others.
  pack=True (scoring) packs short examples into one row, as training does;
  pack=False (decoding) gives one example per row, padded.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  provider = seqio.get_mixture_or_task(task_name)
  tasks = (provider.tasks if isinstance(provider, seqio.Mixture)
           else [provider])
  for task in tasks:
    if split not in task.splits:
      raise errors.ConfigError("task %s has no %r split (it has %s)"
                               % (task.name, split, ", ".join(task.splits)))
  datasets = [t.get_dataset(sequence_length, split=split, use_cached=False,
                            shuffle=False, num_epochs=1, seed=seed)
              for t in tasks]
  feature_keys = tuple(k for k in provider.output_features
                       if all(k in tf.data.get_output_shapes(d)
                              for d in datasets))
  eos_keys = set(k for k, f in provider.output_features.items() if f.add_eos)
  datasets = [d.map(lambda ex: {k: ex[k] for k in feature_keys})
              for d in datasets]
  ds = datasets[0]
  if len(datasets) > 1:
    rates = [float(provider.get_rate(t)) for t in tasks]
    ds = tf.data.Dataset.sample_from_datasets(
        datasets, weights=[r / sum(rates) for r in rates], seed=seed,
        stop_on_empty_dataset=False)
  ds = transformer_dataset.pack_or_pad(ds, sequence_length, pack=pack,
                                       feature_keys=feature_keys,
                                       ensure_eos=eos_keys)
  ds = ds.map(compat.mtf_filter_features())
  if max_examples:
    ds = ds.take(max_examples)
  return ds


def _count(dataset_fn):
  with tf.Graph().as_default():
    ds = dataset_fn()
    n = ds.reduce(np.int64(0), lambda c, _: c + 1)
    with tf.Session() as sess:
      return int(sess.run(n))


def _eval_with_estimator(estimator, vocabulary, sequence_length, batch_size,
                         train_dataset_fn, train_steps, ensemble_inputs,
                         results, paths, options, **unused):
  """utils.run hook: scores each checkpoint's held-out ln(PPL)."""
  del vocabulary, train_dataset_fn, train_steps, ensemble_inputs, unused
  estimator_lib.configure_estimator(estimator, options["seed"])
  dataset_fn = functools.partial(
      eval_dataset, options["mixture_or_task_name"], sequence_length,
      options["split"], options["seed"], options["max_eval_examples"])
  n = _count(dataset_fn)
  if n == 0:
    raise errors.ConfigError(
        "the %r split of %s is empty: nothing to evaluate"
        % (options["split"], options["mixture_or_task_name"]))
  steps = -(-n // batch_size)

  def input_fn(params):
    del params
    ds = transformer_dataset.pad_dataset_with_zeroed_out_examples(dataset_fn())
    return ds.batch(batch_size, drop_remainder=True)

  for step, path in paths:
    print("[eval] checkpoint %d: %d rows of packed examples in %d batches "
          "of %d (%s split)"
          % (step, n, steps, batch_size, options["split"]), file=sys.stderr,
          flush=True)
    with errors.op_errors_stop("evaluating checkpoint %d of %s (%s split)"
                         % (step, estimator.model_dir, options["split"])):
      metrics = estimator.evaluate(input_fn=input_fn, steps=steps,
                                   checkpoint_path=path,
                                   name=options["split"])
    result = {"step": step, "split": options["split"],
              "ln_ppl": float(-metrics["neg_log_perplexity"]),
              "tokens": int(metrics["num_eval_tokens"])}
    # recorded as soon as it is printed: a stopped eval keeps it
    run_files.write_eval_results(estimator.model_dir, [result])
    training_cluster.scored(step)  # --cluster: a lost task's line says so
    print("[eval] checkpoint %d: ln(PPL) %.4f over %d tokens"
          % (step, result["ln_ppl"], result["tokens"]), file=sys.stderr,
          flush=True)
    results.append(result)


def evaluate(model_dir, gin_files=(), gin_params=(), checkpoint_steps=None,
             tpu=None, tpu_zone=None, gcp_project=None):
  """Held-out ln(PPL) of checkpoints; also written to eval_results.csv.

  Args:
    model_dir: the trained model.
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings (e.g. mtf_th.evaluate_checkpoints.split).
    checkpoint_steps: None (latest), "all", an int or a list of ints.
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    [dict(step=int, split=str, ln_ppl=float, tokens=int)], one per checkpoint.
  Raises:
    ConfigError: bad configuration or missing checkpoints.
    TrainingError: an op failed (one line: the op, the cause, the fix).
  """
  estimator_lib.check_model_dir(model_dir)
  try:  # written after each checkpoint: refused now if it cannot be read
    run_files.check_file(model_dir, run_files.EVAL_RESULTS)
  except run_files.DamagedFile as e:
    raise errors.ConfigError(str(e)) from None
  settings, _, paths = setup.prepare("eval", model_dir, gin_files, gin_params,
                                     tpu, steps=checkpoint_steps)
  options = evaluate_checkpoints()
  options["mixture_or_task_name"] = (options["mixture_or_task_name"] or
                                     settings.mixture)
  results = []
  fn = functools.partial(_eval_with_estimator, results=results,
                         paths=paths, options=options)
  with errors.op_errors_stop("evaluating %s" % model_dir):
    estimator_lib.run(model_dir, tpu, tpu_zone, gcp_project, fn, settings)
  return results
