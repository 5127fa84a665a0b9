"""Checks of paths, gin files and bindings that run before TensorFlow loads.

Every `mtf_th` command that builds a graph checks its arguments here first,
so a bad path or binding is refused in one line (exit status 2) in well
under a second instead of after TensorFlow's import.  Each function raises
commands.UsageError with a message that names the flag and the fix.
Imports only the standard library (and gin_paths / dir_lock, which do too);
the checks that read gin files import gin's parser (gin_text) and the
pure-Python memory model (memory, model, planner), never TensorFlow.
"""
import ast
import difflib
import os
import re
import runpy
import socket
import sys
import threading

from mtf_talking_heads import commands
from mtf_talking_heads.core import cache_paths
from mtf_talking_heads.core import compat
from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.runtime import dir_lock


def _existing_ancestor(path):
  """The nearest existing path at or above `path` (absolute)."""
  path = os.path.abspath(path)
  while not os.path.lexists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def directory(path, flag, write=False, must_exist=False, purpose=""):
  """A directory flag: not a file, not under a file, writable if `write`.

  Args:
    path: the flag's value.
    flag: its name, e.g. "--model_dir".
    write: the command writes into it (or creates it).
    must_exist: the command reads what is in it.
    purpose: for a read-only directory, what the command would write there,
      e.g. "eval_results.csv and the eval events".
  Raises:
    commands.UsageError: one line naming the flag and the fix.
  """
  if not isinstance(path, str) or not path.strip():
    raise commands.UsageError("%s is empty: give a directory" % flag)
  no_newline(path, flag)
  if "://" in path:  # gs:// and the like: TensorFlow's file systems
    return
  if os.path.exists(path) and not os.path.isdir(path):
    raise commands.UsageError(
        "%s %s is a file, not a directory: give a directory (a new path is "
        "created)" % (flag, path))
  ancestor = _existing_ancestor(path)
  if not os.path.isdir(ancestor):
    raise commands.UsageError(
        "%s %s is under %s, which is a file, so no directory can be created "
        "there: give a path under a directory" % (flag, path, ancestor))
  if must_exist and not os.path.isdir(path):
    raise commands.UsageError(
        "%s %s does not exist: give the directory a run trained into"
        % (flag, path))
  if write and not os.access(ancestor, os.W_OK | os.X_OK):
    what = (" (it writes %s there)" % purpose) if purpose else ""
    if ancestor == os.path.abspath(path):
      raise commands.UsageError(
          "%s %s is read-only for this user%s: copy it to a writable place "
          "(cp -r %s NEW_DIR) and give %s NEW_DIR" % (
              flag, path, what, path, flag))
    raise commands.UsageError(
        "%s %s cannot be created: %s is read-only for this user; give a "
        "path under a writable directory" % (flag, path, ancestor))


def not_in_use(path, flag):
  """Refuses a second writer of `path` (dir_lock.py), in one line."""
  message = dir_lock.refusal(path, flag)
  if message:
    raise commands.UsageError(message)


def checkpoint(path, flag):
  """A directory holding checkpoints, or a checkpoint prefix."""
  no_newline(path, flag)
  if os.path.isdir(path) or os.path.exists(path + ".index") or "://" in path:
    return
  if os.path.exists(path):
    raise commands.UsageError(
        "%s %s is a file, not a training directory or a checkpoint prefix "
        "(e.g. %s/model.ckpt-0)" % (flag, path, os.path.dirname(path) or "."))
  raise commands.UsageError(
      "%s %s: no such directory or checkpoint (no %s.index); give a "
      "training directory or a prefix such as MODEL_DIR/model.ckpt-0"
      % (flag, path, path))


def gin_files(names):
  """Every --gin_file exists (in the current directory or gin/)."""
  extra = []
  if "gin.config" in sys.modules:  # a --module_import may have added paths
    extra = [p for p in compat.gin_search_path() if p]
  for name in names:
    no_newline(name, "--gin_file")
    try:
      gin_paths.resolve(name, extra)
    except FileNotFoundError as e:
      raise commands.UsageError(str(e)) from e


