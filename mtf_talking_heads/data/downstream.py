"""An embedded downstream benchmark, built from the local corpus (no download).

Stand-ins for the paper's fine-tuning mixture (section 7.1: SQuAD + GLUE +
SuperGLUE) that exist on every machine, so the whole chain pre-train ->
fine-tune -> metric runs here.  Registered on import (the data package
imports this module; nothing is read until a dataset is requested):

  th_embedded_entailment     classification in MNLI's text-to-text form,
                             scored by accuracy (t5's metrics.accuracy):
      inputs:  "mnli hypothesis: <H> premise: <P>"   (P: a document's first
               PREMISE_WORDS words, H: HYPOTHESIS_WORDS words)
      targets: "entailment"    H is a run of consecutive words of P,
               "contradiction" the same words in another order (the
                               premise does not say that),
               "neutral"       a run of words of another document;
               a third each.
  th_embedded_cloze          extractive span in SQuAD's text-to-text form,
                             scored by t5's metrics.squad (exact match, F1)
                             with t5's postprocessors.qa:
      inputs:  "question: <w w w _ w w> context: <C>"  (C: a document's
               first CONTEXT_WORDS words; the question is a window of C
               with CLOZE_WORDS consecutive words replaced by "_")
      targets: the missing words (a span of C; the window occurs once).
  th_finetune_embedded       both, examples-proportional (like the paper's
                             mixture), SentencePiece vocabulary (T5 models).
  *_bytes                    the same on UTF-8 bytes (the small byte-level
                             models): th_embedded_entailment_bytes,
                             th_embedded_cloze_bytes,
                             th_finetune_embedded_bytes.

Both are answered from the text by matching: whether (and in what order)
the hypothesis's words occur in the premise, where the question's window
sits in the context; the small encoder-decoders of docs/results.md (section
3b) stay at the majority class on both.

Two earlier tasks stay registered (not in the mixtures; a small model
fine-tuned on them stays at the majority class):

  th_embedded_continuation   "continuation sentence1: <A> sentence2: <B>"
                             -> "yes" if B is the sentence after A in the
                             same document, "no" if B comes from another.
  th_embedded_next_word      'question: which word follows "<w>"?
                             context: <C>' -> the word after <w> in C.
  (and their _bytes variants)

Two tasks whose answer depends on what a language model knows (a sentence's
word order, a word's spelling) rather than on matching a question against
the inputs (docs/results.md, section 3b: a small model fine-tuned on them
learns neither), in their own mixture th_finetune_lexical[_bytes], not in
th_finetune_embedded:

  th_embedded_acceptability  CoLA's text-to-text form, accuracy:
                             "cola sentence: <S>" -> "acceptable" if S is a
                             document's first ACCEPTABILITY_WORDS words,
                             "unacceptable" if the same words shuffled.
  th_embedded_misspelling    SQuAD's form, exact match / F1:
                             "question: which word is misspelt? context: <C>"
                             -> the one word of C (a document's first
                             MISSPELLING_WORDS words) whose inner letters
                             were reversed.

A classification in MNLI's form whose answer depends on what a language
model knows (is a run of words the text's continuation); not in the
mixtures: a small decoder-only LM fine-tuned on it answers "contradiction"
to almost everything (docs/results.md, section 3b):

  th_embedded_nli            "mnli premise: <P> hypothesis: <H>" (P: a
                             document's first NLI_PREMISE_WORDS words)
                             -> "entailment"    H: the next
                                                NLI_HYPOTHESIS_WORDS words,
                                "contradiction" the same words shuffled,
                                "neutral"       the next words after another
                                                document's premise;
                             about a third each, accuracy.

The decoder-only models' mixture th_finetune_lm[_bytes] (fine-tuned as
mtf's delimited_lm: experiments/finetune_embedded_lm.gin) has views of the
two lexical tasks cut to the examples whose inputs fit MAX_LM_INPUT_BYTES,
so that "<inputs> EOS <targets> EOS" fits the 128 positions of
pre-training: th_embedded_acceptability_lm and th_embedded_misspelling_lm
(and their _bytes variants); a small decoder-only LM learns both
(docs/results.md, section 3b).

A diagnostic task, bytes only (not in the mixtures):

  th_copy_bytes              inputs: COPY_BYTES bytes of a document (ASCII,
                             no leading or trailing space), targets: the
                             same bytes; scored by exact match (t5's
                             metrics.sequence_accuracy).  An encoder-decoder
                             solves it only through its encoder-decoder
                             attention (docs/results.md, section 3b).
  th_copy128_bytes           the same with COPY128_BYTES bytes: learnt in
                             1000 steps only with absolute positions
                             (models/absolute_positions.gin).

Examples come from the embedded corpus's train and validation documents
(corpus.py); a validation example whose inputs also occur in train (the
stdlib repeats some sentences) is dropped, so the splits are disjoint.  They
are the same on every build of the same corpus (every choice is a hash of
the text).
Every example's inputs fit in MAX_INPUT_BYTES bytes and its targets in
MAX_TARGET_BYTES (fewer SentencePiece tokens); the earlier tasks cut
sentences to MAX_WORDS words.
"""
import functools
import hashlib
import random
import re

