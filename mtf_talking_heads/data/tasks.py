"""seqio tasks: pre-training objectives over local text, and t5's standard tasks.

Registered on import (nothing is read, trained or downloaded until a dataset
is requested):

  th_span_corruption  t5's span corruption (as c4_v220_span_corruption: mean
                      span 3, 15% noise, one sentinel per span; targets are the
                      dropped spans, each after its sentinel).
  th_mlm              BERT-style masked LM for encoder-only models (see mlm()).
  th_prefix_lm        t5's prefix LM (inputs: a prefix, targets: the rest).
  th_lm_bytes         decoder-only language modelling on the corpus's UTF-8
                      bytes (seqio.ByteVocabulary): targets only, long
                      documents cut to the targets length, short ones packed.
  th_prefix_lm_bytes  th_prefix_lm on bytes, for encoder-decoder models.
  th_span_corruption_bytes
                      th_span_corruption on bytes (seqio.ByteVocabulary, no
                      extra ids): the sentinels are the vocabulary's last
                      ids, the bytes 0xFF, 0xFE, ..., never in UTF-8 text.
  th_finetune_squad_glue_superglue
                      mixture of SQuAD + GLUE + SuperGLUE, examples-
                      proportional (the paper's fine-tuning mixture).

The th_* pre-training tasks read the corpus chosen by gin
``th_data.corpus_paths`` (default: the embedded corpus, corpus.py) and use the
vocabulary chosen by ``th_data.vocabulary_options`` (default: trained locally,
vocab.py).  For your own files without gin, use register_text_tasks().

Importing this module also imports t5.data.mixtures, which registers t5's
tasks and mixtures (c4_v220_span_corruption, glue_v002_proportional,
super_glue_v102_proportional, squad_v010_allanswers, ...).  Registration does
not touch the network; *reading* those datasets needs them prepared in
$TFDS_DATA_DIR and t5's default vocabulary (a gs:// path): this package never
downloads them.
"""
import functools

import gin
import seqio
import t5.data
from t5.data import glue_utils
from t5.data import preprocessors as t5_preprocessors
import t5.data.mixtures  # noqa: F401  pylint: disable=unused-import  (registers t5's tasks)
import tensorflow.compat.v2 as tf

from mtf_talking_heads.data import corpus
from mtf_talking_heads.data import vocab

OBJECTIVES = ("span_corruption", "mlm", "prefix_lm", "lm")
# Byte-level tasks: no vocabulary to train, 259 ids (3 special + 256 bytes),
# the model sees characters, so small models leave the unigram plateau fast.
BYTE_OBJECTIVES = ("lm", "prefix_lm", "span_corruption")
PRETRAINING_TASKS = tuple("th_" + o for o in OBJECTIVES if o != "lm") + tuple(
    "th_%s_bytes" % o for o in BYTE_OBJECTIVES)
FINETUNE_MIXTURE = "th_finetune_squad_glue_superglue"
# t5's own names; all registered by importing t5.data.mixtures.
STANDARD_TASKS = (
    "c4_v220_span_corruption",
    "c4_v220_iid_denoising",
    "glue_v002_proportional",
    "super_glue_v102_proportional",
    "squad_v010_allanswers",
)
# SQuAD v1.1 train examples: what t5.data.rate_num_examples returns for
# squad_v010_allanswers, written out so the mixture's rates need no dataset
# metadata (t5's GLUE/SuperGLUE weights are written out the same way).
SQUAD_V11_TRAIN_EXAMPLES = 87_599


# ------------------------------------------------------------------- source


def _parse_text_example(serialized):
  return tf.io.parse_single_example(
      serialized, {"text": tf.io.FixedLenFeature([], tf.string)})