_REFERENCE = re.compile(r"[@%]")


def gin_params(params):
  """Each --gin_param is `name = value` with a value gin can parse.

  The common slip is an unquoted string: `mesh_shape = model:4` (gin then
  reports "malformed node or string ... ast.Name").
  """
  for param in params:
    if "=" not in param:
      raise commands.UsageError(
          "--gin_param %r is not a binding: write name = value, e.g. "
          "--gin_param=\"utils.run.train_steps = 100\" or "
          "--gin_param=\"mesh_shape = 'model:4'\"" % (param,))
    name, value = [s.strip() for s in param.split("=", 1)]
    if not name:
      raise commands.UsageError("--gin_param %r names no parameter: write "
                                "name = value" % (param,))
    if not value:
      raise commands.UsageError("--gin_param %r has no value: write name = "
                                "value" % (param,))
    if _REFERENCE.search(value) or "\n" in value:
      continue  # gin references, macros, configurable calls
    try:
      ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise commands.UsageError(
          "--gin_param %r: %s is not a gin value; quote a string, e.g. "
          "--gin_param \"%s = '%s'\"" % (param, value, name,
                                          value.strip("'\""))) from None


def cache():
  """$MTF_TH_CACHE (or ~/.cache/mtf_talking_heads): a directory, writable
  unless it already holds the corpus and vocabulary the runs read."""
  path = cache_paths.cache_dir()
  where = ("MTF_TH_CACHE=%s" % os.environ["MTF_TH_CACHE"]
           if os.environ.get("MTF_TH_CACHE") else "the cache %s" % path)
  fix = ("set MTF_TH_CACHE to a writable directory, e.g. "
         "MTF_TH_CACHE=/tmp/mtf_th_cache")
  if os.path.exists(path) and not os.path.isdir(path):
    raise commands.UsageError("%s is a file, not a directory: %s"
                              % (where, fix))
  ancestor = _existing_ancestor(path)
  if not os.path.isdir(ancestor):
    raise commands.UsageError("%s is under %s, which is a file: %s"
                              % (where, ancestor, fix))
  if not os.access(ancestor, os.W_OK | os.X_OK) and not (
      os.path.isdir(path) and cache_paths.has_built_data(path)):
    raise commands.UsageError(
        "%s is read-only for this user and does not hold the built corpus "
        "and vocabulary (the first run writes them there): %s"
        % (where, fix))


def tpu(name, zone=None, project=None, lookup_secs=1.0):
  """--tpu NAME, where TensorFlow's resolver would fail for certain.

  A TPU name (not grpc://) without --tpu_zone and --gcp_project is resolved
  through the GCE metadata server (tensorflow/python/tpu/client/client.py:
  $GCE_METADATA_HOST, $GCE_METADATA_IP or metadata.google.internal).  When
  that host name does not resolve (not a GCP VM, or no network) the run
  cannot start: refused here in a fraction of a second instead of after
  TensorFlow's import.  A lookup still pending after `lookup_secs` (a slow
  DNS) and names with zone and project (the Cloud TPU API, which may work
  off GCP with credentials) are left to training.estimator.check_tpu.

  Raises:
    commands.UsageError: one line naming --tpu and what to give instead.
  """
  if not name or name.startswith("grpc://") or (zone and project):
    return
  host = (os.environ.get("GCE_METADATA_HOST") or os.environ.get(
      "GCE_METADATA_IP") or "metadata.google.internal").split(":")[0]
  failed = []

  def lookup():
    try:
      socket.getaddrinfo(host, 80)
    except OSError as e:
      failed.append(e)

  thread = threading.Thread(target=lookup, daemon=True)
  thread.start()
  thread.join(lookup_secs)
  if failed:
    raise commands.UsageError(
        "--tpu %s: cannot resolve this Cloud TPU (its zone and project come "
        "from the GCE metadata server %s, unknown here: %s); run on a GCP VM "
        "with network access and give --tpu_zone and --gcp_project, or give "
        "the TPU's address as --tpu grpc://IP:8470"
        % (name, host, failed[0].strerror or failed[0]))


