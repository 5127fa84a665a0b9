"""The model a model_dir holds, checked once the graph's weights are known.

Owns what runtime/identity.py (the identity file, the architecture read
from gin text, before TensorFlow) cannot do without TensorFlow: the
configured model's weights (checkpoints.configured_variables: the mtf
graph built in a scratch tf.Graph, nothing written), a checkpoint's weights
(tf.train.list_variables: optimizer slots and global_step left out), and
the checks of training/setup.prepare:

  check_writer    train / finetune into model_dir: the weights recorded there
                  (model_identity.json, or the latest checkpoint of a
                  model_dir trained before it existed) are the configured
                  ones, in name, shape and dtype; else one line naming the
                  difference and the two ways out, before anything is
                  written.
  check_readers   eval / decode: every checkpoint read holds exactly the
                  configured weights (no more: a 1-layer configuration
                  would read the first layer of a 2-layer checkpoint).
  check_pretrained  finetune: the pre-trained checkpoint holds exactly the
                  configured weights; with allow_partial_load, the weights of
                  the same name and shape are loaded and the others
                  initialised.  Either way one line says which.

recorded_at_first_save(model_dir) writes model_identity.json (atomically)
after the first checkpoint a run saves.
"""
import contextlib
import os
import re
import sys

import gin
from mesh_tensorflow.transformer import utils as mtf_utils
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn import models
from mtf_talking_heads.runtime import identity as identity_lib
from mtf_talking_heads.training import checkpoints
from mtf_talking_heads.training import errors

# model_dir -> the Identity its run is about to save (prepare() sets it,
# the first save writes it)
_PENDING = {}
# mtf's regex over the init checkpoint's names: what utils.run loads
_INIT_FILTER = "utils.tpu_estimator_model_fn.init_variable_filter"


def _key(model_dir):
  return model_dir.rstrip("/")


def configured(settings, gin_files=(), gin_params=()):
  """The Identity the parsed configuration builds.

  Args:
    settings: the pre-flight's Settings (gin parsed).
    gin_files, gin_params: the same configuration as text (its
      architecture: runtime/identity.architecture_from_gin).
  """
  dtype = mtf_utils.get_variable_dtype().master_dtype.name
  variables = {name: (list(shape), dtype) for name, shape in
               checkpoints.configured_variables(settings).items()}
  arch = (identity_lib.architecture_from_gin(gin_files, gin_params)
          if gin_files else None)
  return identity_lib.Identity(arch, variables, None)


def checkpoint_weights(path):
  """{name: (shape, dtype)} of a checkpoint's weights (no optimizer slots,
  no global_step)."""
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  return identity_lib.weights({
      name: (list(shape), dtypes[name].name)
      for name, shape in tf.train.list_variables(path)})


def _recorded(model_dir):
  """The Identity model_dir holds (its file, else its latest checkpoint's
  weights), or None without checkpoints."""
  try:
    found = identity_lib.recorded(model_dir, checkpoints._GFILE)  # pylint: disable=protected-access
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  if found is None or found.variables is not None:
    return found
  latest = checkpoints.latest_checkpoint(model_dir)
  if latest is None:
    return None
  return found._replace(variables=checkpoint_weights(latest),
                        source=os.path.basename(latest))


def check_writer(model_dir, model, flag="--model_dir"):
  """Refuses to train another model into model_dir; else the identity to
  record at the first save is `model`.

  Raises:
    ConfigError: one line naming the difference and the two ways out.
  """
  found = (_recorded(model_dir) if tf.io.gfile.exists(model_dir) else None)
  if found is not None:
    difference = identity_lib.describe_difference(
        found.variables, model.variables, "the model_dir",
        "this configuration")
    if difference:
      raise errors.ConfigError(
          "%s %s holds another model than this configuration builds (%s): "
          "%s; use a new %s, or the gin files it was trained with (see "
          "%s)" % (flag, model_dir, found.source, difference, flag,
                   os.path.join(model_dir, identity_lib.OPERATIVE_CONFIG)))
    if model.architecture is None and found.architecture is not None:
      model = model._replace(architecture=found.architecture)
  _PENDING[_key(model_dir)] = model


def check_readers(paths, model, flag="--model_dir"):
  """Each checkpoint in `paths` holds exactly the configured weights.

  Shapes and names only (readers read a checkpoint in its own dtype:
  checkpoints.match_checkpoint_dtype).

  Raises:
    ConfigError: one line naming the checkpoint and the difference.
  """
  for path in paths:
    difference = identity_lib.describe_difference(
        checkpoint_weights(path), model.variables, "the checkpoint",
        "this configuration", dtypes=False)
    if difference:
      model_dir = os.path.dirname(path)
      raise errors.ConfigError(
          "%s %s: checkpoint %s holds another model than this configuration "
          "builds: %s; give the gin files it was trained with (without "
          "--gin_file, %s is read: the last training run's)" % (
              flag, model_dir, os.path.basename(path), difference,
              os.path.join(model_dir, identity_lib.OPERATIVE_CONFIG)))


