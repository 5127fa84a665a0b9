"""An embedded downstream benchmark, built from the local corpus (no download).

Stand-ins for the paper's fine-tuning mixture (section 7.1: SQuAD + GLUE +
SuperGLUE) that exist on every machine, so the whole chain pre-train ->
fine-tune -> metric runs here.  Registered on import (the data package
imports this module; nothing is read until a dataset is requested):

  th_embedded_continuation   classification, scored by accuracy (t5's
                             metrics.accuracy), GLUE's text-to-text form:
      inputs:  "continuation sentence1: <A> sentence2: <B>"
      targets: "yes" if B is the sentence after A in the same document,
               "no" if B comes from another document (half of the examples).
  th_embedded_next_word      span extraction in SQuAD's text-to-text form,
                             scored by t5's metrics.squad (exact match, F1)
                             with t5's postprocessors.qa:
      inputs:  'question: which word follows "<w>"? context: <C>'
      targets: the word after <w> in C (a span of C; <w> occurs once in C).
  th_finetune_embedded       both, examples-proportional (like the paper's
                             mixture), SentencePiece vocabulary (T5 models).
  *_bytes                    the same on UTF-8 bytes (the small byte-level
                             models): th_embedded_continuation_bytes,
                             th_embedded_next_word_bytes,
                             th_finetune_embedded_bytes.

Examples come from the embedded corpus's train and validation documents
(corpus.py); a validation example whose inputs also occur in train (the
stdlib repeats some sentences) is dropped, so the splits are disjoint.  They
are the same on every build of the same corpus (every choice is a hash of
the text).
Sentences are cut to at most MAX_WORDS words, so an example fits in 128
bytes of inputs or fewer SentencePiece tokens.
"""
import functools
import hashlib
import re

import seqio
from t5.data import postprocessors as t5_postprocessors
from t5.evaluation import metrics as t5_metrics
from t5.evaluation import qa_utils
import tensorflow.compat.v2 as tf

from mtf_talking_heads.data import corpus
from mtf_talking_heads.data import vocab

CLASSIFICATION = "th_embedded_continuation"
SPAN = "th_embedded_next_word"
MIXTURE = "th_finetune_embedded"
BYTES_SUFFIX = "_bytes"
MAX_WORDS = 8
MIN_CONTEXT_WORDS = 4
# Examples per split and task (the corpus has ~24k train documents).
MAX_EXAMPLES = {"train": 20000, "validation": 400}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CLEAN = re.compile(r"^[A-Za-z][\w'-]*[A-Za-z0-9]?$")


def _hash(text):
  return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


def sentences(document):
  """The document's sentences, each cut to its first MAX_WORDS words.

  Example: "A b c. D e f g h i j k l m." -> ["A b c.", "D e f g h i j k"].
  """
  out = []
  for s in _SENTENCE_END.split(document.strip()):
    words = s.split()
    if len(words) >= MIN_CONTEXT_WORDS:
      out.append(" ".join(words[:MAX_WORDS]))
  return out


def continuation_examples(documents):
  """Classification examples: is sentence2 the sentence after sentence1?

  Args:
    documents: list of str.
  Returns:
    [dict(inputs=str, targets="yes"|"no")]: one per document with two
    sentences or more; a hash of sentence1 decides "no" (then sentence2 is
    the second sentence of the next such document).
  """
  pairs = [s[:2] for s in map(sentences, documents) if len(s) >= 2]
  out = []
  for i, (first, second) in enumerate(pairs):
    label = "no" if _hash(first) % 2 else "yes"
    if label == "no":
      other = pairs[(i + 1) % len(pairs)][1]
      if other == second:
        continue
      second = other
    out.append({"inputs": "continuation sentence1: %s sentence2: %s"
                          % (first, second),
                "targets": label})
  return out


