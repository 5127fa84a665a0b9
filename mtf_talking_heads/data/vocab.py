"""A SentencePiece vocabulary trained locally, with t5's conventions.

The default vocabulary is trained at first use on the train split of the
embedded corpus (corpus.py) and cached next to it:

  <cache>/vocab/spm-unigram-8000-<corpus key>-t1.model

Conventions as t5's: pad=0 ("<pad>"), eos=1 ("</s>"), unk=2 ("<unk>"), no
bos; unigram model; NFKC normalisation.  seqio adds the 100 sentinels
``<extra_id_0>`` .. ``<extra_id_99>`` on top (ids 8099 .. 8000 for size
8000), so ``seqio.SentencePieceVocabulary(path, extra_ids=100)`` loads it and
span corruption works.

Training is deterministic: documents are cut into chunks of at most 1000
characters at sentence ends, fed in file order, no sampling or shuffling
(input_sentence_size=0, shuffle_input_sentence=false), fixed random seed and a
fixed thread count (the unigram EM result depends on the thread count, so it
does not follow the machine's core count).  Same corpus and size → same
model bytes.

gin (read when a th_* task first needs its vocabulary, not at import):
  th_data.vocabulary_options.path = "/path/to/spm.model"   # use your own
  th_data.vocabulary_options.size = 8000                   # or train this size
"""
import io
import os
import re
import time

import gin
import seqio

from mtf_talking_heads.data import corpus
from mtf_talking_heads.data import task_names

if __name__ == "__main__":
  # `python -m mtf_talking_heads.data.vocab`: importing the package already
  # ran this module (and registered its gin configurables); run that copy.
  from mtf_talking_heads.data import vocab as _imported  # pylint: disable=g-import-not-at-top
  raise SystemExit(_imported.main())

DEFAULT_VOCAB_SIZE = task_names.LOCAL_PIECES  # what `mtf_th plan` assumes
EXTRA_IDS = task_names.EXTRA_IDS
TRAINER_VERSION = 1
# Fixed, not os.cpu_count(): the trained model depends on the thread count.
NUM_THREADS = 4
SEED = 20200305  # the Talking-Heads paper's arXiv date
MAX_CHUNK_CHARS = 1000

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def chunks(documents, max_chars=MAX_CHUNK_CHARS):
  """Cuts documents into pieces of <= max_chars at sentence ends.

  A single sentence longer than max_chars is cut at max_chars * 4 (below
  SentencePiece's 4192-byte sentence limit for ASCII text).
  """
  for doc in documents:
    doc = doc.strip()
    if not doc:
      continue
    buf = ""
    for sentence in _SENTENCE_END.split(doc):
      if buf and len(buf) + 1 + len(sentence) > max_chars:
        yield buf[:4 * max_chars]
        buf = ""
      buf = buf + " " + sentence if buf else sentence
    if buf:
      yield buf[:4 * max_chars]


