"""Downstream metrics: decode a fine-tuned checkpoint, score with the tasks' metric_fns.

Owns score(): for every task of a mixture (or one task) that has a
validation split and prediction metrics (seqio ``metric_fns``, e.g. t5's
accuracy and SQuAD exact match / F1), greedy-decode its held-out inputs with
one checkpoint of a text-to-text model (T5, or delimited_lm), post-process
predictions and targets with the task's ``postprocess_fn`` (as seqio's
evaluator does) and append one line per (task, metric) to
``<model_dir>/downstream_results.csv``:

  task,metric,value,step,examples
  th_embedded_next_word_bytes,f1,12.5,8,16

Values are on the metric's own scale (t5's: 0-100).
"""
import csv
import functools
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.training import decoding
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import estimator as estimator_lib

DOWNSTREAM_RESULTS = "downstream_results.csv"
COLUMNS = ("task", "metric", "value", "step", "examples")


def scored_tasks(name, split="validation"):
  """The tasks of mixture-or-task `name` that have `split` and metric_fns.

  Raises:
    ConfigError: when none has (e.g. a pre-training task), naming the fix.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  provider = seqio.get_mixture_or_task(name)
  tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
  tasks = [t for t in tasks if t.predict_metric_fns and split in t.splits]
  if not tasks:
    raise errors.ConfigError(
        "%s has no task with a %r split and metric_fns: score a fine-tuned "
        "model (MIXTURE_NAME = 'th_finetune_embedded', or "
        "--gin_param=\"mtf_th.evaluate_checkpoints.mixture_or_task_name = "
        "'...'\")" % (name, split))
  return tasks


def task_examples(task, sequence_length, split, max_examples):
  """The first max_examples (all if None) held-out examples, as numpy dicts."""
  rows = []
  with tf.Graph().as_default():
    ds = task.get_dataset(sequence_length, split=split, use_cached=False,
                          shuffle=False, num_epochs=1, seed=estimator_lib.EVAL_SEED)
    if max_examples:
      ds = ds.take(max_examples)
    it = tf.data.make_one_shot_iterator(ds).get_next()
    with tf.Session() as sess:
      try:
        while True:
          rows.append(sess.run(it))
      except tf.errors.OutOfRangeError:
        pass
  return rows


def _text(value):
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def metric_values(task, examples, outputs):
  """{metric: value} of one task: its postprocess_fn, then its metric_fns.

  Args:
    task: a seqio.Task.
    examples: its held-out examples (numpy dicts with targets_pretokenized).
    outputs: the decoded model outputs (str), one per example.
  """
  targets = [task.postprocess_fn(_text(ex["targets_pretokenized"]),
                                 example=ex, is_target=True)
             for ex in examples]
  predictions = [task.postprocess_fn(out, example=ex, is_target=False)
                 for ex, out in zip(examples, outputs)]
  values = {}
  for fn in task.predict_metric_fns:
    for key, value in fn(targets, predictions).items():
      values[key] = float(getattr(value, "value", value))
  return values


def _input_rows(examples, length):
  ids = np.zeros((len(examples), length), np.int32)
  for i, ex in enumerate(examples):
    row = list(ex["inputs"])[:length]
    ids[i, :len(row)] = row
  return ids


def _score_with_estimator(estimator, vocabulary, sequence_length, batch_size,
                          train_dataset_fn, train_steps, ensemble_inputs,
                          results, checkpoint, options, **unused):
  """utils.run hook: decodes every task's held-out inputs, scores them."""
  del train_dataset_fn, train_steps, ensemble_inputs, unused
  estimator_lib.configure_estimator(estimator, estimator_lib.EVAL_SEED)
  per_task = [(t, task_examples(t, sequence_length, options["split"],
                                options["max_examples"]))
              for t in options["tasks"]]
  examples = [ex for _, exs in per_task for ex in exs]
  ids = _input_rows(examples, sequence_length["inputs"])
  step, _ = checkpoint
  print("[score] checkpoint %d: decoding %d examples of %d tasks"
        % (step, len(ids), len(per_task)), file=sys.stderr, flush=True)
  outputs = [_text(o) for o in decoding.decode_rows(
      estimator, vocabulary, ids, batch_size, checkpoint)]
  start = 0
  for task, exs in per_task:
    values = metric_values(task, exs, outputs[start:start + len(exs)])
    start += len(exs)
    for metric, value in sorted(values.items()):
      results.append({"task": task.name, "metric": metric, "value": value,
                      "step": step, "examples": len(exs)})
      print("[score] %s %s = %.3f (%d examples)"
            % (task.name, metric, value, len(exs)), file=sys.stderr,
            flush=True)


def read_results(model_dir):
  """Rows of <model_dir>/downstream_results.csv (value float, step int)."""
  path = os.path.join(model_dir, DOWNSTREAM_RESULTS)
  if not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    r["value"] = float(r["value"])
    r["step"] = int(r["step"])
    r["examples"] = int(r["examples"])
  return rows


def write_results(model_dir, results):
  """Adds `results` to downstream_results.csv, replacing the same
  (task, metric, step); written to a temporary name, then renamed."""
  new = {(r["task"], r["metric"], r["step"]) for r in results}
  rows = [r for r in read_results(model_dir)
          if (r["task"], r["metric"], r["step"]) not in new] + list(results)
  rows.sort(key=lambda r: (r["step"], r["task"], r["metric"]))
  path = os.path.join(model_dir, DOWNSTREAM_RESULTS)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
      writer.writerow([r["task"], r["metric"], "%.6f" % r["value"],
                       r["step"], r["examples"]])
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def score(model_dir, gin_files=(), gin_params=(), checkpoint_step=None,
          mixture_or_task_name=None, max_examples=None, split="validation",
          tpu=None, tpu_zone=None, gcp_project=None):
  """Downstream metrics of one checkpoint; also in downstream_results.csv.

  Args:
    model_dir: a fine-tuned text-to-text model (bitransformer, delimited_lm).
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings.
    checkpoint_step: a step (default: latest).
    mixture_or_task_name: what to score (default: the model's MIXTURE_NAME).
    max_examples: at most this many held-out examples per task (None: all).
    split: the held-out split ("validation": the dev sets of GLUE/SQuAD).
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    [dict(task, metric, value, step, examples)].
  Raises:
    ConfigError: bad configuration, no checkpoint, not a text-to-text
      model, or nothing to score.
    TrainingError: an op failed.
  """
  estimator_lib.check_model_dir(model_dir)
  if max_examples is not None:
    errors.positive_int("--max_eval_examples", max_examples)
  checkpoint, settings = decoding.load_for_decoding(
      model_dir, gin_files, gin_params, checkpoint_step, tpu,
      "downstream metrics decode text: scoring")
  options = {"tasks": scored_tasks(mixture_or_task_name or settings.mixture,
                                   split),
             "split": split, "max_examples": max_examples}
  results = []
  fn = functools.partial(_score_with_estimator, results=results,
                         checkpoint=checkpoint, options=options)
  with errors.op_errors_stop("scoring %s" % model_dir):
    estimator_lib.run(model_dir, tpu, tpu_zone, gcp_project, fn, settings)
  write_results(model_dir, results)
  return results
