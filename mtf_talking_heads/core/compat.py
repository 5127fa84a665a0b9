"""The one place where the old mesh-tensorflow / t5 stack is mended.

Importing this module (which ``import mtf_talking_heads`` does first) puts
import hooks on ``sys.meta_path`` that apply every fix below at the moment
the module it mends is imported, so our code, mtf's own modules and the
stock ``t5_mesh_transformer --module_import=mtf_talking_heads`` all work on
the pinned stack (TF 2.15.1, mesh-tensorflow 0.1.21, t5 0.9.4).  The stock
script imports mesh_tensorflow before it reads --module_import (breakage 8):
the start-up file mtf_talking_heads_startup.pth, installed by setup.py, then
loads this module just before mesh_tensorflow is imported.  Each fix names
the upstream breakage it works around; see also ../shared/stack/README.md.

This module itself imports only the standard library, so the `mtf_th`
commands that need no TensorFlow can install the hooks for free.
"""
import contextlib
import importlib.util
import os
import sys
import tempfile
import types
import warnings

# Set by `--verbose` (set_verbose): keep TensorFlow's start-up messages,
# Python warnings and mtf's per-step tf.Print.
VERBOSE_ENV = "MTF_TH_VERBOSE"


def verbose():
  return os.environ.get(VERBOSE_ENV) == "1"


def set_verbose(value=True):
  """--verbose: show what the fixes below hide (also in child processes)."""
  if value:
    os.environ[VERBOSE_ENV] = "1"
  else:
    os.environ.pop(VERBOSE_ENV, None)


def _fix_register_tensor_conversion_function():
  """Breakage 1: mtf's tpu_variables.py calls ops.register_tensor_conversion_function.

  TF >= 2.13 moved it to tensor_conversion_registry, so `import
  mesh_tensorflow` raises AttributeError (tensorflow/mesh issues #392, #396).
  Runs just before mesh_tensorflow is imported (see _HOOKS).
  """
  from tensorflow.python.framework import ops as _tf_ops  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.framework import tensor_conversion_registry as _tcr  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  if not hasattr(_tf_ops, "register_tensor_conversion_function"):
    _tf_ops.register_tensor_conversion_function = (
        _tcr.register_tensor_conversion_function)


def _fix_t5_hf_model_import():
  """Breakage 2: `import t5.models` imports t5.models.hf_model, which needs torch.

  We never use the HuggingFace path; a stand-in module keeps 0.9 GB of torch
  out of the install.  A real torch, if installed, is left alone.
  """
  name = "t5.models.hf_model"
  if name in sys.modules or importlib.util.find_spec("torch") is not None:
    return
  stub = types.ModuleType(name)

  class HfPyTorchModel(object):  # pylint: disable=too-few-public-methods

    def __init__(self, *args, **kwargs):
      raise ImportError("t5's HfPyTorchModel needs torch, which "
                        "mtf_talking_heads does not install; use MtfModel.")

  stub.HfPyTorchModel = HfPyTorchModel
  sys.modules[name] = stub