def forward_memory(model_dir, gin_files, gin_params, what):
  """Refuses an eval or decode on this machine's CPU whose forward pass is
  predicted not to fit in its RAM (memory.predict_forward per logical
  device, the smallest over the strategies Auto may pick, an eval's with
  the fused core where it runs (fit_check.kernel_of), a decode's with the
  einsum core and its key/value caches; the task's vocabulary as `mtf_th plan` prices
  it, vocabulary.priced_vocab; the mesh's devices sharing the RAM,
  planner.DEFAULT_MARGIN left free), before TensorFlow is imported.  Reads
  the gin files, else <model_dir>/operative_config.gin; a configuration
  model.py cannot read is left to the command (as fit_check does for
  train).

  Args:
    what: "eval" or "decode", for the message.
  Raises:
    commands.UsageError: one line with both sizes and what to lower.
  """
  from mtf_talking_heads.commands import vocabulary  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  files = run_gin_files(model_dir, gin_files)
  try:
    config = gin_text.GinConfig(files, gin_params)
    # an operative config keeps only the macros the model used
    extra = [] if "dynamic" in config else ["dynamic = None"]
    model = model_lib.model_from_gin(
        files, list(gin_params) + extra,
        vocab=vocabulary.priced_vocab(files, gin_params))  # as `mtf_th plan`
    mesh_shape = config.get("mesh_shape", "model:1")
    mesh = model_lib.parse_mesh(mesh_shape)
    # eval runs the fused core where it applies, as training does; a decode
    # attends one position at a time, which keeps the einsum core
    kernel = (fit_check.kernel_of(config, "cpu") if what == "eval"
              else "einsum")
    total = fit_check.smallest_forward(
        model, mesh_shape, "mtf_th_float32", config.get("layout", None),
        decode=what == "decode", kernel=kernel)
  except (OSError, ValueError, TypeError, KeyError):
    return
  if total is None:
    return
  devices = mesh["batch"] * mesh["model"]
  usable = planner.usable_bytes("cpu", devices)
  if total <= usable:
    return
  raise commands.UsageError(
      "predicted %.2f GiB per device for %s's forward pass (batch_size %d, "
      "mesh %s, %d device%s) but this machine's %.1f GiB of RAM leaves %.2f "
      "GiB usable per device (%d%% left free): lower batch_size or the "
      "lengths with --gin_param, or give the gin files the model was "
      "trained with" % (
          total / memory.GiB, what, model.batch, mesh_shape, devices,
          "" if devices == 1 else "s", memory.device_memory("cpu") /
          memory.GiB, usable / memory.GiB,
          round(100 * planner.DEFAULT_MARGIN)))


def task_names():
  """The task and mixture names this package and t5 register, read from
  data/task_names.py by path (importing mtf_talking_heads.data would load
  TensorFlow).

  Returns:
    (this package's names, t5's names), two tuples.
  """
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))), "data", "task_names.py")
  names = runpy.run_path(path)
  return names["THIS_PACKAGE"], names["T5"]


# Packages whose gin `import`s register no task beyond data/task_names.py.
KNOWN_IMPORTS = ("mtf_talking_heads", "mesh_tensorflow", "t5", "seqio",
                 "tensorflow", "gin")


def _registers_no_more(gin_files):
  """True when the gin files import only KNOWN_IMPORTS' modules (a gin
  `import my_tasks` may register tasks, as --module_import does)."""
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  try:
    imports = gin_text.GinConfig(gin_files).imports
  except (OSError, ValueError):
    return True  # the command reports a bad gin file itself
  return all(m.split(".")[0] in KNOWN_IMPORTS for m in imports)


OWN_TASK = ("a task of your own: give the module that registers it with "
            "--module_import")