def next_word_example(sentence):
  """A span example from one sentence, or None when no word is usable.

  The question word w is a plain word that occurs once in the sentence and
  is not its last word, and its successor is not an article (SQuAD's
  normalisation drops "a", "an", "the", so such an answer would be empty
  and match an empty prediction); a hash of the sentence picks w among
  those.
  Example: "the cat sat on a mat" may give w="sat", answer "on".
  """
  words = sentence.split()
  candidates = [k for k in range(len(words) - 1)
                if _CLEAN.match(words[k]) and words.count(words[k]) == 1
                and _CLEAN.match(words[k + 1])
                and qa_utils.normalize_squad(words[k + 1])]
  if not candidates:
    return None
  k = candidates[_hash(sentence) % len(candidates)]
  answer = words[k + 1]
  return {"inputs": 'question: which word follows "%s"? context: %s'
                    % (words[k], sentence),
          "targets": answer, "answers": [answer]}


def next_word_examples(documents):
  """Span examples: the first usable sentence of each document."""
  out = []
  for doc in documents:
    for s in sentences(doc):
      example = next_word_example(s)
      if example:
        out.append(example)
        break
  return out


_CACHE = {}


def _documents(split):
  path = corpus.default_corpus_paths()[split]
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f if line.strip()]


def examples(task, split):
  """The examples of `task` (CLASSIFICATION or SPAN) in `split` (cached)."""
  if split not in corpus.SPLITS:
    raise ValueError("split must be one of %s, got %r" % (corpus.SPLITS, split))
  key = (task, split)
  if key not in _CACHE:
    make = continuation_examples if task == CLASSIFICATION else (
        next_word_examples)
    rows = make(_documents(split))
    if split != "train":  # stdlib docstrings repeat sentences: no leak
      seen = {r["inputs"] for r in make(_documents("train"))}
      rows = [r for r in rows if r["inputs"] not in seen]
    _CACHE[key] = rows[:MAX_EXAMPLES[split]]
  return _CACHE[key]


def _dataset_fn(split, shuffle_files, seed=None, task=None):
  del shuffle_files, seed  # one file; the training input pipeline shuffles
  rows = examples(task, split)
  columns = {"inputs": [r["inputs"] for r in rows],
             "targets": [r["targets"] for r in rows]}
  if task == SPAN:
    columns["answers"] = [r["answers"] for r in rows]
  return tf.data.Dataset.from_tensor_slices(columns)


def _rate(task):
  """Examples-proportional mixing rate: the task's number of train examples."""
  base = task.name[:-len(BYTES_SUFFIX)] if task.name.endswith(
      BYTES_SUFFIX) else task.name
  return float(len(examples(base, "train")))


def _output_features(vocabulary):
  return {"inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
          "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)}


def _add(name, base, vocabulary, metric_fns, postprocess_fn):
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(
          functools.partial(_dataset_fn, task=base), splits=corpus.SPLITS),
      preprocessors=[seqio.preprocessors.tokenize,
                     seqio.CacheDatasetPlaceholder(),
                     seqio.preprocessors.append_eos_after_trim],
      output_features=_output_features(vocabulary),
      postprocess_fn=postprocess_fn,
      metric_fns=metric_fns)


def task_names(byte_level=False):
  """(classification task, span task, mixture) for one vocabulary."""
  suffix = BYTES_SUFFIX if byte_level else ""
  return CLASSIFICATION + suffix, SPAN + suffix, MIXTURE + suffix


def register():
  """Registers the tasks and mixtures of the module docstring."""
  for byte_level, vocabulary in ((False, vocab.get_vocabulary()),
                                 (True, seqio.ByteVocabulary())):
    cls, span, mixture = task_names(byte_level)
    _add(cls, CLASSIFICATION, vocabulary, [t5_metrics.accuracy], None)
    _add(span, SPAN, vocabulary, [t5_metrics.squad], t5_postprocessors.qa)
    if mixture in seqio.MixtureRegistry.names():
      seqio.MixtureRegistry.remove(mixture)
    seqio.MixtureRegistry.add(mixture, [(cls, _rate), (span, _rate)])


register()