def estimator_session_config(num_cpu_devices, base=None):
  """Breakage 3: Estimator's default session config exposes only CPU:0.

  With soft placement every logical CPU device then silently lands on CPU:0.
  Returns a ConfigProto whose device_count["CPU"] covers all logical devices.

  Args:
    num_cpu_devices: an integer, number of logical CPU devices.
    base: an optional tf.ConfigProto to extend.
  Returns:
    a tf.ConfigProto
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  config = tf.ConfigProto() if base is None else base
  config.device_count["CPU"] = max(int(num_cpu_devices), 1)
  config.allow_soft_placement = True
  return config


@contextlib.contextmanager
def bounded_session_close(timeout_secs):
  """Breakage 12: Session.close() on a cluster waits forever for a lost task.

  After a worker of a tf.distribute.Server cluster dies mid-run, the step
  fails at once (UnavailableError), but closing the session (which
  MonitoredSession does before the error reaches us) blocks in
  TF_CloseSession with no deadline, so the command hangs.  Inside this
  context a close that takes longer than `timeout_secs` is abandoned (its
  C session is leaked, not deleted: deleting would wait too).
  """
  import threading  # pylint: disable=g-import-not-at-top
  from tensorflow.python.client import session as session_lib  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  original = session_lib.BaseSession.close

  def close(self):
    done = threading.Event()

    def run():
      try:
        original(self)
      except Exception:  # pylint: disable=broad-except  (nobody waits for it:
        pass  # a lost task's close fails with DeadlineExceeded, no traceback)
      finally:
        done.set()
    threading.Thread(target=run, daemon=True).start()
    if not done.wait(timeout_secs):
      self._closed = True  # pylint: disable=protected-access
      self._session = None  # pylint: disable=protected-access

  session_lib.BaseSession.close = close
  try:
    yield
  finally:
    session_lib.BaseSession.close = original


_LOGICAL_CPUS = []


def split_cpu(num_devices):
  """Breakage 4: logical CPU devices must be configured before any op runs.

  Splits the host CPU into `num_devices` logical devices (idempotent; a
  second call asking for a different number raises a clear error).

  Args:
    num_devices: an integer >= 1.
  Returns:
    a list of device strings, e.g. ["/job:localhost/replica:0/task:0/device:CPU:0", ...]
  Raises:
    ValueError: if the CPU was already split into a different number.
  """
  import tensorflow as tf2  # pylint: disable=g-import-not-at-top
  if num_devices < 1:
    raise ValueError("num_devices must be >= 1, got %d" % num_devices)
  if _LOGICAL_CPUS:
    if len(_LOGICAL_CPUS) < num_devices:
      raise ValueError(
          "The CPU was already split into %d logical devices in this process; "
          "%d are needed. Start a new process (or split once into the "
          "largest number you need)." % (len(_LOGICAL_CPUS), num_devices))
    return _LOGICAL_CPUS[:num_devices]
  cpu = tf2.config.list_physical_devices("CPU")[0]
  existing = tf2.config.get_logical_device_configuration(cpu)
  if existing is None or len(existing) < num_devices:
    try:
      tf2.config.set_logical_device_configuration(
          cpu, [tf2.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as e:
      raise ValueError(
          "Cannot split the CPU into %d logical devices: TensorFlow is already "
          "initialised in this process (%s). Split before building any graph."
          % (num_devices, e)) from e
    existing = num_devices
  else:
    existing = len(existing)
  _LOGICAL_CPUS.extend(
      "/job:localhost/replica:0/task:0/device:CPU:%d" % i
      for i in range(existing))
  return _LOGICAL_CPUS[:num_devices]


# --------------------------------------------------------------------------
# Start-up noise (hidden unless --verbose)

# Breakage: TF 2.15's CUDA plugins register their factories twice when
# `import tensorflow` loads them, logging three "E" lines on every machine
# (tensorflow/tensorflow#62075).  TF_CPP_MIN_LOG_LEVEL=2 keeps E lines and 3
# would hide real errors for the whole process (TF reads it once), so only
# these lines are dropped, from what fd 2 receives during the import.
_IMPORT_NOISE = ("Unable to register cuDNN factory",
                 "Unable to register cuFFT factory",
                 "Unable to register cuBLAS factory")


def configure_estimator(estimator, seed):
  """Breakage 3 (continued) and TF1 ref variables: sets the estimator's
  private RunConfig (Estimator has no setter): the seed, every logical CPU
  device (estimator_session_config), and resource variables.

  Resource variables matter for reproducibility: with TF1 ref variables (what
  tf.disable_v2_behavior() selects) a read aliases the variable's buffer, so
  a gradient op that runs after the optimizer's assign to the same weight
  (nothing orders them) sees the updated value: two runs with the same seed
  and data then differ from the second step on.  A resource read is a copy.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  tf.enable_resource_variables()
  config = estimator._config  # pylint: disable=protected-access
  changes = {"tf_random_seed": seed}
  if not config.master and _LOGICAL_CPUS:
    changes["session_config"] = estimator_session_config(
        len(_LOGICAL_CPUS), base=config.session_config)
  set_run_config(estimator, config.replace(**changes))