# mtf_th sweep has no --module_import: a task of the user's is registered by
# a gin `import` in a row's gin files (commands/sweep.py _check_data imports
# them before its TFDS check), and this names what is registered without one.
SWEEP_TASKS = ("mtf_th sweep fine-tunes on the tasks and mixtures this "
               "package and t5 register")


def task(name, gin_files=(), flag="--task", module_imports=(),
         own_task=OWN_TASK):
  """A seqio task or mixture name, refused with a did-you-mean when neither
  this package nor t5 registers it.  With --module_import, or a gin file
  that imports another package, more may be registered: then the name is
  checked after the imports (training/tfds_data.get_provider).

  Args:
    name: the flag's value (None: nothing to check).
    gin_files: the gin files the command reads (for their imports).
    flag: the flag's name.
    module_imports: --module_import's modules.
    own_task: the message's last words, in parentheses: how to use a task
      of one's own (OWN_TASK), or that the command takes none (SWEEP_TASKS).
  Raises:
    commands.UsageError: one line naming the flag and close names.
  """
  if not name or module_imports:
    return
  ours, t5_names = task_names()
  if name in ours or name in t5_names or not _registers_no_more(gin_files):
    return
  close = difflib.get_close_matches(name, ours + t5_names, n=3)
  raise commands.UsageError(
      "%s %r is not a registered task or mixture; %s (%s)" % (
          flag, name, ("did you mean %s?" % " or ".join(close)) if close
          else "this package registers %s" % ", ".join(sorted(ours)),
          own_task))


def run_gin_files(model_dir, gin_files):
  """The gin files a command reads: --gin_file's, or without them the
  operative_config.gin that --model_dir's model was trained with (as
  training/checkpoints.operative_gin, which needs TensorFlow)."""
  return list(gin_files) or [os.path.join(model_dir, "operative_config.gin")]


def mixture(model_dir, gin_files, gin_params, module_imports=()):
  """The gin macro MIXTURE_NAME of the run, checked like --task (task()).

  Reads the gin files (without them, the operative_config.gin that
  --model_dir's model was trained with) and the bindings as text, without
  TensorFlow; a file gin itself cannot read is left to the command.
  """
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  files = run_gin_files(model_dir, gin_files)
  try:
    name = gin_text.GinConfig(files, gin_params).get("MIXTURE_NAME")
  except (OSError, ValueError):
    return
  if isinstance(name, str):
    task(name, files, "MIXTURE_NAME", module_imports)


def _macros_by_file(path, gin_dir):
  """{macro: (value, the file that set it)} as gin reads `path`, includes
  followed (gin_text.GinConfig); value None where it refers to a macro
  that `path` does not define.

  Raises:
    ValueError: a missing include or an include cycle.
  """
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  config = gin_text.GinConfig([path], gin_dir=gin_dir)
  out = {}
  for name, origin in config.origins.items():
    try:
      value = config.get(name)
    except ValueError:
      value = None
    out[name] = (value, origin)
  return out


def scale_macros(gin_dir):
  """The macros the scale files (models/*_tiny.gin) set."""
  names = set()
  for rel in gin_paths.list_gin_files(os.path.join(gin_dir, "models")):
    if rel.endswith("_tiny.gin"):
      names.update(_macros_by_file(os.path.join(gin_dir, "models", rel),
                                   gin_dir))
  return names