import seqio
from t5.data import postprocessors as t5_postprocessors
from t5.evaluation import metrics as t5_metrics
from t5.evaluation import qa_utils
import tensorflow.compat.v2 as tf

from mtf_talking_heads.data import corpus
from mtf_talking_heads.data import vocab

CLASSIFICATION = "th_embedded_entailment"
SPAN = "th_embedded_cloze"
CONTINUATION = "th_embedded_continuation"
NEXT_WORD = "th_embedded_next_word"
COPY = "th_copy"
COPY128 = "th_copy128"  # the same at COPY128_BYTES: a harder diagnostic
ACCEPTABILITY = "th_embedded_acceptability"
MISSPELLING = "th_embedded_misspelling"
NLI = "th_embedded_nli"
TASKS = (CLASSIFICATION, SPAN, CONTINUATION, NEXT_WORD, ACCEPTABILITY,
         MISSPELLING, NLI)
LEXICAL_MIXTURE = "th_finetune_lexical"
MIXTURE = "th_finetune_embedded"
# The decoder-only models' mixture: views of two tasks cut to the examples
# that fit one 128-position sequence "<inputs> EOS <targets> EOS".
LM_MIXTURE = "th_finetune_lm"
LM_SUFFIX = "_lm"
LM_TASKS = (ACCEPTABILITY, MISSPELLING)
MAX_LM_INPUT_BYTES = 111
BYTES_SUFFIX = "_bytes"
MAX_WORDS = 8
MIN_CONTEXT_WORDS = 4
ENTAILMENT_LABELS = ("entailment", "contradiction", "neutral")
PREMISE_WORDS = 12
HYPOTHESIS_WORDS = 4
CONTEXT_WORDS = 14
CLOZE_WORDS = 2
WINDOW_WORDS = 3  # words of the question's window on each side of the gap
# An example's inputs fit finetune_embedded.gin's 160 bytes (with EOS) and
# its targets 16 bytes.
MAX_INPUT_BYTES = 159
MAX_TARGET_BYTES = 15
ACCEPTABILITY_WORDS = 8
ACCEPTABILITY_LABELS = ("acceptable", "unacceptable")
MISSPELLING_WORDS = 10
MISSPELLING_MIN_LETTERS = 6
NLI_PREMISE_WORDS = 8
NLI_HYPOTHESIS_WORDS = 4
COPY_BYTES = 32
COPY128_BYTES = 128
COPY_SLICES_PER_DOCUMENT = 4
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


def _words(document, count):
  """The document's first `count` words, or None when it has fewer."""
  words = document.split()
  return words[:count] if len(words) >= count else None


_FIELDS = re.compile(r"(hypothesis|premise|question|context):")


def _fits(example, text):
  """Within the lengths, and `text` (the example's words) has no field
  name of the prompts, so the fields read back unambiguously."""
  return (len(example["inputs"].encode("utf-8")) <= MAX_INPUT_BYTES and
          len(example["targets"].encode("utf-8")) <= MAX_TARGET_BYTES and
          not _FIELDS.search(text))