class CorpusSource(seqio.DataSource):
  """Yields {"text": tf.string} from text lines or TFRecords of tf.train.Example.

  resolved: a dict as returned by corpus.resolve_corpus (fixed files), or None
  to read gin's th_data.corpus_paths each time a dataset is built (the default
  corpus is then built on first use).  Empty and whitespace-only lines are
  skipped.  Files are read in sorted order, so with shuffle=False the order of
  examples is fixed.
  """

  def __init__(self, resolved=None):
    super().__init__(splits=corpus.SPLITS)
    self._resolved = resolved

  def resolved(self):
    return self._resolved if self._resolved is not None else corpus.configured_corpus()

  @property
  def supports_arbitrary_sharding(self):
    return False

  def list_shards(self, split):
    return list(self.resolved()[split])

  def num_input_examples(self, split):
    cfg = self.resolved()
    if cfg.get("default"):
      return corpus.stats()["documents"][split]
    return None

  def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None,
                  *, sequence_length=None, use_cached=False, num_epochs=1):
    del sequence_length, use_cached, num_epochs
    cfg = self.resolved()
    if split not in cfg:
      raise ValueError("Unknown split %r; use one of %s" % (split, corpus.SPLITS))
    files = list(cfg[split])
    files_ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
    if shard_info:
      files_ds = files_ds.shard(shard_info.num_shards, shard_info.index)
    if shuffle and len(files) > 1:
      files_ds = files_ds.shuffle(len(files), seed=seed)
    if cfg["file_format"] == corpus.TFRECORD:
      def read(f):
        return tf.data.TFRecordDataset(f).map(_parse_text_example)
    else:
      def read(f):
        return tf.data.TextLineDataset(f).map(lambda s: {"text": s})
    ds = files_ds.interleave(read, cycle_length=16, block_length=16,
                             num_parallel_calls=tf.data.AUTOTUNE,
                             deterministic=True)
    return ds.filter(
        lambda ex: tf.strings.length(tf.strings.strip(ex["text"])) > 0)


# ------------------------------------------------------------ preprocessors


@gin.configurable(module="th_data")
def default_sequence_length(inputs=512, targets=512):
  """Lengths used when a th_* task is asked for sequence_length=None.

  (t5's MtfModel.eval asks for the targets with sequence_length=None, which
  makes t5's span_corruption raise a TypeError.)  Span corruption derives its
  targets length from the inputs length instead of using `targets`.
  """
  return {"inputs": inputs, "targets": targets}


def _lengths(sequence_length):
  default = default_sequence_length()
  sequence_length = dict(sequence_length or {})
  for k in ("inputs", "targets"):
    if sequence_length.get(k) is None:
      sequence_length[k] = default[k]
  return sequence_length


def span_corruption_targets_length(inputs_length, mean_noise_span_length=3.0,
                                   noise_density=0.15):
  """Targets length (with EOS) that t5's span corruption needs for inputs_length."""
  return t5_preprocessors.random_spans_helper(
      inputs_length=inputs_length, noise_density=noise_density,
      mean_noise_span_length=mean_noise_span_length,
      extra_tokens_per_span_inputs=1, extra_tokens_per_span_targets=1)[1]


@gin.configurable(module="th_data")
def span_corruption(dataset, sequence_length, output_features,
                    mean_noise_span_length=3.0, noise_density=0.15):
  """t5.data.preprocessors.span_corruption (as c4_v220_span_corruption).

  Documents are concatenated (128 at a time) and cut into pieces that become
  exactly sequence_length["inputs"] tokens after noising; each noise span is
  replaced by one sentinel (<extra_id_0>, <extra_id_1>, ...) in the inputs and
  the targets are the sentinels each followed by its dropped span.  Targets
  need span_corruption_targets_length(inputs) tokens (114 for 512, 14 for 64).
  """
  lengths = _lengths(sequence_length)
  if sequence_length is None or sequence_length.get("targets") is None:
    lengths["targets"] = span_corruption_targets_length(
        lengths["inputs"], mean_noise_span_length, noise_density)
  return t5_preprocessors.span_corruption(
      dataset, sequence_length=lengths, output_features=output_features,
      mean_noise_span_length=mean_noise_span_length, noise_density=noise_density)


def bert_corrupt_tokens(tokens, noise_mask, vocabulary, seeds, mask_rate=0.8,
                        random_rate=0.1):
  """BERT's corruption of the noise tokens (a t5 denoise inputs_fn).

  Of the tokens selected by noise_mask: mask_rate become the mask token
  (<extra_id_0>, the id t5's noise_token_to_sentinel uses), random_rate a
  random ordinary piece (ids 3 .. base vocab size - 1: no pad/eos/unk, no
  sentinel), the rest stay unchanged.
  """
  u = tf.random.stateless_uniform(tf.shape(tokens), seed=seeds[0])
  base_size = vocabulary.vocab_size - vocabulary.extra_ids
  random_tokens = tf.random.stateless_uniform(
      tf.shape(tokens), minval=3, maxval=base_size, dtype=tokens.dtype,
      seed=seeds[1])
  mask_id = tf.cast(t5_preprocessors.sentinel_id(vocabulary), tokens.dtype)
  out = tf.where(noise_mask & (u < mask_rate), mask_id, tokens)
  use_random = noise_mask & (u >= mask_rate) & (u < mask_rate + random_rate)
  return tf.where(use_random, random_tokens, out)