def gin_order(names):
  """Refuses a later --gin_file whose includes re-set an earlier file's scale.

  `--gin_file models/t5_tiny.gin --gin_file experiments/t5_heads/07...gin`
  builds the base T5: the experiment includes models/t5_base.gin, whose
  d_model, num_layers ... override the tiny file's (gin: the last binding
  wins).  A macro a later file sets in its own text is an intended override
  (a layout file after a scale file), so only values set by an include
  count.
  """
  if len(names) < 2:
    return
  try:
    gin_dir = gin_paths.gin_dir()
    paths = [gin_paths.resolve(n) for n in names]
    by_file = [_macros_by_file(path, gin_dir) for path in paths]
  except (FileNotFoundError, ValueError):
    return  # gin_files() and training.parse_gin report these
  scale = scale_macros(gin_dir)
  seen = {}  # macro -> (value, --gin_file that set it)
  for name, path, macros in zip(names, paths, by_file):
    for macro, (value, origin) in sorted(macros.items()):
      if (macro in scale and macro in seen and origin != path
          and seen[macro][0] != value):
        earlier = seen[macro][1]
        again = sorted(m for m, (v, o) in macros.items()
                       if m in scale and m in seen and o == origin
                       and seen[m][0] != v)
        raise commands.UsageError(
            "--gin_file %s includes %s, which sets %s again after the "
            "earlier --gin_file %s (the later file wins: %s = %r, not %r); "
            "put the scale file last: --gin_file %s --gin_file %s"
            % (name, os.path.relpath(origin, gin_dir), ", ".join(again),
               earlier, macro, value, seen[macro][0], name, earlier))
    for macro, (value, _) in macros.items():
      seen[macro] = (value, name)


def same_model(model_dir, gin_files, gin_params, flag="--model_dir",
               role="train"):
  """Refuses a configuration of another model than the one `model_dir`
  holds (runtime/identity.py: its model_identity.json, or the
  operative_config.gin of its checkpoints), when the gin text shows the
  difference (num_layers, d_model, d_ff, the attention classes, the heads
  dims); what only the graph shows is training/identity.py's, after
  TensorFlow loads.

  Args:
    role: "train" (train, finetune's --model_dir), "read" (eval, decode),
      "pretrained" (finetune's --pretrained_model_dir): the ways out the
      line names (runtime/identity.refusal).
  Raises:
    commands.UsageError: one line naming the difference and the ways out,
      or a damaged model_identity.json.
  """
  from mtf_talking_heads.runtime import identity  # pylint: disable=g-import-not-at-top
  try:
    message = identity.refusal(model_dir, gin_files, gin_params, flag, role)
  except ValueError as e:
    raise commands.UsageError(str(e)) from None
  if message:
    raise commands.UsageError(message)




def no_newline(value, flag):
  """Refuses a path with a line break (or another control character): it
  would split every message and file listing that names it.

  Raises:
    commands.UsageError: one line, the path shown with escapes.
  """
  if isinstance(value, str) and any(c < " " for c in value):
    raise commands.UsageError(
        "%s %r has a line break or control character in it: give the path "
        "without it" % (flag, value))



def gin_bindings(gin_files, gin_params):
  """The bindings and values core/binding_checks.py refuses (a misspelt
  macro, a class or parameter the configuration does not have, mesh_shape
  = 42, a learning rate <= 0, ...), read as text: the one validator of
  `mtf_th train`, eval, decode, finetune (check_common) and `mtf_th plan`.
  Files gin itself cannot read are left to the command.

  Raises:
    commands.UsageError: one line naming the binding and the fix.
  """
  from mtf_talking_heads.core import binding_checks  # pylint: disable=g-import-not-at-top
  try:
    config = binding_checks.read(gin_files, gin_params)
  except (OSError, ValueError):
    return
  try:
    binding_checks.check(config, gin_params)
  except ValueError as e:
    raise commands.UsageError(str(e)) from None


def step_list(text, flag, minimum=0):
  """"250,2000" -> [250, 2000]: the one parser of a comma-separated step
  list flag (--keep_checkpoint_steps, the sweep's --eval_steps): integers
  >= `minimum`, each once.

  Args:
    text: the flag's value.
    flag: its name for the message ("": argparse's type, which names it).
    minimum: the smallest step allowed.
  Raises:
    commands.UsageError: one line naming the flag, e.g. "--eval_steps
      '10,10' lists step 10 more than once: give each step once, e.g. 10".
  """
  try:
    steps = [int(t) for t in str(text).split(",") if t.strip()]
  except ValueError:
    steps = None
  if not steps or min(steps) < minimum:
    raise commands.UsageError(
        "%smust be comma-separated steps >= %d, e.g. 250,2000; got %r"
        % (flag + " " if flag else "", minimum, text))
  twice = sorted(set(s for s in steps if steps.count(s) > 1))
  if twice:
    raise commands.UsageError(
        "%s%r lists step %s more than once: give each step once, e.g. %s"
        % (flag + " " if flag else "", text, ", ".join(map(str, twice)),
           ",".join(map(str, sorted(set(steps))))))
  return steps


