"""Tests of mtf_talking_heads.data: embedded corpus, local vocabulary, tasks.

The corpus and the default vocabulary come from the package's cache
($MTF_TH_CACHE, else ~/.cache/mtf_talking_heads), built there on first use
and shared with everything else that uses the package; one fresh corpus build
into a temporary directory must match the cached files byte for byte, and a
small vocabulary is trained from scratch twice.  Nothing here uses the
network: a guard makes any Python-level socket connection fail.
"""
import collections
import hashlib
import os
import re
import socket
import time

import pytest

import mtf_talking_heads.core.compat  # noqa: F401  pylint: disable=unused-import  (first)
from mtf_talking_heads.data import corpus
from mtf_talking_heads.data import tasks
from mtf_talking_heads.data import vocab

import gin  # pylint: disable=g-bad-import-order
import numpy as np
import seqio
import tensorflow as tf

SC_LENGTHS = {"inputs": 64, "targets": 16}
MLM_LENGTHS = {"inputs": 64, "targets": 64}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("network access attempted: %r %r" % (args, kwargs))
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def built():
  """Corpus + default vocabulary in the package cache (built if missing)."""
  start = time.time()
  paths = corpus.default_corpus_paths()
  corpus_seconds = time.time() - start
  start = time.time()
  vocab_path = vocab.default_vocab_path()
  vocab_seconds = time.time() - start
  print("\ncorpus ready in %.1f s, vocabulary in %.1f s"
        % (corpus_seconds, vocab_seconds))
  return {"cache": corpus.cache_dir(), "paths": paths,
          "vocab_path": vocab_path, "stats": corpus.stats()}


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _examples(name, lengths, split="validation", seed=7, limit=None):
  ds = seqio.get_mixture_or_task(name).get_dataset(
      sequence_length=lengths, split=split, shuffle=False, seed=seed)
  if limit:
    ds = ds.take(limit)
  return list(ds.as_numpy_iterator())


# ---------------------------------------------------------------- corpus


def test_corpus_is_megabytes_of_english(built):
  stats = built["stats"]
  assert stats["total_bytes"] >= 3_000_000, stats
  text = open(built["paths"]["train"], encoding="utf-8").read()
  assert len(text.encode("utf-8")) == stats["bytes"]["train"]
  ascii_share = len(text.encode("ascii", "ignore")) / len(text)
  assert ascii_share > 0.999, ascii_share
  words = re.findall(r"[a-z]+", text.lower())
  counts = collections.Counter(words)
  for w in ("the", "of", "to", "is", "and", "a"):
    assert counts[w] / len(words) > 0.01, (w, counts[w] / len(words))
  letters = sum(c.isalpha() for c in text)
  assert letters / len(text) > 0.7
  assert set(stats["sources"]) == {
      "topics", "c_docstrings", "docstrings", "comments", "strings"}


def test_corpus_cache_layout(built):
  d = os.path.dirname(built["paths"]["train"])
  assert os.path.dirname(d) == built["cache"]
  v = "py%d.%d.%d" % tuple(__import__("sys").version_info[:3])
  assert v in os.path.basename(d)
  assert sorted(os.listdir(d)) == ["stats.json", "train.txt", "validation.txt"]
  assert built["stats"]["paths"] == built["paths"]
  assert os.path.dirname(built["vocab_path"]) == os.path.join(
      built["cache"], "vocab")


def test_corpus_split_is_disjoint_and_about_two_percent(built):
  train = _lines(built["paths"]["train"])
  validation = _lines(built["paths"]["validation"])
  assert all(line.strip() for line in train + validation)
  assert len(set(train)) == len(train) and len(set(validation)) == len(validation)
  assert not set(train) & set(validation)
  share = len(validation) / (len(train) + len(validation))
  assert 0.01 < share < 0.03, share
  assert all(corpus.split_of(t) == "validation" for t in validation)
  assert all(corpus.split_of(t) == "train" for t in train[:2000])


def test_corpus_build_is_deterministic(built, tmp_path):
  stats = corpus.build_corpus(str(tmp_path))
  for split in corpus.SPLITS:
    assert stats["sha256"][split] == built["stats"]["sha256"][split]
    assert _sha256(str(tmp_path / (split + ".txt"))) == stats["sha256"][split]
    assert _sha256(built["paths"][split]) == stats["sha256"][split]


# ------------------------------------------------------------ vocabulary


def test_vocabulary_loads_with_seqio_and_round_trips(built):
  v = seqio.SentencePieceVocabulary(built["vocab_path"], extra_ids=100)
  assert v.vocab_size == vocab.DEFAULT_VOCAB_SIZE + 100
  assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
  assert v.tokenizer.bos_id() == -1
  text = "Return the number of items in a container, or raise a TypeError."
  ids = v.encode(text)
  assert len(ids) < len(text.split()) * 2
  assert 2 not in ids  # no unknown pieces in plain English
  assert v.decode(ids) == text
  assert v.encode("<extra_id_0>") == [v.vocab_size - 1]
  # The tasks' lazily resolved vocabulary is the same model.
  lazy = vocab.get_vocabulary()
  assert lazy.sentencepiece_model_file == built["vocab_path"]
  assert lazy.vocab_size == v.vocab_size and lazy.encode(text) == ids


