"""mtf_th decode and eval --metrics refuse a model that cannot decode text.

Both go through training.decoding.load_for_decoding; these tests stand in
for the checkpoint (no training) so that only the checks run.  A plain LM
(model_type lm) is refused; the same model fine-tuned text-to-text
(delimited_lm) decodes (tests/sweeps/test_finetune_chain.py runs it).
"""
import gin
import pytest

from mtf_talking_heads import training
from mtf_talking_heads.training import checkpoints
from mtf_talking_heads.training import decoding
from mtf_talking_heads.training import metrics


@pytest.fixture()
def decoder_only(monkeypatch):
  """A 'model dir' whose checkpoint is the decoder-only lm_tiny model."""
  monkeypatch.setattr(checkpoints, "checkpoint_paths",
                      lambda model_dir, step: [(4, "/nowhere/model.ckpt-4")])
  monkeypatch.setattr(checkpoints, "operative_gin",
                      lambda model_dir, files: ["models/lm_small.gin",
                                                "models/lm_tiny.gin"])
  monkeypatch.setattr(checkpoints, "match_checkpoint_dtype", lambda p: None)
  yield
  with gin.unlock_config():
    gin.clear_config()


def test_decode_refuses_a_decoder_only_model(decoder_only, tmp_path):
  with pytest.raises(training.ConfigError,
                     match=r"decode needs a text-to-text model .*delimited_lm: "
                           r"a decoder-only model fine-tuned with "
                           r"experiments/finetune_embedded_lm.gin.* this one "
                           r"is 'lm': score it with mtf_th eval"):
    training.decode(str(tmp_path))


def test_metrics_refuse_a_decoder_only_model(decoder_only, tmp_path):
  with pytest.raises(training.ConfigError,
                     match=r"downstream metrics decode text.* this one is "
                           r"'lm'"):
    metrics.score(str(tmp_path))


def test_held_out_decode_inputs_are_one_example_per_row():
  """mtf_th decode without --input: each row one validation input and its
  EOS, zero-padded (SentencePiece inputs are short enough that packing, as
  training does, would put 3-5 in a row; a delimited_lm model would read
  the second as the first one's answer)."""
  import seqio  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads import data  # noqa: F401  (registers the tasks)
  from mtf_talking_heads.training import estimator as estimator_lib
  task = seqio.get_mixture_or_task("th_embedded_acceptability_lm")
  vocabulary = task.output_features["inputs"].vocabulary
  length = {"inputs": 112, "targets": 16}
  rows = decoding._decode_inputs(task.name, length, vocabulary, None, 4,
                                 estimator_lib.EVAL_SEED)
  examples = metrics.task_examples(task, length, "validation", 4)
  assert rows.shape == (4, 112)
  for row, ex in zip(rows, examples):
    ids = list(ex["inputs"])
    assert ids[-1] == 1 and ids.count(1) == 1
    assert list(row) == ids + [0] * (112 - len(ids))
  # a given string longer than inputs_length keeps its EOS
  row, = decoding._decode_inputs(task.name, length, vocabulary,
                                 ["cola sentence: " + "word " * 200], 1, 0)
  assert row[-1] == 1 and list(row).count(1) == 1