def logical_cpu_count():
  """How many logical CPU devices split_cpu made in this process (0: none)."""
  return len(_LOGICAL_CPUS)


# --------------------------------------------------------------------------
# Private fields of TensorFlow, the estimator, mtf and gin, each read or set
# here only, because the pinned version has no public way to do it.

def set_run_config(estimator, config):
  """Breakage: tf.estimator.Estimator has no setter for its RunConfig.

  t5's utils.run builds the estimator, so its config (seed, session config,
  --cluster master) can only be changed afterwards, in the private fields
  the estimator reads it from.
  """
  estimator._config = config  # pylint: disable=protected-access
  estimator._session_config = config.session_config  # pylint: disable=protected-access


def default_session_config():
  """Breakage: TF 2.x has no public way to get the ConfigProto a
  tf.compat.v1.Session(config=None) uses (the eager context's, with the
  logical devices of split_cpu), to change one field of it.

  Returns:
    a new tf.ConfigProto.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.context().config


def wrap_model_fn(estimator, wrap):
  """Breakage: tf.estimator.Estimator cannot wrap its model_fn once built.

  t5's utils.run passes mtf's model_fn to the estimator itself; this replaces
  the estimator's private model_fn with wrap(model_fn) (init_seeds).
  """
  estimator._model_fn = wrap(estimator._model_fn)  # pylint: disable=protected-access


def run_config_with_master(config, target):
  """Breakage: RunConfig.replace refuses master and evaluation_master.

  TF 2.15's RunConfig takes them only from the TF_CONFIG environment
  variable, which would also make the estimator start a distributed
  coordinator; a --cluster run only needs its sessions on `target`.
  Sets both private fields of `config` (a fresh copy from replace) and
  returns it.
  """
  config._master = target  # pylint: disable=protected-access
  config._evaluation_master = target  # pylint: disable=protected-access
  return config


def add_control_inputs(op, inputs):
  """Breakage: TF has no public way to add control edges to an existing op.

  tf.control_dependencies only applies to ops created inside it; hooks.py
  orders an already built optimizer write after the reads of its variable.
  """
  op._add_control_inputs(inputs)  # pylint: disable=protected-access


def control_outputs(op):
  """Breakage: tf.Operation lists its control inputs publicly but not the
  ops that depend on it by a control edge; its private list (a copy)."""
  return list(op._control_outputs)  # pylint: disable=protected-access


def checkpoints_with_time(saver):
  """Breakage: tf.train.Saver's last_checkpoints drops the times.

  set_last_checkpoints_with_time needs [(path, time)], which only the
  saver's private list holds; a copy of it.
  """
  return list(saver._last_checkpoints)  # pylint: disable=protected-access


def cache_writer_without_graph(model_dir):
  """Breakage: TF's FileWriterCache cannot be given a writer.

  Its get(model_dir) creates a FileWriter with the default graph, which
  writes the whole graph into the events file; the cache has no public way
  to hold a writer made without it.  Puts one (for `model_dir`, unless the
  cache has one) in its private dict, under its lock.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  cache = tf.summary.FileWriterCache
  with cache._lock:  # pylint: disable=protected-access
    if model_dir not in cache._cache:  # pylint: disable=protected-access
      with tf.Graph().as_default():  # (FileWriter refuses eager mode)
        cache._cache[model_dir] = tf.summary.FileWriter(model_dir)  # pylint: disable=protected-access