def test_vocabulary_training_is_deterministic(built, tmp_path):
  docs = _lines(built["paths"]["validation"])
  a = vocab.train_sentencepiece(docs, str(tmp_path / "a.model"), vocab_size=400)
  b = vocab.train_sentencepiece(docs, str(tmp_path / "b.model"), vocab_size=400)
  assert _sha256(a["path"]) == _sha256(b["path"])
  v = seqio.SentencePieceVocabulary(a["path"], extra_ids=100)
  assert v.vocab_size == 500 and (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
  text = "Return the number of items in a container."
  assert v.decode(v.encode(text)) == text


def test_vocabulary_gin_path_must_exist(tmp_path):
  with gin.unlock_config():
    gin.bind_parameter("th_data.vocabulary_options.path", str(tmp_path / "nope.model"))
  try:
    with pytest.raises(ValueError, match="th_data.vocabulary_options.path"):
      vocab.resolve_vocab_path()
  finally:
    with gin.unlock_config():
      gin.bind_parameter("th_data.vocabulary_options.path", None)


# ----------------------------------------------------------------- tasks


@pytest.fixture
def cache_env(built):
  return built


def test_span_corruption_examples(cache_env):
  exs = _examples("th_span_corruption", SC_LENGTHS)
  assert len(exs) > 50
  sentinel0 = vocab.DEFAULT_VOCAB_SIZE + 99
  full = [e for e in exs if len(e["inputs"]) == 64]
  assert len(full) > 0.9 * len(exs)
  for e in exs:
    inputs, targets = e["inputs"], e["targets"]
    assert len(inputs) <= 64 and len(targets) <= 16
    assert inputs[-1] == 1 and targets[-1] == 1
    assert targets[0] == sentinel0 and sentinel0 in inputs
    # Sentinels are numbered from <extra_id_0> down, same ones in both.
    in_sent = [t for t in inputs if t >= vocab.DEFAULT_VOCAB_SIZE]
    tg_sent = [t for t in targets if t >= vocab.DEFAULT_VOCAB_SIZE]
    assert in_sent == list(range(sentinel0, sentinel0 - len(in_sent), -1))
    assert tg_sent == in_sent[:len(tg_sent)]
  again = _examples("th_span_corruption", SC_LENGTHS)
  assert len(again) == len(exs)
  for a, b in zip(exs, again):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])


def test_mlm_examples(cache_env):
  exs = _examples("th_mlm", MLM_LENGTHS)
  assert len(exs) > 50
  mask = vocab.DEFAULT_VOCAB_SIZE + 99
  changed = masked = total = 0
  for e in exs:
    inputs, targets = e["inputs"], e["targets"]
    assert inputs.shape == targets.shape and len(inputs) <= 64
    assert inputs[-1] == 1 and targets[-1] == 1
    assert targets.max() < vocab.DEFAULT_VOCAB_SIZE  # targets: original text
    diff = inputs != targets
    changed += diff.sum()
    masked += (inputs == mask).sum()
    total += len(inputs) - 1
    assert ((inputs == mask) <= diff).all()
    assert (inputs[diff & (inputs != mask)] < vocab.DEFAULT_VOCAB_SIZE).all()
  assert 0.10 < changed / total < 0.17, changed / total   # ~15% * 90%
  assert 0.75 < masked / changed < 0.95, masked / changed  # 80 of 90
  again = _examples("th_mlm", MLM_LENGTHS)
  for a, b in zip(exs, again):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  other_seed = _examples("th_mlm", MLM_LENGTHS, seed=8, limit=20)
  assert any((a["inputs"] != b["inputs"]).any() for a, b in zip(exs, other_seed))


def test_prefix_lm_examples(cache_env):
  exs = _examples("th_prefix_lm", MLM_LENGTHS)
  assert len(exs) > 50
  for e in exs[:100]:
    assert e["inputs"][-1] == 1 and e["targets"][-1] == 1
    assert len(e["inputs"]) + len(e["targets"]) <= 64 + 1


def test_sequence_length_none_uses_defaults(cache_env):
  task = seqio.get_mixture_or_task("th_span_corruption")
  ds = task.get_dataset(sequence_length=None, split="validation",
                        shuffle=False, seed=1)
  ex = next(ds.as_numpy_iterator())
  assert len(ex["inputs"]) == 512
  assert len(ex["targets"]) <= tasks.span_corruption_targets_length(512)


def test_train_split_reads(cache_env):
  ex = _examples("th_span_corruption", SC_LENGTHS, split="train", limit=1)
  assert ex and len(ex[0]["inputs"]) == 64


# ------------------------------------------------------------- user data

_USER_TEXT = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "",
    "A second document talks about a small garden where tomatoes grow in summer.",
    "   ",
    "The third document describes how the tide comes in twice a day at the harbour.",
] * 20