@gin.configurable(module="th_data")
def mlm(dataset, sequence_length, output_features, noise_density=0.15,
        mask_rate=0.8, random_rate=0.1):
  """BERT-style masked language modelling, for an encoder-only model.

  Documents are concatenated (128 at a time) and cut into pieces of
  L = min(inputs, targets length) - 1 tokens.  Each token is selected
  independently with probability noise_density (t5's iid_noise_mask); a
  selected token becomes the mask token <extra_id_0> (80%), a random piece
  (10%) or stays (10%).  Then EOS is appended to both, so:

    inputs:  the corrupted L tokens + EOS
    targets: the original  L tokens + EOS (the full sequence, aligned
             position by position with inputs; not only the masked tokens)

  A model trained on it (e.g. a non-autoregressive mtf Unitransformer)
  predicts targets[i] from inputs.  mtf weights every position with
  targets > 0, i.e. all of the L tokens + EOS, masked and unmasked alike:
  the training loss is the summed cross entropy over those positions divided
  by the size of the targets tensor (batch x length, unless
  Unitransformer.loss_denominator is set), and mtf's perplexity eval
  (neg_log_perplexity, token_accuracy) averages over those positions.  So
  th_mlm's eval loss is per token of the full sequence, not BERT's
  masked-positions-only loss; ~13.5% of positions are visibly corrupted.
  """
  lengths = _lengths(sequence_length)
  length = min(lengths["inputs"], lengths["targets"]) - 1
  ds = t5_preprocessors.select_random_chunk(
      dataset, output_features=output_features, feature_key="targets",
      max_length=65536)
  ds = t5_preprocessors.reduce_concat_tokens(ds, feature_key="targets",
                                             batch_size=128)
  ds = t5_preprocessors.split_tokens(ds, feature_key="targets",
                                     min_tokens_per_segment=None,
                                     max_tokens_per_segment=length)
  return t5_preprocessors.denoise(
      ds, output_features, noise_density=noise_density,
      noise_mask_fn=t5_preprocessors.iid_noise_mask,
      inputs_fn=functools.partial(bert_corrupt_tokens, mask_rate=mask_rate,
                                  random_rate=random_rate),
      targets_fn=None)


@gin.configurable(module="th_data")
def prefix_lm(dataset, sequence_length, output_features, noise_density=0.5):
  """t5.data.preprocessors.prefix_lm: split a piece at a random point.

  Pieces of inputs length - 1 tokens are cut at a random point; inputs are
  the prefix, targets the rest (each + EOS).
  """
  return t5_preprocessors.prefix_lm(
      dataset, sequence_length=_lengths(sequence_length),
      output_features=output_features, noise_density=noise_density)


def lm(dataset, sequence_length, output_features):
  """Language modelling: each document as targets, cut into pieces of at
  most sequence_length["targets"] - 1 tokens (room for EOS); training and
  evaluation pack the short pieces together (mesh_train_dataset_fn,
  training/evaluation.py)."""
  return t5_preprocessors.split_tokens_to_targets_length(
      dataset, sequence_length=_lengths(sequence_length),
      output_features=output_features)


_OBJECTIVE_FNS = {
    "span_corruption": span_corruption,
    "mlm": mlm,
    "prefix_lm": prefix_lm,
    "lm": lm,
}


def output_features(vocabulary):
  return {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True,
                              required=False),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


def _add_task(name, source, objective, vocabulary, overwrite):
  if objective not in _OBJECTIVE_FNS:
    raise ValueError("objective must be one of %s, got %r" % (OBJECTIVES, objective))
  if name in seqio.TaskRegistry.names() and not overwrite:
    raise ValueError("Task %r is already registered (pass overwrite=True)." % name)
  return add_text_task(name, source, _OBJECTIVE_FNS[objective], vocabulary)