def mtf_filter_features():
  """Breakage: mtf's transformer/utils.py keeps its feature filter private.

  utils.run maps every input example through _filter_features (drops the
  features the model does not read); an input built outside utils.run must
  do the same to feed the same tensors.  Returns that function.
  """
  from mesh_tensorflow.transformer import utils as mtf_utils  # pylint: disable=g-import-not-at-top
  return mtf_utils._filter_features  # pylint: disable=protected-access


def gin_search_path():
  """Breakage: gin-config 0.5 has no public view of its file search path.

  add_config_file_search_path only appends; this returns gin's private list
  of directories (read only) so a gin file can be resolved as gin would, and
  a directory is added once.
  """
  import gin  # pylint: disable=g-import-not-at-top
  return gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access


@contextlib.contextmanager
def no_session_recovery(tpu):
  """Breakage: TF's MonitoredSession retries AbortedError/UnavailableError forever.

  Sets two private module constants (no public switch exists).

  It treats both as a preemption and rebuilds the session (rewriting the
  graph to the events file) in an endless loop, e.g. on a oneDNN kernel's
  AbortedError; and TPUEstimator (which utils.run uses on CPU too) drops
  both when they reach it, so a run stopped by one would end as if it had
  succeeded.  On CPU nothing can be preempted, so no error is retried or
  dropped; on a TPU only UnavailableError (a lost worker) is.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.training import monitored_session  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import error_handling  # pylint: disable=g-import-not-at-top
  saved = (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
           error_handling._IGNORED_ERRORS)  # pylint: disable=protected-access
  recoverable = (tf.errors.UnavailableError,) if tpu else ()
  monitored_session._PREEMPTION_ERRORS = recoverable  # pylint: disable=protected-access
  error_handling._IGNORED_ERRORS = recoverable  # pylint: disable=protected-access
  try:
    yield
  finally:
    (monitored_session._PREEMPTION_ERRORS,  # pylint: disable=protected-access
     error_handling._IGNORED_ERRORS) = saved  # pylint: disable=protected-access


def layout_pairs(layout):
  """Breakage: mtf 0.1.21's LayoutRules neither lists nor adds its rules.

  Returns the rules' own set of (tensor dim, mesh axis) pairs (mutable:
  add_layout_rules grows it).
  """
  return layout._pairs  # pylint: disable=protected-access


def add_layout_rules(layout, rules):
  """Adds the missing (tensor dim, mesh axis) `rules` to an mtf.LayoutRules.

  t5's utils.run converts the gin layout to one mtf.LayoutRules and hands
  that object both to the model (context.model.layout) and to the mesh
  implementation that lowers the graph, so a rule added while the model is
  built (strategies.Auto's) is in the layout the graph is lowered with.
  LayoutRules has no method to add one (see layout_pairs).

  Returns:
    the pairs added (those the layout did not have).
  """
  pairs = layout_pairs(layout)
  added = [tuple(r) for r in rules if tuple(r) not in pairs]
  pairs.update(added)
  return added


def gin_bindings():
  """Breakage: gin-config 0.5 has no public view of the parsed bindings.

  Returns gin's private {(scope, selector): {param: value}} (read only:
  gin_checks looks for bindings nothing reads).
  """
  import gin  # pylint: disable=g-import-not-at-top
  return gin.config._CONFIG  # pylint: disable=protected-access


def gin_configurable(selector):
  """Breakage: gin-config 0.5 has no public lookup of a configurable by a
  (partial) selector; its private registry's get_match (None if unknown)."""
  import gin  # pylint: disable=g-import-not-at-top
  return gin.config._REGISTRY.get_match(selector)  # pylint: disable=protected-access


@contextlib.contextmanager
def _stderr_without(patterns):
  """Captures file descriptor 2; replays it without lines naming `patterns`."""
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError, AttributeError):
    yield
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      try:
        sys.stderr.flush()
      except (OSError, ValueError, AttributeError):
        pass
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().splitlines(True)
              if not any(p.encode() in line for p in patterns)]
      if kept:
        os.write(2, b"".join(kept))


