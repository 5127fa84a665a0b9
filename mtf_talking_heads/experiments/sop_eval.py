"""Sentence-order prediction (SOP) accuracy of an ALBERT checkpoint.

ALBERT's table in the paper (section 7.2) reports SOP accuracy next to MLM
accuracy.  A model trained on th_mlm_sop (objectives/mlm_sop.gin,
data/sop.py) predicts the order label ([IN_ORDER] / [SWAPPED]) at the first
position of each example.  This module scores the held-out examples of
task th_sop (the same examples, every target but the label set to -1, which
mtf weights 0) with mtf's own teacher-forced eval: its token_accuracy is then
the SOP accuracy (the argmax over the whole vocabulary must be the right
label), and its neg_log_perplexity the negative SOP loss.

  evaluate_sop(model_dir, gin_files=(), gin_params=(), checkpoint_steps=None)
      -> [dict(step, split, sop_accuracy, sop_loss, examples)]

Examples are packed as in training (th_mlm_sop's pieces are short when a
document is), so every label is scored in the context the model was
trained in.
"""
import functools
import sys

from mesh_tensorflow.transformer import dataset as transformer_dataset
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads import training
from mtf_talking_heads.training import checkpoints as checkpoints_lib
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import identity

EVAL_SEED = estimator_lib.EVAL_SEED  # fixed held-out noise, as mtf_th eval


def sop_dataset(sequence_length, split="validation", seed=EVAL_SEED,
                max_examples=None):
  """Packed th_sop rows {"inputs", "targets", *_segmentation, *_position}.

  Args:
    sequence_length: {"inputs": n, "targets": n} of the model.
    split: "validation" or "train".
    seed: seed of the segment cut, swap and corruption noise.
    max_examples: keep at most this many examples (before packing).
  Returns:
    a finite tf.data.Dataset of unbatched rows of length n.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.data import sop  # pylint: disable=g-import-not-at-top
  task = seqio.get_mixture_or_task(sop.LABEL_TASK)
  ds = task.get_dataset(sequence_length, split=split, use_cached=False,
                        shuffle=False, num_epochs=1, seed=seed)
  ds = ds.map(lambda ex: {"inputs": ex["inputs"], "targets": ex["targets"]})
  if max_examples:
    ds = ds.take(max_examples)
  return transformer_dataset.pack_or_pad(
      ds, sequence_length, pack=True, feature_keys=("inputs", "targets"))


def _count_rows(dataset_fn):
  with tf.Graph().as_default():
    n = dataset_fn().reduce(np.int64(0), lambda c, _: c + 1)
    with tf.Session() as sess:
      return int(sess.run(n))


def _score(estimator, vocabulary, sequence_length, batch_size,
           train_dataset_fn, train_steps, ensemble_inputs, results,
           checkpoints, options, **unused):
  """utils.run hook: SOP accuracy and loss of each checkpoint."""
  del vocabulary, train_dataset_fn, train_steps, ensemble_inputs, unused
  estimator_lib.configure_estimator(estimator, options["seed"])
  dataset_fn = functools.partial(sop_dataset, sequence_length,
                                 options["split"], options["seed"],
                                 options["max_examples"])
  rows = _count_rows(dataset_fn)
  if rows == 0:
    raise training.ConfigError("the %r split of th_sop is empty: nothing to "
                               "evaluate" % options["split"])

  def input_fn(params):
    del params
    ds = transformer_dataset.pad_dataset_with_zeroed_out_examples(
        dataset_fn())
    return ds.batch(batch_size, drop_remainder=True)

  for step, path in checkpoints:
    metrics = estimator.evaluate(input_fn=input_fn,
                                 steps=-(-rows // batch_size),
                                 checkpoint_path=path,
                                 name="sop_" + options["split"])
    result = {"step": step, "split": options["split"],
              "sop_accuracy": float(metrics["token_accuracy"]),
              "sop_loss": float(-metrics["neg_log_perplexity"]),
              "examples": int(metrics["num_eval_tokens"])}
    print("[sop] checkpoint %d: SOP accuracy %.4f, loss %.4f over %d "
          "examples" % (step, result["sop_accuracy"], result["sop_loss"],
                        result["examples"]), file=sys.stderr, flush=True)
    results.append(result)


def evaluate_sop(model_dir, gin_files=(), gin_params=(),
                 checkpoint_steps=None, split="validation", seed=EVAL_SEED,
                 max_examples=None):
  """SOP accuracy and loss of checkpoints of a model trained on th_mlm_sop.

  Args:
    model_dir: the trained model.
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings.
    checkpoint_steps: None (latest), "all", an int or a list of ints.
    split: the corpus split scored.
    seed: noise seed of the held-out examples.
    max_examples: score at most this many examples (None: all).
  Returns:
    [dict(step, split, sop_accuracy, sop_loss, examples)], one per
    checkpoint (accuracy in [0, 1]; loss in nats per example).
  Raises:
    ConfigError: a bad configuration, a model that is not aligned, or no
      checkpoint; before any graph is built.
  """
  estimator_lib.check_model_dir(model_dir)
  training.parse_gin(checkpoints_lib.operative_gin(model_dir, gin_files),
                     gin_params)
  settings, _ = training.preflight()
  if settings.model_type != "aligned":
    raise training.ConfigError(
        "SOP accuracy needs an aligned (ALBERT/BERT) model trained on "
        "th_mlm_sop; utils.run.model_type is %r" % settings.model_type)
  if "sop" not in str(settings.mixture):
    raise training.ConfigError(
        "the model in %s was trained on %r, which has no sentence-order "
        "labels: train with objectives/mlm_sop.gin (models/albert_base.gin "
        "does)" % (model_dir, settings.mixture))
  checkpoints = checkpoints_lib.checkpoint_paths(model_dir, checkpoint_steps)
  checkpoints_lib.match_checkpoint_dtype(checkpoints[-1][1])
  identity.check_readers([p for _, p in checkpoints],
                         identity.configured(settings))
  results = []
  fn = functools.partial(_score, results=results, checkpoints=checkpoints,
                         options={"split": split, "seed": seed,
                                  "max_examples": max_examples})
  estimator_lib.run(model_dir, None, None, None, fn, settings)
  return results
