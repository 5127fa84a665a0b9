"""The vocabulary a run of gin files computes with, read without TensorFlow.

`mtf_th plan` prices a model with its task's vocabulary (the gin files'
MIXTURE_NAME: data/task_names.vocabulary_size, padded to a multiple of 128
as mtf pads it), and the pre-flight memory checks of train, finetune,
eval, decode and launch/tpu.py (estimate/fit_check.py,
prechecks.forward_memory) price the same one: priced_vocab.

Example:
  task_vocab(["experiments/lm_heads/01_multi_head_4_32.gin"])
  # -> (259, "th_lm_bytes")
  priced_vocab(["experiments/lm_heads/01_multi_head_4_32.gin"])  # -> 384
"""
from mtf_talking_heads import commands


def priced_vocab(gin_files, gin_params=()):
  """The padded vocabulary dim `mtf_th plan` prices a run of the gin files
  with, for the pre-flight memory checks of train, finetune, eval, decode
  and launch/tpu.py (estimate/fit_check.py): the task's (task_vocab),
  padded as mtf pads it; T5's 32128 when plan cannot tell (a task
  registered elsewhere, a vocabulary file of one's own: plan asks for
  --vocab).

  Example:
    priced_vocab(["experiments/lm_heads/01_multi_head_4_32.gin"]) == 384
  """
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  try:
    return model_lib.padded_vocab(task_vocab(gin_files, gin_params)[0])
  except (commands.UsageError, ValueError, OSError):
    return model_lib.PAPER_T5["vocab"]


def task_vocab(gin_files, gin_params=()):
  """(ids of its vocabulary, the gin files' MIXTURE_NAME); the local
  SentencePiece vocabulary's size from th_data.vocabulary_options.size.

  Raises:
    commands.UsageError: a task registered elsewhere, or a vocabulary
      file of one's own (th_data.vocabulary_options.path): give --vocab.
  """
  import os  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  config = gin_text.GinConfig(gin_files, gin_params)
  name = config.get("MIXTURE_NAME") or config.binding(
      "mesh_train_dataset_fn.mixture_or_task_name")
  names = runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "data", "task_names.py"))
  pieces = config.binding("th_data.vocabulary_options.size",
                          names["LOCAL_PIECES"])
  size = names["vocabulary_size"](name, pieces) if isinstance(
      name, str) else None
  own = config.binding("th_data.vocabulary_options.path")
  if size is None or (own and size != names["BYTE_VOCAB_SIZE"] and
                      size != names["T5_VOCAB_SIZE"]):
    raise commands.UsageError(
        "cannot tell the vocabulary size of %s: give --vocab N (its ids; "
        "T5's 32128, bytes 259)" % (
            "th_data.vocabulary_options.path %r" % own if own and size
            else "MIXTURE_NAME %r" % (name,)))
  return size, name