def _quiet_python_warnings():
  """Breakage: setuptools 80 warns "pkg_resources is deprecated" when mtf's
  transformer/utils.py (and tensorflow_hub) import pkg_resources, which the
  pin keeps (see README, setuptools)."""
  warnings.filterwarnings("ignore", message="pkg_resources is deprecated",
                          category=UserWarning)


def _before_tensorflow():
  if not verbose():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _quiet_python_warnings()


class _TfWithoutPrint(types.ModuleType):
  """tensorflow.compat.v1, except that Print passes its input through."""

  def __init__(self, tf_module):
    super().__init__(tf_module.__name__, tf_module.__doc__)
    self._tf = tf_module

  def __getattr__(self, name):
    return getattr(self._tf, name)

  @staticmethod
  def Print(input_, *args, **kwargs):  # pylint: disable=invalid-name,unused-argument
    return input_


def _after_mtf_utils(module):
  """Breakage: mtf's transformer/utils.py (model_fn, ~line 939) wraps the
  loss in tf.Print, so every training step writes "step, tf_loss[...]" to
  stderr under our progress lines.  Unless --verbose, its `tf` is
  tensorflow.compat.v1 with a pass-through Print."""
  if not verbose() and not isinstance(module.tf, _TfWithoutPrint):
    module.tf = _TfWithoutPrint(module.tf)
  _fix_decode_from_file(module)


def _fix_decode_from_file(module):
  """Breakage 14: mtf's decode_from_file (utils.run's infer mode: the stock
  t5_mesh_transformer, t5's MtfModel.predict) writes each decode with
  str(), and on CPU the decodes are bytes (detokenized in the graph), so
  the file holds "b'...'" lines.  Bytes are written as UTF-8 text here
  (undecodable bytes dropped, as seqio's ByteVocabulary.decode does)."""
  original = module.write_lines_to_file
  if getattr(original, "_mtf_th_text", False):
    return

  def write_lines_to_file(lines, filename):
    return original([line.decode("utf-8", errors="ignore")
                     if isinstance(line, bytes) else line for line in lines],
                    filename)

  write_lines_to_file._mtf_th_text = True  # pylint: disable=protected-access
  module.write_lines_to_file = write_lines_to_file


class _FlagsOrDefaults(object):
  """absl's flags: their values once a command line was parsed, else their
  defaults (never parses sys.argv itself)."""

  def __getattr__(self, name):
    from absl import flags  # pylint: disable=g-import-not-at-top
    if flags.FLAGS.is_parsed():
      return getattr(flags.FLAGS, name)
    try:
      return flags.FLAGS[name].value
    except KeyError:
      raise AttributeError(name) from None


def _after_simd_mesh_impl(module):
  """Breakage 13: mtf's TPU model_fn (utils.tpu_estimator_model_fn, which
  `mtf_th train --tpu` runs through utils.run) fails on every TPU slice
  before its first op.

  (a) It reads the --fold_xy and --logical_cores_per_chip flags through
  tf.flags, which parses sys.argv on first access: under `mtf_th` (argparse)
  that is UnrecognizedFlagError ("Unknown command line flag 'model_dir'").
  Here the flags keep their defaults unless absl parsed a command line (the
  stock t5_mesh_transformer does, so its --logical_cores_per_chip works).
  (b) auto_logical_to_physical_tpu returns its helper `_default_value`
  instead of calling it when a chip has another number of cores than
  --logical_cores_per_chip (2): on a TPU v4 (one core per chip) SimdMeshImpl
  then raises TypeError: 'function' object is not iterable.  Here the
  helper is called: mtf's lexicographic order, as its comment intends.
  tests/strategies/test_tpu_program.py builds the TPU programs that show both.
  """
  if isinstance(module.FLAGS, _FlagsOrDefaults):
    return
  module.FLAGS = _FlagsOrDefaults()
  original = module.auto_logical_to_physical_tpu

  def auto_logical_to_physical_tpu(*args, **kwargs):
    mapping = original(*args, **kwargs)
    return mapping() if callable(mapping) else mapping

  module.auto_logical_to_physical_tpu = auto_logical_to_physical_tpu


