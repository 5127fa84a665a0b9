"""Fine-tuning: continue a pre-trained checkpoint in a new model directory.

Owns finetune() (paper section 7.1: fine-tuning adds 131072 steps to the
pre-trained model; gin/experiments/finetune.gin): it starts utils.run from
the pre-trained checkpoint (init_checkpoint), never writes to the
pre-training directory, and resumes like train(); it loads exactly the
configured weights from that checkpoint, saying so in one line, and refuses
a checkpoint of another model (another attention variant, other shapes)
unless allow_partial_load (training/identity.check_pretrained); and
binds mtf_th.warmup_linear_decay.start_step, so that BERT's and ALBERT's
schedule warms up and decays over the fine-tuning steps only
(experiments/finetune_bert.gin, finetune_albert.gin).
"""
import os
import sys

import gin

from mtf_talking_heads.nn import models
from mtf_talking_heads.nn import optimizers  # noqa: F401  pylint: disable=unused-import  (gin: mtf_th.lamb, ...)
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import loop
from mtf_talking_heads.training import setup


def finetune(model_dir, pretrained_model_dir, gin_files=(), gin_params=(),
             finetune_steps=None, checkpoint_step=None, tpu=None,
             tpu_zone=None, gcp_project=None, allow_partial_load=False):
  """Fine-tunes a pre-trained checkpoint (paper section 7.1).

  Starts from pretrained_model_dir's checkpoint at step P (latest, or
  checkpoint_step) and trains to global step P + finetune_steps (default:
  the `finetune_steps` macro, 131072 in gin/experiments/finetune.gin) in
  model_dir; resumes like train().

  Args:
    model_dir: the fine-tuned model's directory (not the pre-trained one).
    pretrained_model_dir: a directory with pre-training checkpoints.
    gin_files: the pre-training model's gin files, then finetune.gin.
    gin_params: extra bindings.
    finetune_steps: steps to add (default: macro finetune_steps).
    checkpoint_step: the pre-training step to start from (default: latest).
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
    allow_partial_load: start although the pre-trained checkpoint's
      weights differ from the configured ones: load those of the same name
      and shape, initialise the others (default: refused, one line).
  Returns:
    the rows of model_dir/train_log.csv.
  """
  estimator_lib.check_model_dir(model_dir)
  if not pretrained_model_dir:
    raise errors.ConfigError("--pretrained_model_dir is required")
  if os.path.abspath(pretrained_model_dir) == os.path.abspath(model_dir):
    raise errors.ConfigError(
        "--model_dir must differ from --pretrained_model_dir "
        "(fine-tuning never overwrites pre-training checkpoints)")

  def configure(start):
    """From the pre-trained step P to P + finetune_steps."""
    nonlocal finetune_steps
    (step, path), = start
    if finetune_steps is None:
      finetune_steps = models.query("finetune_steps")
    errors.positive_int("finetune_steps", finetune_steps,
                        " (include experiments/finetune.gin or pass "
                        "--finetune_steps)")
    with gin.unlock_config():
      gin.bind_parameter("utils.run.init_checkpoint", path)
      gin.bind_parameter("utils.run.train_steps", step + finetune_steps)
      gin.bind_parameter("utils.run.total_run_steps", step + finetune_steps)
      gin.bind_parameter("utils.run.seen_data_init_step", step)
      gin.bind_parameter("mtf_th.warmup_linear_decay.start_step", step)
    loop.require_train_fn()

  prepared = setup.prepare(
      "finetune", model_dir, gin_files, gin_params, tpu, tpu_zone,
      gcp_project, writes=True,
      pretrained=(pretrained_model_dir, checkpoint_step), configure=configure,
      allow_partial_load=allow_partial_load)
  (step, path), = prepared.checkpoints
  print("[finetune] from %s (step %d) to step %d in %s"
        % (path, step, step + finetune_steps, model_dir), file=sys.stderr,
        flush=True)
  with estimator_lib.writer_lock(model_dir):
    estimator_lib.run(model_dir, tpu, tpu_zone, gcp_project, None,
                      prepared.settings)
  return run_files.read_train_log(model_dir)
