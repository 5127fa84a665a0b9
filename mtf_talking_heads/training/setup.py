"""The setup sequence of train, eval, decode and finetune, before any graph.

Owns prepare(): the one order in which a run finds the checkpoints it reads
or starts from, parses gin, runs the pre-flight (checks.preflight), prints
the model's size line (model_size.report) and compares the checkpoints with
the configuration; a run that writes (train, finetune) then also resolves
--tpu and creates model_dir.  Each step raises ConfigError with one line,
so the first problem in this order is the one reported.  The checks of a
function's own arguments (check_model_dir, --train_steps, ...) come before
it, in the caller; locking model_dir and utils.run come after.
"""
import collections

import tensorflow.compat.v1 as tf

from mtf_talking_heads.training import checkpoints
from mtf_talking_heads.training import checks
from mtf_talking_heads.training import estimator as estimator_lib
from mtf_talking_heads.training import identity
from mtf_talking_heads.training import model_size
from mtf_talking_heads.training import settings as settings_lib

# What prepare() returns: the pre-flight's Settings and model description,
# and the (step, path) checkpoints read (eval, decode) or started from
# (finetune; train: []).
Prepared = collections.namedtuple("Prepared",
                                  ["settings", "description", "checkpoints"])


def prepare(what, model_dir, gin_files=(), gin_params=(), tpu=None,
            tpu_zone=None, gcp_project=None, writes=False, steps=None,
            pretrained=None, extra_params=(), configure=None, check=None,
            allow_partial_load=False):
  """Runs the setup sequence of a train, eval, decode or finetune run.

  In order: (0) model_dir's `checkpoint` file is sound if checkpoints are
  there (checkpoints.check_state), and the checkpoints and logs it reads
  are not damaged (checkpoints.check_files); (1) the checkpoints: a
  reader's `steps` of model_dir, or finetune's `pretrained` one; (2)
  gin: gin_files (a reader without them: model_dir's
  operative_config.gin), gin_params, extra_params; a reader
  then reads its checkpoints in their dtype (bf16 or f32); (3)
  configure(checkpoints); (4) the pre-flight and the size line "[what]
  model: ..."; (5) check(settings); (6) the model (training/identity.py):
  a reader's checkpoints hold exactly the configured weights; a writer's
  model_dir holds no other model (model_identity.json, or its latest
  checkpoint), and finetune's pre-trained checkpoint holds the configured
  weights (or, with allow_partial_load, those of the same name and shape
  are loaded: one line says which); (7) a writer resolves --tpu and
  creates model_dir.

  Args:
    what: "train", "eval", "decode" or "finetune": the size line's label.
    model_dir: the run's directory.
    gin_files, gin_params: the run's gin files and bindings.
    tpu, tpu_zone, gcp_project: a Cloud TPU; None = CPU.
    writes: the run trains into model_dir (train, finetune); else it reads
      model_dir's checkpoints (eval, decode).
    steps: a reader's checkpoints (checkpoints.checkpoint_paths: None for
      the latest, "all", a step or a list of steps).
    pretrained: finetune's (directory, step): the checkpoint it starts from
      (step None: the latest).
    extra_params: bindings applied after gin_params (train's --train_steps).
    configure: called with the checkpoints once gin is parsed, before the
      pre-flight: bindings of the caller's own (the train_model_fn, the
      fine-tuning schedule).
    check: called with the Settings after the size line, before the
      checkpoints are compared.
    allow_partial_load: finetune's --allow_partial_load (identity.
      check_pretrained).
  Returns:
    Prepared(settings, description, checkpoints).
  Raises:
    ConfigError: the first problem, in one line.
  """
  checkpoints.check_state(model_dir)
  checkpoints.check_files(model_dir, writes, steps, pretrained)
  if writes:
    found = [] if pretrained is None else checkpoints.checkpoint_paths(
        pretrained[0], pretrained[1], "--pretrained_model_dir")[:1]
    settings_lib.parse_gin(gin_files, gin_params, extra_params)
  else:
    found = checkpoints.checkpoint_paths(model_dir, steps)
    settings_lib.parse_gin(checkpoints.operative_gin(model_dir, gin_files),
                           gin_params, extra_params)
    checkpoints.match_checkpoint_dtype(found[-1][1])
  if configure is not None:
    configure(found)
  settings, description = checks.preflight(tpu)
  checks.check_core_kernel(settings, description, train=writes)
  model_size.report(settings, description, what)
  if check is not None:
    check(settings)
  model = identity.configured(settings, gin_files,
                              list(gin_params) + list(extra_params))
  if not writes:
    identity.check_readers([path for _, path in found], model)
    return Prepared(settings, description, found)
  identity.check_writer(model_dir, model)
  if found:
    identity.check_pretrained(found[0][1], found[0][0], model,
                              allow_partial_load)
  estimator_lib.check_tpu(tpu, tpu_zone, gcp_project)
  tf.io.gfile.makedirs(model_dir)
  return Prepared(settings, description, found)
