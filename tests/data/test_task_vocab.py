"""data/task_names.vocabulary_size (what `mtf_th plan` prices without
TensorFlow) against the vocabulary each registered task really reads."""
import pytest
import seqio

import mtf_talking_heads.data  # noqa: F401  registers the tasks
from mtf_talking_heads.data import task_names
from mtf_talking_heads.data import vocab

T5_FILES = ("gs://t5-data/vocabs/cc_all.32000/sentencepiece.model",
            "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model")


def _vocabularies(name):
  task = seqio.get_mixture_or_task(name)
  tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
  return [f.vocabulary for t in tasks for f in t.output_features.values()]


@pytest.mark.parametrize("name", task_names.THIS_PACKAGE + task_names.T5)
def test_vocabulary_size_is_the_tasks(name):
  size = task_names.vocabulary_size(name)
  for v in _vocabularies(name):
    if isinstance(v, seqio.ByteVocabulary):
      assert size == v.vocab_size == 259
    elif isinstance(v, vocab.LazySentencePieceVocabulary):
      # vocab.DEFAULT_VOCAB_SIZE pieces (trained at first use) + sentinels
      assert size == vocab.DEFAULT_VOCAB_SIZE + v.extra_ids == 8100
    else:  # t5's published vocabulary, 100 sentinels added or built in
      assert v.sentencepiece_model_file in T5_FILES
      assert v.extra_ids == (0 if "100extra" in v.sentencepiece_model_file
                             else 100)
      assert size == 32100


def test_a_name_registered_elsewhere_has_no_known_size():
  assert task_names.vocabulary_size("my_task") is None
  assert task_names.vocabulary_size("th_span_corruption", pieces=300) == 400
