"""ALBERT's pre-training objective: masked LM + sentence-order prediction.

Registered on import (the data package imports this module):

  th_mlm_sop  ALBERT's objective for an aligned (non-autoregressive)
              Unitransformer: BERT-style masked LM on two consecutive
              segments whose order is swapped half of the time, and the
              order label predicted at the first position.
  th_sop      the same examples with only the label as target (every other
              target is -1, mtf's "no loss" value): scoring it gives the SOP
              loss and accuracy (mtf_talking_heads.experiments.sop_eval).

One example (sop_mlm), from a document's token pieces:

  piece:    t1 ... tn                    (n >= 2, at most length - 3 tokens)
  A, B:     t1..tc, tc+1..tn             (c uniform in 1 .. n-1)
  order:    A B, or B A with probability swap_probability (0.5)
  inputs:   [CLS] x1 .. [SEP] .. xn EOS  (x: the ordered tokens, BERT's 15%
                                          corruption; [CLS], [SEP] never)
  targets:  LABEL  t.. [SEP] .. t.. EOS  (LABEL: [IN_ORDER] or [SWAPPED])

[CLS], [SEP], [IN_ORDER] and [SWAPPED] are the sentinels <extra_id_1> ..
<extra_id_4> (<extra_id_0> is the mask token).  The targets are the whole
uncorrupted sequence, as in th_mlm (tasks.mlm: mtf weights every position
with a target > 0), so the label position is one more weighted position,
with the same weight as each token.

How this differs from ALBERT (docs/training.md lists it too):
  * ALBERT predicts the order with a pooler (dense + tanh on the [CLS]
    output) and a 2-way classifier; here the label is a token predicted
    through the model's output softmax (the shared embedding) at the first
    position, so the SOP loss is a cross entropy over the whole vocabulary,
    weighted like one MLM position rather than added as a separate mean.
  * ALBERT splits a document's chunk between sentences and adds segment
    (token-type) embeddings; here the cut is at a random token and the
    segments are told apart only by [SEP] (mtf's Unitransformer has no
    token-type embedding).  The final [SEP] is the EOS.
  * Pieces come from one document each (A and B are always consecutive
    text of one document, as in ALBERT); a document's last, shorter piece
    gives a shorter example, which training packs with others.
"""

import gin
import seqio
from t5.data import preprocessors as t5_preprocessors
import tensorflow.compat.v2 as tf

from mtf_talking_heads.data import tasks
from mtf_talking_heads.data import vocab

TRAIN_TASK = "th_mlm_sop"
LABEL_TASK = "th_sop"
# sentinel numbers (<extra_id_k>); <extra_id_0> is the MLM mask token
CLS, SEP, IN_ORDER, SWAPPED = 1, 2, 3, 4
NO_LOSS = -1  # mtf: targets <= 0 carry no weight; -1 is not padding


def special_id(vocabulary, k):
  """Id of <extra_id_k> (t5's convention: <extra_id_0> is the last id)."""
  return vocabulary.vocab_size - 1 - k


def label_ids(vocabulary):
  """(in-order id, swapped id) of a vocabulary."""
  return special_id(vocabulary, IN_ORDER), special_id(vocabulary, SWAPPED)


def _check_probability(name, value):
  if not isinstance(value, (int, float)) or not 0 <= value <= 1:
    raise ValueError("th_data.sop_mlm.%s must be in [0, 1], got %r"
                     % (name, value))


def _ordered_pair(tokens, seeds, swap_probability):
  """(the piece with its two segments in training order, length of the
  first segment, whether they were swapped): e.g. tokens t1..t5 cut after
  t2 and swapped give (t3 t4 t5 t1 t2, 3, True)."""
  n = tf.size(tokens)
  cut = tf.random.stateless_uniform([], seed=seeds[0], minval=1, maxval=n,
                                    dtype=tf.int32)
  swapped = tf.random.stateless_uniform([], seed=seeds[1]) < swap_probability
  a, b = tokens[:cut], tokens[cut:]
  first = tf.where(swapped, tf.concat([b, a], 0), tf.concat([a, b], 0))
  first_len = tf.where(swapped, n - cut, cut)
  return first, first_len, swapped


