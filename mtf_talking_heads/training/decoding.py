"""Decoding: greedy outputs of a text-to-text checkpoint.

Owns decode(): given strings, or held-out examples' inputs, the text a T5
(bitransformer) or a decoder-only model fine-tuned text-to-text
(delimited_lm: "<inputs> EOS <targets> EOS" in one sequence) generates,
decoded by the vocabulary.
"""
import functools

from mesh_tensorflow.transformer import utils as mtf_utils
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.training import errors
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import evaluation
from mtf_talking_heads.training import setup

# Model types that write targets for given inputs: an encoder-decoder, and a
# decoder-only model that continues "<inputs> EOS" (mtf's delimited_lm).
TEXT_TO_TEXT = ("bitransformer", "delimited_lm")


def _decode_inputs(task_name, sequence_length, vocabulary, inputs, count,
                   seed):
  """Input id rows: encoded `inputs` strings, or held-out examples' inputs.

  One example per row (never packed: a delimited_lm model would read a
  second input as the first one's targets), ending in EOS, zero-padded to
  sequence_length["inputs"].
  """
  length = sequence_length["inputs"]
  rows = []
  if inputs:
    for text in inputs:
      ids = list(vocabulary.encode(text))[:length - 1] + [1]
      rows.append(ids + [0] * (length - len(ids)))
  else:
    with tf.Graph().as_default():
      ds = evaluation.eval_dataset(task_name, sequence_length, "validation",
                                   seed, count, pack=False)
      it = tf.data.make_one_shot_iterator(ds).get_next()
      with tf.Session() as sess:
        try:
          while len(rows) < count:
            rows.append(list(sess.run(it)["inputs"]))
        except tf.errors.OutOfRangeError:
          pass
  return np.array(rows, dtype=np.int32)


def load_for_decoding(model_dir, gin_files, gin_params, checkpoint_step,
                      tpu, who, hint=""):
  """Checkpoint and settings of a model to decode, checked before any graph.

  setup.prepare's sequence: parses the model's operative gin (+
  gin_files/gin_params), runs the pre-flight, refuses a model that is not
  text-to-text (TEXT_TO_TEXT; a ConfigError "<who> needs a text-to-text
  model ...; this one is <model_type><hint>") and a checkpoint that does
  not match.  Returns ((step, path), settings).
  """

  def check(settings):
    if settings.model_type not in TEXT_TO_TEXT:
      raise errors.ConfigError(
          "%s needs a text-to-text model (model_type bitransformer, or "
          "delimited_lm: a decoder-only model fine-tuned with "
          "experiments/finetune_embedded_lm.gin); this one is %r%s"
          % (who, settings.model_type, hint))

  settings, _, found = setup.prepare("decode", model_dir, gin_files,
                                     gin_params, tpu, steps=checkpoint_step,
                                     check=check)
  return found[0], settings


def decode_rows(estimator, vocabulary, ids, batch_size, checkpoint):
  """Decodes the rows of `ids` with one checkpoint; returns n outputs.

  ids [n, inputs_length] int32 is padded to whole batches of batch_size;
  op errors stop with one line naming the checkpoint.
  """
  n = len(ids)
  padded = np.zeros((-(-n // batch_size) * batch_size, ids.shape[1]),
                    np.int32)
  padded[:n] = ids

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices({"inputs": padded}).batch(
        batch_size, drop_remainder=True)

  step, path = checkpoint
  with errors.op_errors_stop("decoding with checkpoint %d of %s"
                             % (step, estimator.model_dir)):
    return list(mtf_utils.decode(estimator, input_fn, vocabulary, path))[:n]


def _decode_with_estimator(estimator, vocabulary, sequence_length, batch_size,
                           train_dataset_fn, train_steps, ensemble_inputs,
                           results, checkpoint, options, **unused):
  """utils.run hook: decodes a batch of inputs with one checkpoint."""
  del train_dataset_fn, train_steps, ensemble_inputs, unused
  estimator_lib.configure_estimator(estimator, options["seed"])
  vocab = mtf_utils.inputs_vocabulary(vocabulary)
  ids = _decode_inputs(options["task"], sequence_length, vocab,
                       options["inputs"], options["count"], options["seed"])
  step, _ = checkpoint
  outputs = decode_rows(estimator, vocabulary, ids, batch_size, checkpoint)
  for row, out in zip(ids, outputs):
    text = [int(t) for t in row if t > 1]
    results.append({
        "step": step,
        "input": vocab.decode(text),
        "output": out.decode("utf-8") if isinstance(out, bytes) else out})


def decode(model_dir, gin_files=(), gin_params=(), inputs=None,
           checkpoint_step=None, num_examples=8, tpu=None, tpu_zone=None,
           gcp_project=None):
  """Greedy decoding with a text-to-text checkpoint (T5 or delimited_lm).

  Args:
    model_dir: the trained model.
    gin_files: its gin files (default: model_dir/operative_config.gin).
    gin_params: extra bindings (e.g. Bitransformer.decode.temperature, or
      Unitransformer.sample_autoregressive.temperature for delimited_lm).
    inputs: strings to decode; None: `num_examples` held-out inputs.
    checkpoint_step: a step (default: latest).
    num_examples: how many held-out inputs when `inputs` is None.
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
  Returns:
    [dict(step, input, output)] with text decoded by the vocabulary.
  Raises:
    ConfigError: bad configuration, missing checkpoint, not a text-to-text
      model.
    TrainingError: an op failed (one line: the op, the cause, the fix).
  """
  estimator_lib.check_model_dir(model_dir)
  checkpoint, settings = load_for_decoding(
      model_dir, gin_files, gin_params, checkpoint_step, tpu, "decode",
      ": score it with mtf_th eval")
  if inputs is not None and not all(isinstance(s, str) and s.strip()
                                    for s in inputs):
    raise errors.ConfigError("--inputs: every input must be a non-empty string")
  results = []
  options = {"task": settings.mixture, "inputs": inputs,
             "count": int(num_examples), "seed": estimator_lib.EVAL_SEED}
  fn = functools.partial(_decode_with_estimator, results=results,
                         checkpoint=checkpoint, options=options)
  with errors.op_errors_stop("decoding with %s" % model_dir):
    estimator_lib.run(model_dir, tpu, tpu_zone, gcp_project, fn, settings)
  return results
