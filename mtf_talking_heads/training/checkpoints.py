"""Checkpoints: which to keep, which exist, and whether they fit the config.

Owns the keeping policy during training (CheckpointKeeper: the steps an eval
needs are never deleted; the saver hook and events writer that write the
graph only when asked), latest_step / checkpoint_steps / checkpoint_paths
(complete checkpoints only: runtime/run_files.py's listing, through
tf.io.gfile so a gs:// model_dir is listed too), the check that a checkpoint
holds every configured variable in its shape (no session, nothing written),
the checkpoint's dtype, and the operative_config.gin that eval / decode fall
back to.
"""
import contextlib
import os

import gin
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import utils as mtf_utils
import tensorflow.compat.v1 as tf

from mtf_talking_heads.core import compat
from mtf_talking_heads.runtime import checkpoint_index
from mtf_talking_heads.runtime import run_checks
from mtf_talking_heads.runtime import run_files
from mtf_talking_heads.training import errors
from mtf_talking_heads.training import settings as settings_lib


# --------------------------------------------------------------------------
# which to keep while training


class CheckpointKeeper(tf.train.CheckpointSaverListener):
  """Keeps the checkpoints an eval needs out of the Saver's deletion list.

  TF's Saver lists (in <model_dir>/checkpoint) and keeps the last
  utils.run.keep_checkpoint_max checkpoints and deletes older ones.  Before
  each save this listener takes out of that list the protected steps: those
  given (keep_checkpoint_steps), the step the run started from (0 for a
  fresh run, else the previous run's last checkpoint) and every step in
  eval_results.csv.  They stay on disk, complete but unlisted, and
  checkpoint_steps() (used by eval and decode) still finds them.  After
  each save it removes the model.ckpt-N_temp folders a killed save left
  (N <= the step saved).
  """

  def __init__(self, model_dir, steps):
    self._model_dir = model_dir
    self._steps = set(int(s) for s in steps)
    self.saver = None

  def protected(self):
    evaluated = set(r["step"] for r in run_files.read_eval_results(
        self._model_dir))
    return self._steps | evaluated

  def before_save(self, session, global_step_value):
    del session, global_step_value
    if self.saver is None:
      return
    keep = self.protected()
    self.saver.set_last_checkpoints_with_time([
        (path, t) for path, t in compat.checkpoints_with_time(self.saver)
        if run_files.checkpoint_step(path) not in keep])

  def after_save(self, session, global_step_value):
    """Removes the model.ckpt-N_temp folders of killed saves that this save
    supersedes (N <= its step; runtime/checkpoint_index.py)."""
    del session
    checkpoint_index.remove_stale_temps(self._model_dir,
                                        int(global_step_value))


def _saver_hook_class(keeper, write_graph):
  """tf.train.CheckpointSaverHook, as built by mtf, with our policy."""
  base = tf.train.CheckpointSaverHook

  class CheckpointSaverHook(base):
    """Adds `keeper`; writes graph.pbtxt, *.meta and the graph to the events
    file only if write_graph (each is the size of the whole graph)."""

    def __init__(self, checkpoint_dir, *args, **kwargs):
      kwargs["listeners"] = list(kwargs.get("listeners") or ()) + [keeper]
      kwargs["save_graph_def"] = write_graph
      super().__init__(checkpoint_dir, *args, **kwargs)

    def begin(self):
      super().begin()
      keeper.saver = self._get_saver()

    def after_create_session(self, session, coord):
      if write_graph:
        return super().after_create_session(session, coord)
      step = session.run(self._global_step_tensor)
      self._save(session, step)
      self._timer.update_last_triggered_step(step)

  return CheckpointSaverHook


@contextlib.contextmanager
def checkpoint_policy(model_dir, keeper, write_graph):
  """Our saver hook and events writer for the duration of estimator.train.

  mtf builds its CheckpointSaverHook inside estimator.train, so the class is
  swapped.  TF's hooks share one events writer per directory
  (FileWriterCache), which writes the whole graph into the events file when
  it is created; unless write_graph, it is created here without the graph.
  The writer is closed at the end: one events file per run.
  """
  saved = tf.train.CheckpointSaverHook
  tf.train.CheckpointSaverHook = _saver_hook_class(keeper, write_graph)
  if not write_graph:
    compat.cache_writer_without_graph(model_dir)
  try:
    yield
  finally:
    tf.train.CheckpointSaverHook = saved
    tf.summary.FileWriterCache.clear()


# --------------------------------------------------------------------------
# which exist


class _GFileOps(object):
  """run_files' file operations through tf.io.gfile (gs:// paths too), as
  tf.train.get_checkpoint_state / latest_checkpoint do them."""
  READ_ERRORS = (tf.errors.OpError,)

  @staticmethod
  def exists(path):
    return tf.io.gfile.exists(path)

  @staticmethod
  def glob(pattern):
    return tf.io.gfile.glob(pattern)

  @staticmethod
  def read_text(path):
    with tf.io.gfile.GFile(path) as f:
      return f.read()