def _sop_example(tokens, seeds, vocabulary, swap_probability, noise_density,
                 mask_rate, random_rate):
  """{"inputs", "targets"} of one piece (see the module docstring)."""
  ordered, first_len, swapped = _ordered_pair(tokens, seeds, swap_probability)
  dtype = tokens.dtype
  cls = tf.constant([special_id(vocabulary, CLS)], dtype)
  sep = tf.constant([special_id(vocabulary, SEP)], dtype)
  sequence = tf.concat([cls, ordered[:first_len], sep, ordered[first_len:]], 0)
  positions = tf.range(tf.size(sequence))
  special = tf.logical_or(tf.equal(positions, 0),
                          tf.equal(positions, first_len + 1))
  noise = tf.logical_and(
      tf.random.stateless_uniform(tf.shape(sequence), seed=seeds[2])
      < noise_density, tf.logical_not(special))
  inputs = tasks.bert_corrupt_tokens(sequence, noise, vocabulary,
                                     seeds=[seeds[3], seeds[4]],
                                     mask_rate=mask_rate,
                                     random_rate=random_rate)
  in_order, swapped_id = label_ids(vocabulary)
  label = tf.where(swapped, tf.constant(swapped_id, dtype),
                   tf.constant(in_order, dtype))
  targets = tf.concat([tf.reshape(label, [1]), sequence[1:]], 0)
  return {"inputs": inputs, "targets": targets}


@gin.configurable(module="th_data")
def sop_mlm(dataset, sequence_length, output_features, swap_probability=0.5,
            noise_density=0.15, mask_rate=0.8, random_rate=0.1):
  """ALBERT's masked LM + sentence-order prediction examples.

  Each document is cut into pieces of at most L - 2 tokens, L =
  min(inputs, targets length) - 1 (room for [CLS], [SEP] and EOS); pieces
  of fewer than 2 tokens are dropped; each piece becomes one example (see
  the module docstring).  E.g. with length 64, a 62-token piece cut after
  token 20 and swapped gives inputs [CLS] t21..t62 [SEP] t1..t20 (corrupted)
  and targets [SWAPPED] t21..t62 [SEP] t1..t20, each 64 ids with the EOS
  appended by the task's append_eos_after_trim.

  Args:
    dataset: tokenized documents {"targets": int32 [n]}.
    sequence_length: {"inputs": int, "targets": int} (None: the th_data
      default).
    output_features: the task's features (their vocabulary).
    swap_probability: chance that B comes before A (ALBERT: 0.5).
    noise_density, mask_rate, random_rate: BERT's corruption (tasks.mlm).
  Returns:
    a dataset of {"inputs", "targets"}.
  """
  _check_probability("swap_probability", swap_probability)
  _check_probability("noise_density", noise_density)
  lengths = tasks._lengths(sequence_length)  # pylint: disable=protected-access
  piece = min(lengths["inputs"], lengths["targets"]) - 3
  if piece < 2:
    raise ValueError("th_mlm_sop needs a sequence length of at least 5 "
                     "([CLS], two tokens, [SEP], EOS), got %s" % lengths)
  vocabulary = output_features["targets"].vocabulary
  ds = t5_preprocessors.split_tokens(
      dataset, feature_key="targets", min_tokens_per_segment=None,
      max_tokens_per_segment=piece)
  ds = ds.filter(lambda ex: tf.size(ex["targets"]) >= 2)

  @seqio.map_over_dataset(num_seeds=5)
  def make(ex, seeds):
    return _sop_example(ex["targets"], seeds, vocabulary, swap_probability,
                        noise_density, mask_rate, random_rate)

  return make(ds)


@seqio.map_over_dataset
def label_only(ex):
  """Keeps only the first target (the SOP label); the rest carry no loss."""
  targets = ex["targets"]
  rest = tf.fill(tf.shape(targets[1:]), tf.constant(NO_LOSS, targets.dtype))
  return dict(ex, targets=tf.concat([targets[:1], rest], 0))


def _register(name, extra_preprocessors=()):
  # the corpus is read lazily: gin th_data.corpus_paths
  tasks.add_text_task(name, tasks.CorpusSource(None), sop_mlm,
                      vocab.get_vocabulary(), extra_preprocessors)


_register(TRAIN_TASK)
_register(LABEL_TASK, [label_only])