def train_sentencepiece(documents, output_path, vocab_size=DEFAULT_VOCAB_SIZE,
                        character_coverage=0.9999):
  """Trains a t5-style unigram SentencePiece model; writes it atomically.

  Args:
    documents: an iterable of str (one document each).
    output_path: where the .model file goes (written to a temporary name
      first, then os.replace'd).
    vocab_size: number of pieces, including pad/eos/unk (sentinels not
      included: seqio adds them).
    character_coverage: SentencePiece's character_coverage.
  Returns:
    a dict: path, seconds, vocab_size, chunks.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  pieces = list(chunks(documents))
  if not pieces:
    raise ValueError("No text to train a vocabulary on.")
  start = time.time()
  spm.set_random_generator_seed(SEED)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(pieces), model_writer=model,
      vocab_size=int(vocab_size), model_type="unigram",
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
      character_coverage=character_coverage,
      input_sentence_size=0, shuffle_input_sentence=False,
      max_sentence_length=4 * MAX_CHUNK_CHARS + 192,
      num_threads=NUM_THREADS, minloglevel=2)
  seconds = time.time() - start
  output_path = os.path.abspath(output_path)
  os.makedirs(os.path.dirname(output_path), exist_ok=True)
  tmp = output_path + ".tmp%d" % os.getpid()
  with open(tmp, "wb") as f:
    f.write(model.getvalue())
  os.replace(tmp, output_path)
  return {"path": output_path, "seconds": round(seconds, 2),
          "vocab_size": int(vocab_size), "chunks": len(pieces)}


def read_documents(paths):
  """Lines of text files (one document per line), empty lines skipped."""
  for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.strip():
          yield line


def default_vocab_path(size=DEFAULT_VOCAB_SIZE):
  """Path of the default vocabulary of `size` pieces, trained if not cached.

  Trained on the train split of the embedded corpus (validation text is never
  seen).  Cached under <cache>/vocab/, keyed by corpus, size and trainer
  version; a lock keeps concurrent processes from training twice.
  """
  size = int(size)
  path = os.path.join(corpus.cache_dir(), "vocab", "spm-unigram-%d-%s-t%d.model"
                      % (size, corpus.corpus_key(), TRAINER_VERSION))
  if os.path.exists(path):
    return path
  train = corpus.default_corpus_paths()["train"]
  with corpus.file_lock(os.path.join(os.path.dirname(path), ".vocab.lock")):
    if not os.path.exists(path):
      train_sentencepiece(read_documents([train]), path, vocab_size=size)
  return path


@gin.configurable(module="th_data")
def vocabulary_options(path=None, size=DEFAULT_VOCAB_SIZE):
  """The vocabulary of the th_* tasks (gin: th_data.vocabulary_options.*).

  Args:
    path: a SentencePiece .model file (pad=0, eos=1, unk=2, like t5's), or
      None to use the default vocabulary trained on the embedded corpus.
    size: pieces of the default vocabulary (ignored when path is set).
  Returns:
    dict(path=..., size=...)
  """
  return {"path": path, "size": size}


def resolve_vocab_path(path=None, size=None, param="th_data.vocabulary_options.path"):
  """The .model file to use: `path` if given (must exist), else the default.

  With path=None and size=None the gin-configured vocabulary_options apply.
  """
  if path is None and size is None:
    opts = vocabulary_options()
    path, size = opts["path"], opts["size"]
  if path is not None:
    if not isinstance(path, str) or not path.strip():
      raise ValueError("%s is empty (%r)." % (param, path))
    import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
    if not tf.io.gfile.exists(path):
      raise ValueError("%s=%r: no such file." % (param, path))
    return path
  return default_vocab_path(DEFAULT_VOCAB_SIZE if size is None else size)


# Published vocabularies whose number of pieces is known without reading them
# (a pre-flight or dry run must not reach GCS): t5.data.DEFAULT_SPM_PATH.
PUBLISHED_PIECES = {"gs://t5-data/vocabs/cc_all.32000/sentencepiece.model":
                    32000}


class LazySentencePieceVocabulary(seqio.SentencePieceVocabulary):
  """A seqio SentencePieceVocabulary whose model file is resolved on use.

  Each time the model is needed, the gin-configured vocabulary_options are
  read (so gin files parsed after import apply) and the default vocabulary is
  trained if it is not cached yet.  Importing and registering tasks never
  trains anything.  Pickles like its parent (gin deep-copies arguments).
  """

  def __init__(self, extra_ids=EXTRA_IDS):
    super().__init__(None, extra_ids=extra_ids)

  def _resolve(self):
    path = resolve_vocab_path()
    if path != self._sentencepiece_model_file:
      self._sentencepiece_model_file = path
      self._model = None
    return path

  def _model_context(self):
    self._resolve()
    return super()._model_context()

  @property
  def sentencepiece_model_file(self):
    return self._resolve()

  def __str__(self):
    return "LazySentencePieceVocabulary(%s)" % super().__str__()


_VOCABULARY = LazySentencePieceVocabulary()


def vocab_size_of(vocabulary):
  """vocabulary.vocab_size, but a published SentencePiece vocabulary's
  (PUBLISHED_PIECES + extra ids) without reading its file."""
  if isinstance(vocabulary, LazySentencePieceVocabulary):
    path = vocabulary_options()["path"]  # resolving would read the file
  elif isinstance(vocabulary, seqio.SentencePieceVocabulary):
    path = vocabulary.sentencepiece_model_file
  else:
    path = None
  if path in PUBLISHED_PIECES:
    return PUBLISHED_PIECES[path] + vocabulary.extra_ids
  return vocabulary.vocab_size


def get_vocabulary():
  """The vocabulary of the th_* tasks (one shared, lazily resolved instance)."""
  return _VOCABULARY


def main(argv=None):
  """python -m mtf_talking_heads.data.vocab [--size N] [INPUT.txt... OUTPUT.model]"""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=DEFAULT_VOCAB_SIZE)
  parser.add_argument("files", nargs="*",
                      help="text files (one document per line) then the output "
                           ".model path; none: build the default vocabulary")
  args = parser.parse_args(argv)
  if not args.files:
    print(default_vocab_path(args.size))
    return 0
  if len(args.files) < 2:
    parser.error("give input text file(s) and an output .model path")
  info = train_sentencepiece(read_documents(args.files[:-1]), args.files[-1],
                             vocab_size=args.size)
  print("%(path)s (%(vocab_size)d pieces, %(chunks)d chunks, %(seconds).1f s)" % info)
  return 0