def _reordered(run):
  """The words of `run` in another order (the middle two swapped, else the
  run reversed), or None when every order reads the same."""
  out = list(run)
  out[1], out[2] = out[2], out[1]
  if out == list(run):
    out = list(reversed(run))
  return out if out != list(run) else None


def entailment_example(premise, other, key):
  """One MNLI-form example, or None when none can be made.

  Args:
    premise: list of PREMISE_WORDS words (a document's start).
    other: list of words of another document (the neutral hypothesis's
      source).
    key: a string whose hash picks the label and the run.
  Returns:
    dict(inputs, targets) with targets one of ENTAILMENT_LABELS.

  Example: premise "Return the number of items in the container of type
  list" may give hypothesis "items in the container" (entailment), "items
  the in container" (contradiction) or four words of `other` (neutral).
  """
  n = HYPOTHESIS_WORDS
  h = _hash(key)
  label = ENTAILMENT_LABELS[h % 3]
  if label == "neutral":
    if len(other) < n:
      return None
    start = (h // 3) % (len(other) - n + 1)
    hypothesis = other[start:start + n]
    if " ".join(hypothesis) in " ".join(premise):
      return None
  else:
    start = (h // 3) % (len(premise) - n + 1)
    hypothesis = premise[start:start + n]
    if label == "contradiction":
      hypothesis = _reordered(hypothesis)
      if hypothesis is None or " ".join(hypothesis) in " ".join(premise):
        return None
  example = {"inputs": "mnli hypothesis: %s premise: %s"
                       % (" ".join(hypothesis), " ".join(premise)),
             "targets": label}
  return example if _fits(example, " ".join(premise + hypothesis)) else None


def entailment_examples(documents):
  """Entailment examples: one per document of PREMISE_WORDS words or more
  (the neutral hypothesis comes from the next such document)."""
  premises = [w for w in (_words(d, PREMISE_WORDS) for d in documents) if w]
  out = []
  for i, premise in enumerate(premises):
    other = premises[(i + 1) % len(premises)]
    example = entailment_example(premise, other, " ".join(premise))
    if example:
      out.append(example)
  return out


def cloze_example(context):
  """A SQuAD-form cloze example from a list of words, or None.

  The gap is CLOZE_WORDS consecutive plain words (neither an article, which
  SQuAD's normalisation drops); the question is the gap with up to
  WINDOW_WORDS words on each side, and that window occurs once in the
  context and has no "_" of its own, so the answer is determined; a hash
  of the context picks the gap among those.
  Example: context "Return the number of items in the container" may give
  question "the number of _ the container", answer "items in".
  """
  text = " ".join(context)
  candidates = []
  for k in range(1, len(context) - CLOZE_WORDS):
    gap = context[k:k + CLOZE_WORDS]
    if not all(_CLEAN.match(w) and qa_utils.normalize_squad(w) for w in gap):
      continue
    before = context[max(0, k - WINDOW_WORDS):k]
    after = context[k + CLOZE_WORDS:k + CLOZE_WORDS + WINDOW_WORDS]
    window = " ".join(before + gap + after)
    if text.count(window) == 1 and "_" not in window:  # one "_": the gap
      candidates.append((k, " ".join(before + ["_"] + after), " ".join(gap)))
  if not candidates:
    return None
  _, question, answer = candidates[_hash(text) % len(candidates)]
  example = {"inputs": "question: %s context: %s" % (question, text),
             "targets": answer, "answers": [answer]}
  return example if _fits(example, text) else None


def _from_starts(documents, count, make):
  """make(first `count` words) of every document that long, where it
  gives an example."""
  starts = (_words(d, count) for d in documents)
  return [e for e in (make(w) for w in starts if w) if e]


def cloze_examples(documents):
  """Cloze examples: one per document of CONTEXT_WORDS words or more."""
  return _from_starts(documents, CONTEXT_WORDS, cloze_example)


def acceptability_example(words):
  """A CoLA-form example from a list of words, or None.

  Example: "Return the number of items in the container" stays as it is
  ("acceptable") or gives its words in a shuffled order ("unacceptable");
  a hash of the words picks the label and the order.
  """
  text = " ".join(words)
  h = _hash(text)
  label = ACCEPTABILITY_LABELS[h % 2]
  out = list(words)
  if label == "unacceptable":
    random.Random(h).shuffle(out)
    if out == list(words):
      return None
  example = {"inputs": "cola sentence: %s" % " ".join(out), "targets": label}
  return example if _fits(example, text) else None


def acceptability_examples(documents):
  return _from_starts(documents, ACCEPTABILITY_WORDS, acceptability_example)


def misspelling_example(words):
  """A SQuAD-form example: which word of the context is misspelt.

  One word of MISSPELLING_MIN_LETTERS letters or more (letters only, once in
  the context, and its misspelling not a word of the context) has its inner
  letters reversed, first and last kept; the answer is that word as
  written, once in the context.  Example: "Return the number of items in
  the container" may give context "Return the number of items in the
  ceniatnor", answer "ceniatnor".
  """
  text = " ".join(words)
  candidates = [k for k, w in enumerate(words)
                if w.isalpha() and w.isascii() and
                len(w) >= MISSPELLING_MIN_LETTERS and words.count(w) == 1 and
                w[1:-1] != w[-2:0:-1] and
                w[0] + w[-2:0:-1] + w[-1] not in words]
  if not candidates:
    return None
  k = candidates[_hash(text) % len(candidates)]
  wrong = words[k][0] + words[k][-2:0:-1] + words[k][-1]
  context = " ".join(words[:k] + [wrong] + words[k + 1:])
  example = {"inputs": "question: which word is misspelt? context: %s"
                       % context, "targets": wrong, "answers": [wrong]}
  return example if _fits(example, text) else None


def misspelling_examples(documents):
  return _from_starts(documents, MISSPELLING_WORDS, misspelling_example)


def nli_example(words, other):
  """An MNLI-form example about a continuation, or None.

  Args:
    words: a document's first NLI_PREMISE_WORDS + NLI_HYPOTHESIS_WORDS
      words: the premise, then its continuation.
    other: the same of another document (the neutral hypothesis's source).
  Returns:
    dict(inputs, targets) with targets one of ENTAILMENT_LABELS, a hash of
    the words picking it:
      "entailment"    the hypothesis is the premise's continuation,
      "contradiction" the same words shuffled,
      "neutral"       the continuation of another document's premise.

  Example: "Return the number of items in the container of type list" gives
  premise "Return the number of items in the container" and hypothesis "of
  type list" in one of the three forms.
  """
  n = NLI_PREMISE_WORDS
  premise, hypothesis = words[:n], words[n:]
  h = _hash(" ".join(words))
  label = ENTAILMENT_LABELS[h % 3]
  if label == "contradiction":
    shuffled = list(hypothesis)
    random.Random(h).shuffle(shuffled)
    if shuffled == hypothesis:
      return None
    hypothesis = shuffled
  elif label == "neutral":
    hypothesis = other[n:]
    if hypothesis == words[n:]:
      return None
  example = {"inputs": "mnli premise: %s hypothesis: %s"
                       % (" ".join(premise), " ".join(hypothesis)),
             "targets": label}
  text = " ".join(words + hypothesis)
  return example if _fits(example, text) else None


def nli_examples(documents):
  """NLI examples: one per document of NLI_PREMISE_WORDS +
  NLI_HYPOTHESIS_WORDS words or more (the neutral hypothesis comes from the
  next such document)."""
  count = NLI_PREMISE_WORDS + NLI_HYPOTHESIS_WORDS
  starts = [w for w in (_words(d, count) for d in documents) if w]
  out = []
  for i, words in enumerate(starts):
    example = nli_example(words, starts[(i + 1) % len(starts)])
    if example:
      out.append(example)
  return out


def copy_examples(documents, length=COPY_BYTES):
  """Copy examples: inputs and targets the same `length` characters.

  From each document, up to COPY_SLICES_PER_DOCUMENT of its consecutive
  non-overlapping `length`-character slices that are ASCII (so `length`
  bytes) and neither start nor end with a space.
  Example (length 8): "Return the number of items" gives "Return t"
  ("he numbe" and "r of ite" too).
  """
  out = []
  for doc in documents:
    kept = 0
    for start in range(0, len(doc) - length + 1, length):
      piece = doc[start:start + length]
      if piece.isascii() and piece == piece.strip():
        out.append({"inputs": piece, "targets": piece})
        kept += 1
        if kept == COPY_SLICES_PER_DOCUMENT:
          break
  return out


_MAKERS = {CLASSIFICATION: entailment_examples, SPAN: cloze_examples,
           CONTINUATION: continuation_examples, NEXT_WORD: next_word_examples,
           COPY: copy_examples, ACCEPTABILITY: acceptability_examples,
           MISSPELLING: misspelling_examples, NLI: nli_examples,
           COPY128: functools.partial(copy_examples, length=COPY128_BYTES)}
_SPAN_TASKS = (SPAN, NEXT_WORD, MISSPELLING, MISSPELLING + LM_SUFFIX)
_CACHE = {}


def _documents(split):
  path = corpus.default_corpus_paths()[split]
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f if line.strip()]


def fits_lm(example):
  """Whether `example`'s inputs are MAX_LM_INPUT_BYTES bytes or fewer, so
  that with their EOS and the targets (at most MAX_TARGET_BYTES + EOS, as
  every task's) it fits a decoder-only model's 128 positions on bytes."""
  return len(example["inputs"].encode("utf-8")) <= MAX_LM_INPUT_BYTES


def examples(task, split):
  """The examples of `task` (one of TASKS, or an LM_TASKS name + LM_SUFFIX:
  those fits_lm accepts) in `split` (cached)."""
  if split not in corpus.SPLITS:
    raise ValueError("split must be one of %s, got %r" % (corpus.SPLITS, split))
  lm_views = tuple(t + LM_SUFFIX for t in LM_TASKS)
  if task not in _MAKERS and task not in lm_views:
    raise ValueError("task must be one of %s, got %r"
                     % (TASKS + lm_views + (COPY, COPY128), task))
  key = (task, split)
  if task in lm_views and key not in _CACHE:
    base = task[:-len(LM_SUFFIX)]
    _CACHE[key] = [r for r in examples(base, split) if fits_lm(r)]
  if key not in _CACHE:
    make = _MAKERS[task]
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
  if task in _SPAN_TASKS:
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
    suffix = BYTES_SUFFIX if byte_level else ""
    for base in TASKS + tuple(t + LM_SUFFIX for t in LM_TASKS):
      if base in _SPAN_TASKS:
        _add(base + suffix, base, vocabulary, [t5_metrics.squad],
             t5_postprocessors.qa)
      else:
        _add(base + suffix, base, vocabulary, [t5_metrics.accuracy], None)
    cls, span, mixture = task_names(byte_level)
    if mixture in seqio.MixtureRegistry.names():
      seqio.MixtureRegistry.remove(mixture)
    seqio.MixtureRegistry.add(mixture, [(cls, _rate), (span, _rate)])
    lexical = LEXICAL_MIXTURE + suffix
    if lexical in seqio.MixtureRegistry.names():
      seqio.MixtureRegistry.remove(lexical)
    seqio.MixtureRegistry.add(lexical, [(ACCEPTABILITY + suffix, _rate),
                                        (MISSPELLING + suffix, _rate)])
    lm = LM_MIXTURE + suffix
    if lm in seqio.MixtureRegistry.names():
      seqio.MixtureRegistry.remove(lm)
    seqio.MixtureRegistry.add(lm, [(t + LM_SUFFIX + suffix, _rate)
                                   for t in LM_TASKS])
  for copy in (COPY, COPY128):
    _add(copy + BYTES_SUFFIX, copy, seqio.ByteVocabulary(),
         [t5_metrics.sequence_accuracy], None)


register()