_GFILE = _GFileOps()


def check_state(model_dir):
  """ConfigError if <model_dir>/checkpoint is damaged while checkpoints are
  here (run_files.damaged_state): nothing is read or written then."""
  message = run_checks.state_refusal(model_dir, _GFILE)
  if message:
    raise errors.ConfigError(message)


def check_files(model_dir, writes=False, steps=None, pretrained=None):
  """ConfigError (one line) if a file the run reads is damaged
  (runtime/run_checks.py: the checkpoints it reads or resumes from, its
  logs); `pretrained`: finetune's (directory, step), checked too."""
  try:
    run_checks.check(model_dir, writes=writes, steps=steps,
                     logs=None if writes else ())
    if pretrained is not None:
      run_checks.check(pretrained[0], "--pretrained_model_dir",
                       steps=pretrained[1], step_flag="--checkpoint_step")
  except run_checks.DamagedFile as e:
    raise errors.ConfigError(str(e)) from None


def latest_checkpoint(model_dir):
  """The latest checkpoint's prefix in model_dir if its files are there, else
  None (what tf.train.latest_checkpoint answers)."""
  return run_files.latest_checkpoint(model_dir, _GFILE)


def latest_step(model_dir):
  """Global step of the latest checkpoint in model_dir, or None."""
  return run_files.latest_step(model_dir, _GFILE)


def checkpoint_steps(model_dir):
  """Steps of the complete checkpoints in model_dir: a checkpoint counts if
  it is listed in model_dir/checkpoint or its index file exists, and its
  index and every data shard are present (run_files.checkpoint_steps)."""
  return run_files.checkpoint_steps(model_dir, _GFILE)


def checkpoint_paths(model_dir, steps, flag="--model_dir"):
  """Paths of the checkpoints for `steps` (None: latest; "all").

  `flag` names model_dir in messages (e.g. "--pretrained_model_dir").
  """
  available = checkpoint_steps(model_dir)
  if not available:
    raise errors.ConfigError("no checkpoint in %s %r: train first "
                             "(mtf_th train --model_dir %s ...)"
                             % (flag, model_dir, model_dir))
  if steps is None or steps == -1:
    steps = [available[-1]]
  elif steps == "all":
    steps = available
  elif isinstance(steps, int):
    steps = [steps]
  out = []
  for step in steps:
    if step not in available:
      raise errors.ConfigError(
          "no checkpoint for step %s in %s %s; available steps: %s"
          % (step, flag, model_dir, ", ".join(str(s) for s in available)))
    out.append((step, os.path.join(model_dir, "model.ckpt-%d" % step)))
  return out

# --------------------------------------------------------------------------
# do they fit the configuration


def configured_variables(settings):
  """{name: shape} of the configured model's variables, without a session.

  Builds the model's mtf graph (no lowering, no gradients, no optimizer) in
  a throw-away tf.Graph: a few seconds even for a base model, and nothing is
  written anywhere.  Names are those of the checkpoint's variables.
  """
  vocab_size = settings_lib.vocab_size()
  lengths = settings.sequence_length
  with tf.Graph().as_default():
    model = mtf_utils.build_model(
        model_type=settings.model_type, input_vocab_size=vocab_size,
        output_vocab_size=vocab_size, layout_rules=settings.layout,
        mesh_shape=settings.mesh_shape or mtf.Shape([]))
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "shapes")
    batch = mtf.Dimension("batch", settings.batch_size)

    def ids(key):
      length = mtf.Dimension("length", lengths.get(key) or lengths["targets"])
      return mtf.zeros(mesh, mtf.Shape([batch, length]), tf.int32)

    targets = ids("targets")
    if settings.model_type in ("lm", "delimited_lm"):
      inputs = transformer.autoregressive_inputs(targets)
    else:
      inputs = ids("inputs")
    model.call_simple(inputs=inputs, targets=targets, compute_loss=True,
                      mode="train",
                      variable_dtype=mtf_utils.get_variable_dtype())
    return {v.name: v.shape.to_integer_list for v in graph.all_variables}


def match_checkpoint_dtype(checkpoint_path):
  """Reads checkpoints in the dtype they were written in (bf16 or f32)."""
  reader = tf.train.load_checkpoint(checkpoint_path)
  dtypes = set(dtype for name, dtype in
               reader.get_variable_to_dtype_map().items()
               if "slot" not in name and not name.startswith("global_step"))
  if len(dtypes) == 1:
    with gin.unlock_config():
      gin.bind_parameter("utils.get_variable_dtype.master_dtype",
                         dtypes.pop().name)


def operative_gin(model_dir, gin_files):
  """Without gin files, eval/decode use the config the model was trained with."""
  if gin_files:
    return list(gin_files)
  path = os.path.join(model_dir, "operative_config.gin")
  if not os.path.exists(path):
    raise errors.ConfigError(
        "no --gin_file given and %s has no operative_config.gin: give the "
        "gin files the model was trained with" % model_dir)
  return [path]