def different_dirs(model_dir, other, other_flag):
  """Refuses --model_dir equal to a directory the command only reads
  (finetune's --pretrained_model_dir), before TensorFlow loads."""
  if model_dir and other and os.path.abspath(model_dir) == os.path.abspath(
      other):
    raise commands.UsageError(
        "--model_dir must differ from %s (%s): fine-tuning never writes "
        "into the pre-trained run; give a new --model_dir"
        % (other_flag, other))


def corpus(gin_files, gin_params):
  """th_data.corpus_paths' local text files hold some text: a corpus of
  blank lines yields no example (each non-empty line is a document), and
  training would end at its first step.  Globs that match nothing, empty
  files and remote paths are data/corpus.py's (after TensorFlow loads).

  Raises:
    commands.UsageError: one line naming the binding and its files.
  """
  import glob  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  try:
    config = gin_text.GinConfig(gin_files, gin_params)
    fmt = config.binding("th_data.corpus_paths.file_format", "auto")
    splits = [(s, config.binding("th_data.corpus_paths." + s))
              for s in ("train", "validation")]
  except (OSError, ValueError):
    return
  for split, paths in splits:
    paths = [paths] if isinstance(paths, str) else paths
    if not isinstance(paths, (list, tuple)) or not all(
        isinstance(p, str) and p.strip() and "://" not in p for p in paths):
      continue
    files = sorted(f for p in paths for f in glob.glob(p))
    if not files or fmt == "tfrecord" or (
        fmt == "auto" and all(".tfrecord" in os.path.basename(f)
                              for f in files)):
      continue
    if not any(_has_text(f) for f in files):
      raise commands.UsageError(
          "th_data.corpus_paths.%s=%r: the file(s) hold only blank lines, "
          "so the task yields no example (every non-empty line is a "
          "document): give files with text" % (split, paths[0] if len(
              paths) == 1 else paths))


def _has_text(path, chunk=1 << 20):
  """True if the file has a byte other than whitespace (or cannot be read:
  data/corpus.py reports that)."""
  try:
    with open(path, "rb") as f:
      while True:
        block = f.read(chunk)
        if not block:
          return False
        if block.strip():
          return True
  except OSError:
    return True


# training/decoding.TEXT_TO_TEXT (tests/commands/test_bad_inputs_values.py
# holds them equal): the model types whose outputs are text.
TEXT_TO_TEXT = ("bitransformer", "delimited_lm")


def text_to_text(model_dir, gin_files, gin_params, who, hint=""):
  """decode and eval --metrics read text out of the model: refuses a
  utils.run.model_type (the gin text, else model_dir's operative config)
  that is not text-to-text before TensorFlow loads, in the line
  training/decoding.load_for_decoding gives after it."""
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  try:
    config = gin_text.GinConfig(run_gin_files(model_dir, gin_files),
                                gin_params)
  except (OSError, ValueError):
    return
  found = [config.binding(k) for k in ("utils.run.model_type",
                                       "run.model_type")]
  model_type = next((t for t in found if t is not None), "bitransformer")
  if isinstance(model_type, str) and model_type not in TEXT_TO_TEXT:
    raise commands.UsageError(
        "%s needs a text-to-text model (model_type bitransformer, or "
        "delimited_lm: a decoder-only model fine-tuned with "
        "experiments/finetune_embedded_lm.gin); this one is %r%s"
        % (who, model_type, hint))