def add_text_task(name, source, objective_fn, vocabulary,
                  extra_preprocessors=()):
  """(Re-)registers seqio task `name`: documents of `source` ("text"), tokenized,
  turned into examples by `objective_fn`, EOS appended, then
  `extra_preprocessors`.  Returns name."""
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          functools.partial(t5_preprocessors.rekey,
                            key_map={"inputs": None, "targets": "text"}),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          objective_fn,
          seqio.preprocessors.append_eos_after_trim,
      ] + list(extra_preprocessors),
      output_features=output_features(vocabulary),
      metric_fns=[])
  return name


def register_text_tasks(name, train_path, validation_path, vocab_path=None,
                        file_format="auto", objectives=OBJECTIVES,
                        overwrite=False):
  """Registers <name>_<objective> tasks over your own files.

  Args:
    name: task name prefix, e.g. "wiki" → wiki_span_corruption, wiki_mlm,
      wiki_prefix_lm, wiki_lm (decoder-only LM, this vocabulary).
    train_path, validation_path: a path, glob pattern or list of them: text
      files (one document per line; wrapped plain text works too) or TFRecord
      files of tf.train.Example with a bytes feature "text".
    vocab_path: a SentencePiece .model (t5 conventions); None uses the
      vocabulary of the th_* tasks (gin th_data.vocabulary_options; default:
      trained on the embedded corpus).  To train one on your own text:
      ``python -m mtf_talking_heads.data.vocab --size 8000 train.txt out.model``.
    file_format: "auto" (TFRecord iff every file name contains ".tfrecord"),
      "text" or "tfrecord".
    objectives: a subset of OBJECTIVES.
    overwrite: replace tasks of the same name instead of raising.
  Returns:
    the list of registered task names.
  Raises:
    ValueError: naming the parameter (train_path, validation_path, vocab_path,
      file_format, name) that is missing, empty or unusable; checked before
      anything is registered or built.
  """
  if not isinstance(name, str) or not name.strip():
    raise ValueError("name is empty (%r)." % (name,))
  if train_path is None and validation_path is None:
    raise ValueError("train_path is not set (nor validation_path); for the "
                     "embedded corpus use the th_* tasks.")
  resolved = corpus.resolve_corpus(train_path, validation_path, file_format,
                                   names=("train_path", "validation_path"))
  if vocab_path is None:
    vocabulary = vocab.get_vocabulary()
  else:
    vocabulary = seqio.SentencePieceVocabulary(
        vocab.resolve_vocab_path(vocab_path, param="vocab_path"),
        extra_ids=vocab.EXTRA_IDS)
  unknown = [o for o in objectives if o not in _OBJECTIVE_FNS]
  if unknown:
    raise ValueError("objectives: unknown %s; choose from %s" % (unknown, OBJECTIVES))
  source = CorpusSource(resolved)
  return [_add_task("%s_%s" % (name, o), source, o, vocabulary, overwrite)
          for o in objectives]


def _register_pretraining_tasks():
  source = CorpusSource(None)  # gin th_data.corpus_paths, read lazily
  for objective in OBJECTIVES:
    if objective != "lm":
      _add_task("th_" + objective, source, objective, vocab.get_vocabulary(),
                overwrite=True)
  for objective in BYTE_OBJECTIVES:
    _add_task("th_%s_bytes" % objective, source, objective,
              seqio.ByteVocabulary(), overwrite=True)


def _register_finetune_mixture():
  """SQuAD + GLUE + SuperGLUE, examples-proportional, like t5's en_mix
  without C4: t5's GLUE and SuperGLUE weight mappings (numbers of training
  examples; 0 for the eval-only tasks such as glue_mnli_matched_v002 and
  super_glue_axb_v102) plus SQuAD v1.1's 87,599."""
  rates = list(glue_utils.get_glue_weight_mapping().items())
  rates += list(glue_utils.get_super_glue_weight_mapping().items())
  rates.append(("squad_v010_allanswers", float(SQUAD_V11_TRAIN_EXAMPLES)))
  if FINETUNE_MIXTURE in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.remove(FINETUNE_MIXTURE)
  seqio.MixtureRegistry.add(FINETUNE_MIXTURE, rates)


_register_pretraining_tasks()
_register_finetune_mixture()