def _write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def test_register_text_tasks_with_user_text(cache_env, tmp_path):
  train = _write(tmp_path / "train.txt", _USER_TEXT)
  validation = _write(tmp_path / "valid.txt", _USER_TEXT[:10])
  names = tasks.register_text_tasks("th_test_user", train, validation,
                                    overwrite=True)
  assert names == ["th_test_user_span_corruption", "th_test_user_mlm",
                   "th_test_user_prefix_lm", "th_test_user_lm"]
  v = vocab.get_vocabulary()
  exs = _examples("th_test_user_mlm", MLM_LENGTHS)
  assert exs
  text = " ".join(v.decode(e["targets"].tolist()) for e in exs)
  assert "tomatoes" in text and "harbour" in text
  assert _examples("th_test_user_span_corruption", SC_LENGTHS, split="train",
                   limit=2)


def test_register_text_tasks_with_tfrecords(cache_env, tmp_path):
  path = str(tmp_path / "docs.tfrecord")
  with tf.io.TFRecordWriter(path) as w:
    for line in _USER_TEXT:
      ex = tf.train.Example(features=tf.train.Features(feature={
          "text": tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[line.encode("utf-8")]))}))
      w.write(ex.SerializeToString())
  names = tasks.register_text_tasks("th_test_rec", path, path,
                                    vocab_path=cache_env["vocab_path"],
                                    objectives=("mlm",), overwrite=True)
  exs = _examples(names[0], MLM_LENGTHS)
  text = " ".join(vocab.get_vocabulary().decode(e["targets"].tolist())
                  for e in exs)
  assert "quick brown fox" in text


def test_gin_corpus_paths(cache_env, tmp_path):
  train = _write(tmp_path / "train.txt", _USER_TEXT)
  validation = _write(tmp_path / "valid.txt", list(reversed(_USER_TEXT)))
  with gin.unlock_config():
    gin.parse_config("""
        th_data.corpus_paths.train = '%s'
        th_data.corpus_paths.validation = '%s'
    """ % (train, validation))
  try:
    exs = _examples("th_mlm", MLM_LENGTHS)
    text = " ".join(vocab.get_vocabulary().decode(e["targets"].tolist())
                    for e in exs)
    assert "tomatoes" in text and "(" not in text
    with gin.unlock_config():
      gin.bind_parameter("th_data.corpus_paths.validation", "")
    with pytest.raises(ValueError, match=r"th_data\.corpus_paths\.validation"):
      seqio.get_mixture_or_task("th_mlm").get_dataset(
          sequence_length=MLM_LENGTHS, split="validation", shuffle=False)
  finally:
    with gin.unlock_config():
      gin.bind_parameter("th_data.corpus_paths.train", None)
      gin.bind_parameter("th_data.corpus_paths.validation", None)
  # Back to the embedded corpus.
  assert tasks.CorpusSource().resolved()["default"]


@pytest.mark.parametrize("train,validation,param", [
    (None, "VALID", "train_path"),
    ("TRAIN", None, "validation_path"),
    ("", "VALID", "train_path"),
    ("TRAIN", "   ", "validation_path"),
    ("MISSING", "VALID", "train_path"),
    ("TRAIN", "EMPTY", "validation_path"),
    (["TRAIN", ""], "VALID", "train_path"),
])
def test_missing_or_empty_paths_raise(tmp_path, train, validation, param):
  files = {"TRAIN": _write(tmp_path / "t.txt", _USER_TEXT),
           "VALID": _write(tmp_path / "v.txt", _USER_TEXT),
           "MISSING": str(tmp_path / "nope" / "*.txt"),
           "EMPTY": str(tmp_path / "empty.txt")}
  (tmp_path / "empty.txt").write_text("")

  def sub(x):
    if isinstance(x, list):
      return [files.get(i, i) for i in x]
    return files.get(x, x)
  before = set(seqio.TaskRegistry.names())
  with pytest.raises(ValueError, match=param):
    tasks.register_text_tasks("th_test_bad", sub(train), sub(validation))
  assert set(seqio.TaskRegistry.names()) == before


def test_both_paths_missing_raises():
  with pytest.raises(ValueError, match="train_path"):
    tasks.register_text_tasks("th_test_none", None, None)


# --------------------------------------------------------- standard tasks


def test_standard_tasks_are_registered():
  for name in tasks.STANDARD_TASKS + tasks.PRETRAINING_TASKS + (
      tasks.FINETUNE_MIXTURE,):
    assert seqio.get_mixture_or_task(name).name == name
  mixture = seqio.MixtureRegistry.get(tasks.FINETUNE_MIXTURE)
  names = {t.name for t in mixture.tasks}
  assert {"squad_v010_allanswers", "glue_cola_v002", "glue_mnli_v002",
          "super_glue_boolq_v102", "super_glue_record_v102"} <= names
  assert not [n for n in names if n.startswith("c4")]
  rate = dict((t.name, mixture.get_rate(t)) for t in mixture.tasks)
  assert rate["squad_v010_allanswers"] == tasks.SQUAD_V11_TRAIN_EXAMPLES
  assert rate["glue_mnli_v002"] == 392_702 and rate["glue_ax_v002"] == 0