# --------------------------------------------------------------------------
# Import hooks: each fix runs when the module it mends is imported.

class _Hook(object):
  """What to do around the import of one module (before, quiet, after)."""

  def __init__(self, before=None, quiet=False, after=None):
    self.before = before
    self.quiet = quiet
    self.after = after


_HOOKS = {
    "tensorflow": _Hook(before=_before_tensorflow, quiet=True),
    "mesh_tensorflow": _Hook(before=lambda: (
        _fix_register_tensor_conversion_function(),
        _fix_t5_hf_model_import())),
    "mesh_tensorflow.transformer.utils": _Hook(after=_after_mtf_utils),
    "mesh_tensorflow.simd_mesh_impl": _Hook(after=_after_simd_mesh_impl),
    "t5.models": _Hook(before=_fix_t5_hf_model_import),
}


class _HookedLoader(object):
  """Wraps a module's loader to run its _Hook around exec_module."""

  def __init__(self, loader, hook):
    self._loader = loader
    self._hook = hook

  def __getattr__(self, name):
    return getattr(self._loader, name)

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    hook = self._hook
    if hook.before:
      hook.before()
    try:
      if hook.quiet and not verbose():
        with _stderr_without(_IMPORT_NOISE):
          self._loader.exec_module(module)
      else:
        self._loader.exec_module(module)
    finally:  # the module keeps its real loader
      module.__loader__ = self._loader
      if getattr(module, "__spec__", None) is not None:
        module.__spec__.loader = self._loader
    if hook.after:
      hook.after(module)


class _StackFinder(object):
  """A meta path finder that finds nothing itself: for a hooked module it
  returns the regular finders' spec with a _HookedLoader."""

  def find_spec(self, name, path=None, target=None):
    hook = _HOOKS.get(name)
    if hook is None or name in _SEARCHING or name in sys.modules:
      return None
    # Only a guard against our own recursion: a look-up that imports
    # nothing (importlib.util.find_spec, e.g. core/binding_checks reading
    # mtf's files as text) must not use up the hook of the real import.
    _SEARCHING.add(name)
    try:
      for finder in sys.meta_path:
        if finder is self or not hasattr(finder, "find_spec"):
          continue
        spec = finder.find_spec(name, path, target)
        if spec is not None:
          if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, hook)
          return spec
      return None
    finally:
      _SEARCHING.discard(name)


_SEARCHING = set()
_FINDER = _StackFinder()


def find_spec(name, path=None, target=None):
  """Our finder's answer for `name` (mtf_talking_heads_startup delegates)."""
  return _FINDER.find_spec(name, path, target)


def install_import_hooks():
  """Puts the hooks first on sys.meta_path (idempotent).

  A hooked module that is already imported gets its fix now instead.
  """
  if not any(isinstance(f, _StackFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _FINDER)
  if "tensorflow" in sys.modules and not verbose():
    _quiet_python_warnings()
  if "mesh_tensorflow" in sys.modules or "tensorflow" in sys.modules:
    _fix_register_tensor_conversion_function()
  if "mesh_tensorflow.transformer.utils" in sys.modules:
    _after_mtf_utils(sys.modules["mesh_tensorflow.transformer.utils"])
  if "mesh_tensorflow.simd_mesh_impl" in sys.modules:
    _after_simd_mesh_impl(sys.modules["mesh_tensorflow.simd_mesh_impl"])
  _fix_t5_hf_model_import()


def apply():
  """Every fix now (imports TensorFlow); importing this module is enough."""
  install_import_hooks()
  _before_tensorflow()
  _fix_register_tensor_conversion_function()


install_import_hooks()