def _load_plan(path, model):
  """What mtf's utils.run loads from init_checkpoint `path`: (loaded,
  initialised, left out of the checkpoint, other shape) weight names,
  with the init filters as gin binds them (_INIT_FILTER,
  should_load_variable, init_checkpoint_variable_mapping)."""
  stored = checkpoint_weights(path)
  pattern = models.query(_INIT_FILTER)
  if pattern:
    stored_visible = {n: v for n, v in stored.items()
                      if re.search(pattern, n)}
  else:
    stored_visible = stored
  loaded, initialised, other_shape, used = [], [], [], set()
  for name, (shape, dtype) in sorted(model.variables.items()):
    source = mtf_utils.init_checkpoint_variable_mapping(name)
    if not mtf_utils.should_load_variable(name) or (
        source not in stored_visible):
      initialised.append(name)
      continue
    used.add(source)
    s_shape, s_dtype = stored_visible[source]
    if list(s_shape) != list(shape) or (s_dtype and dtype and
                                        s_dtype != dtype):
      other_shape.append(name)
      initialised.append(name)
    else:
      loaded.append(name)
  left_out = sorted(set(stored) - used) + [
      mtf_utils.init_checkpoint_variable_mapping(n) for n in other_shape]
  return loaded, initialised, sorted(set(left_out)), other_shape


def check_pretrained(path, step, model, allow_partial_load=False,
                     flag="--pretrained_model_dir", log=None):
  """Fine-tuning's start: the checkpoint's weights are the configured ones.

  Prints one line saying exactly which weights are loaded and which are
  initialised.  With allow_partial_load, weights of the same name but
  another shape or dtype are kept out of the load
  (_INIT_FILTER), so they are initialised too.

  Raises:
    ConfigError: they differ and not allow_partial_load (one line naming
      the difference, the gin files to use and --allow_partial_load).
  """
  loaded, initialised, left_out, other_shape = _load_plan(path, model)
  model_dir = os.path.dirname(path)
  if (initialised or left_out) and not allow_partial_load:
    difference = identity_lib.describe_difference(
        checkpoint_weights(path), model.variables, "the checkpoint",
        "this configuration") or (
            "utils.run's init filters leave out %s" % identity_lib.compress(
                initialised, 6))
    raise errors.ConfigError(
        "%s %s: checkpoint %s holds another model than this configuration "
        "builds: %s; give the gin files it was trained with (see %s), or "
        "pass --allow_partial_load to load only the weights of the same name "
        "and shape and initialise the others" % (
            flag, model_dir, os.path.basename(path), difference,
            os.path.join(model_dir, identity_lib.OPERATIVE_CONFIG)))
  if other_shape:
    keep_out = "|".join(re.escape(mtf_utils.init_checkpoint_variable_mapping(
        n)) for n in other_shape)
    pattern = r"^(?!(?:%s)(?:_slot_\w+)?$)" % keep_out
    user = models.query(_INIT_FILTER)
    if user:
      pattern += "(?=.*?(?:%s))" % user
    with gin.unlock_config():
      gin.bind_parameter(_INIT_FILTER, pattern)
  print("[finetune] %s" % load_line(path, step, loaded, initialised,
                                    left_out, len(model.variables)),
        file=log or sys.stderr, flush=True)


def load_line(path, step, loaded, initialised, left_out, total):
  """The line that says what fine-tuning loads and initialises.

  Example:
    "from /r/model.ckpt-2 (step 2): loads all 22 weights of this
     configuration (and their optimizer slots), initialises none"
  """
  head = "from %s (step %d): " % (path, step)
  if not initialised and not left_out:
    return head + ("loads all %d weights of this configuration (and their "
                   "optimizer slots), initialises none" % total)
  text = head + "loads %d of this configuration's %d weights%s, " % (
      len(loaded), total,
      " (%s)" % identity_lib.compress(loaded) if loaded else "")
  text += "initialises %d%s" % (
      len(initialised),
      " (%s)" % identity_lib.compress(initialised) if initialised else "")
  if left_out:
    text += ", leaves out %d of the checkpoint's (%s)" % (
        len(left_out), identity_lib.compress(left_out))
  return text


# --------------------------------------------------------------------------
# recording the identity


def _write(model_dir, identity):
  path = os.path.join(model_dir, identity_lib.IDENTITY_FILE)
  text = identity_lib.to_text(identity)
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      if f.read() == text:
        return
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(text)
  tf.io.gfile.rename(tmp, path, overwrite=True)


class _RecordOnSave(tf.train.CheckpointSaverListener):
  """Writes model_identity.json after the first checkpoint this run saves:
  the identity check_writer recorded, else the saved checkpoint's weights."""

  def __init__(self, model_dir):
    self._model_dir = model_dir
    self._done = False

  def after_save(self, session, global_step_value):
    del session
    if self._done:
      return
    self._done = True
    model = _PENDING.get(_key(self._model_dir))
    if model is None:
      path = os.path.join(self._model_dir, "model.ckpt-%d" % global_step_value)
      model = identity_lib.Identity(None, checkpoint_weights(path), None)
    _write(self._model_dir, model)


@contextlib.contextmanager
def recorded_at_first_save(model_dir):
  """While estimator.train runs: the saver hook (the class mtf builds, as
  checkpoints.checkpoint_policy installed it) also writes the identity."""
  base = tf.train.CheckpointSaverHook
  listener = _RecordOnSave(model_dir)

  class CheckpointSaverHook(base):

    def __init__(self, checkpoint_dir, *args, **kwargs):
      kwargs["listeners"] = list(kwargs.get("listeners") or ()) + [listener]
      super().__init__(checkpoint_dir, *args, **kwargs)

  tf.train.CheckpointSaverHook = CheckpointSaverHook
  try:
    yield
  finally:
    tf.train.CheckpointSaverHook = base
