"""`mtf_th plan` and train's pre-flight price the same vocabulary.

plan reads the gin files' task's vocabulary (data/task_names.vocabulary_size,
padded to a multiple of 128 as mtf pads it); the pre-flight memory checks
of train and finetune (fit_check.cpu_refusal through common.memory_check)
and of eval and decode (prechecks.forward_memory) used to price T5's 32128
ids whatever the task.  Both now take vocabulary.priced_vocab.  Pure Python: the
byte-vocabulary LM (th_lm_bytes, 259 ids -> 384) at a batch no machine's
RAM holds, so train refuses it: the figure of its line is the one plan
prints for the same gin (962.26 GiB; 23667.38 GiB with 32128 ids).
"""
import argparse

import pytest

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import plan
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.commands import vocabulary
from mtf_talking_heads.estimate import fit_check
from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import model as model_lib

BYTES = ["experiments/lm_heads/01_multi_head_4_32.gin", "models/lm_tiny.gin"]
HUGE = ["batch_size = 2000000"]


class _Training(object):
  ConfigError = ValueError  # what common.memory_check raises


def test_priced_vocab_is_the_tasks_padded():
  assert vocabulary.priced_vocab(BYTES) == 384  # th_lm_bytes: 259 ids
  # a task registered elsewhere: plan asks for --vocab; the pre-flight
  # prices T5's vocabulary, as before
  assert vocabulary.priced_vocab(
      BYTES, ["MIXTURE_NAME = 'my_task'"]) == model_lib.PAPER_T5["vocab"]


def test_train_preflight_and_plan_give_the_same_figure(capsys):
  args = argparse.Namespace(gin_file=BYTES, gin_param=HUGE, tpu=None)
  with pytest.raises(ValueError) as e:
    common.memory_check(args, _Training)
  train_line = str(e.value)
  assert train_line.startswith("predicted 962.26 GiB per device for mesh "
                               "model:1 (1 device) but this machine's "), (
                                   train_line)
  assert plan.main(sum((["--gin_file", f] for f in BYTES), []) +
                   ["--gin_param", HUGE[0], "--hardware", "cpu", "--devices",
                    "1"]) == 1
  plan_line, = capsys.readouterr().err.splitlines()
  assert plan_line.startswith(
      "mtf_th plan: nothing fits: the smallest is 962.26 GiB per device "
      "(batch:1,model:1, heads_parallel) against "), plan_line
  # T5's vocabulary, what the pre-flight priced before
  total = fit_check.smallest(BYTES, HUGE, "cpu")[0]
  assert "%.2f" % (total / memory.GiB) == "23667.38"


def test_eval_preflight_prices_the_tasks_vocabulary(tmp_path):
  """forward_memory's figure is the forward pass with 384 ids."""
  def gib(vocab):
    return "%.2f" % (fit_check.smallest_forward(
        model_lib.model_from_gin(BYTES, HUGE, vocab=vocab), "model:1",
        "mtf_th_float32") / memory.GiB)
  assert (gib(384), gib(model_lib.PAPER_T5["vocab"])) == ("274.66",
                                                          "15350.36")
  with pytest.raises(commands.UsageError) as e:
    prechecks.forward_memory(str(tmp_path), BYTES, HUGE, "eval")
  assert str(e.value).startswith(
      "predicted 274.66 GiB per device for eval's forward pass (batch_size "
      "2000000, mesh model:1, 1 device) but this machine's "), str(e.value)
