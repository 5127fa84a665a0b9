"""The embedded fine-tuning tasks of the sweep's downstream columns
(data/downstream.py): th_embedded_entailment (MNLI's form) and
th_embedded_cloze (SQuAD's form) are answerable from their inputs, balanced,
disjoint across splits and within the fine-tuning lengths; fast (no model).
What a fine-tuned model scores on them: docs/results.md, "Downstream".
"""
import collections
import re
import socket

import pytest
import seqio
from t5.evaluation import qa_utils

from mtf_talking_heads import data  # noqa: F401  (registers the tasks)
from mtf_talking_heads.data import downstream
from mtf_talking_heads.training import metrics

LENGTHS = {"inputs": 160, "targets": 16}
_ENTAILMENT = re.compile(r"mnli hypothesis: (.*) premise: (.*)$")
_CLOZE = re.compile(r"question: (.*) context: (.*)$")


def _contains_run(words, run):
  return any(words[i:i + len(run)] == run for i in range(len(words)))


@pytest.mark.parametrize("split", ["train", "validation"])
def test_entailment_labels_follow_from_premise_and_hypothesis(split):
  examples = downstream.examples(downstream.CLASSIFICATION, split)
  assert len(examples) >= 200
  counts = collections.Counter(e["targets"] for e in examples)
  assert set(counts) == set(downstream.ENTAILMENT_LABELS)
  assert min(counts.values()) / len(examples) > 0.25  # about a third each
  for ex in examples:
    hypothesis, premise = _ENTAILMENT.match(ex["inputs"]).groups()
    h, p = hypothesis.split(), premise.split()
    assert len(h) == downstream.HYPOTHESIS_WORDS
    assert len(p) == downstream.PREMISE_WORDS
    in_order = _contains_run(p, h)
    reordered = any(sorted(p[i:i + len(h)]) == sorted(h)
                    for i in range(len(p)))
    assert in_order == (ex["targets"] == "entailment"), ex
    if ex["targets"] == "contradiction":
      assert reordered, ex
    assert len(ex["inputs"].encode()) <= downstream.MAX_INPUT_BYTES


@pytest.mark.parametrize("split", ["train", "validation"])
def test_cloze_answer_is_the_only_filling_of_the_gap(split):
  examples = downstream.examples(downstream.SPAN, split)
  assert len(examples) >= 150
  for ex in examples:
    question, context = _CLOZE.match(ex["inputs"]).groups()
    assert question.count("_") == 1
    filled = question.replace("_", ex["targets"])
    assert context.count(filled) == 1, ex
    assert len(ex["targets"].split()) == downstream.CLOZE_WORDS
    assert ex["answers"] == [ex["targets"]]
    assert all(qa_utils.normalize_squad(w) for w in ex["targets"].split())
    assert len(ex["inputs"].encode()) <= downstream.MAX_INPUT_BYTES
    assert len(ex["targets"].encode()) <= downstream.MAX_TARGET_BYTES
  # answers vary: no answer is a tenth of the examples
  top = collections.Counter(e["targets"] for e in examples).most_common(1)
  assert top[0][1] < len(examples) / 10


def test_splits_are_disjoint_and_examples_deterministic():
  docs = downstream._documents("validation")
  for make in (downstream.entailment_examples, downstream.cloze_examples):
    assert make(docs) == make(list(docs))
  for task in (downstream.CLASSIFICATION, downstream.SPAN):
    train = {e["inputs"] for e in downstream.examples(task, "train")}
    assert not train & {e["inputs"]
                        for e in downstream.examples(task, "validation")}
  with pytest.raises(ValueError, match="task must be one of"):
    downstream.examples("th_nope", "train")


def test_small_examples_by_hand():
  premise = "Return the number of items in the container of type list".split()
  other = "Open a file and return a stream object for it".split()
  labels = set()
  for key in ("a", "b", "c", "d", "e", "f", "g"):
    ex = downstream.entailment_example(premise, other, key)
    if ex:
      labels.add(ex["targets"])
  assert labels == set(downstream.ENTAILMENT_LABELS)
  ex = downstream.cloze_example("Return the number of items in it".split())
  question, context = _CLOZE.match(ex["inputs"]).groups()
  assert context == "Return the number of items in it"
  assert question.replace("_", ex["targets"]) in context
  assert downstream.cloze_example("a a a a".split()) is None


@pytest.mark.parametrize("name", ["th_embedded_entailment_bytes",
                                  "th_embedded_cloze_bytes",
                                  "th_embedded_cloze"])
def test_registered_with_their_metrics(name):
  task = seqio.get_mixture_or_task(name)
  examples = metrics.task_examples(task, LENGTHS, "validation", 6)
  perfect = [ex["targets_pretokenized"].decode() for ex in examples]
  best = metrics.metric_values(task, examples, perfect)
  worst = metrics.metric_values(task, examples, [""] * 6)
  assert set(best) == ({"accuracy"} if "entailment" in name
                       else {"em", "f1"})
  assert all(v == pytest.approx(100.0) for v in best.values())
  assert all(v == 0.0 for v in worst.values())
  # nothing is cut: the tokenized inputs end in EOS within the length
  for ex in examples:
    assert ex["inputs"][-1] == 1 and len(ex["inputs"]) <= LENGTHS["inputs"]


def test_copy_task_is_its_inputs_in_bytes_without_the_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("th_copy_bytes tried the network: %r" % (args,))
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  assert downstream.copy_examples(["Return the number of items"], 8) == [
      {"inputs": p, "targets": p} for p in ("Return t", "he numbe", "r of ite")]
  # not ASCII, or a space at either end: skipped
  assert downstream.copy_examples(["caf\u00e9 au lait", " abc def"], 4) == [
      {"inputs": "lait", "targets": "lait"}]
  task = seqio.get_mixture_or_task("th_copy_bytes")
  examples = metrics.task_examples(task, {"inputs": 33, "targets": 33},
                                   "validation", 4)
  assert len(downstream.examples(downstream.COPY, "validation")) == 400
  for ex in examples:
    text = ex["inputs_pretokenized"].decode()
    assert len(text) == downstream.COPY_BYTES == 32 and text == text.strip()
    # bytes + 3 (ByteVocabulary's pad, EOS, UNK), then EOS
    assert ex["inputs"].tolist() == [b + 3 for b in text.encode()] + [1]
    assert ex["targets"].tolist() == ex["inputs"].tolist()
  best = metrics.metric_values(task, examples, [
      ex["targets_pretokenized"].decode() for ex in examples])
  half = metrics.metric_values(task, examples, [
      ex["targets_pretokenized"].decode()[:-1] if i % 2 else
      ex["targets_pretokenized"].decode() for i, ex in enumerate(examples)])
  assert best == {"sequence_accuracy": 100.0}
  assert half == {"sequence_accuracy": 50.0}
  # th_copy128_bytes: the same at 128 bytes (184 validation examples)
  assert len(downstream.examples(downstream.COPY128, "validation")) == 184
  ex, = metrics.task_examples(seqio.get_mixture_or_task("th_copy128_bytes"),
                              {"inputs": 129, "targets": 129}, "validation", 1)
  text = ex["inputs_pretokenized"].decode()
  assert len(text) == downstream.COPY128_BYTES == 128 and text == text.strip()
  assert ex["targets"].tolist() == ex["inputs"].tolist()
