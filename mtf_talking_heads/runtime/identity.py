"""A run's identity: the model a model_dir holds, and the refusal of another.

A model_dir holds one model.  Its identity is recorded in
<model_dir>/model_identity.json, written atomically at the first checkpoint
a run saves (training/identity.py):

  {"format": 1,
   "architecture": {"model_type": "lm", "num_layers": 2, "d_model": 32,
                    "d_ff": 64, "relative_attention_type": null,
                    "dec_self_attention": "@mtf_th.TalkingHeadsAttention",
                    "heads": 4, "d_k": 32, "d_v": 32, "heads_k": 4,
                    "heads_v": 4},
   "variables": {"transformer/embedding": [[384, 32], "float32"], ...}}

`architecture` holds the gin macros that define the model, read from the
run's gin files as text (architecture_from_gin: no TensorFlow), so a
command refuses another model before TensorFlow loads; null when the files
do not define those macros.  `variables` holds every weight's name, shape
and dtype (optimizer slots and global_step left out): what TensorFlow
compares once the graph's variables are known.  The vocabulary counts by
its size (the embedding's shape), the attention variant by its layer class
(the weights' scope names and the placement macros).

A model_dir trained before this file existed (checkpoints, no identity
file) is read as its operative_config.gin (the architecture) and its latest
checkpoint (the weights, training/identity.py).  A model_dir without
checkpoints holds no model yet: nothing is refused there.

Imports only the standard library and core (the commands check before
TensorFlow loads; the sweep checks its runs' folders).
"""
import collections
import json
import os
import re

from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.core import gin_text
from mtf_talking_heads.core import spec
from mtf_talking_heads.runtime import run_files

IDENTITY_FILE = "model_identity.json"
FORMAT = 1
OPERATIVE_CONFIG = "operative_config.gin"

Identity = collections.namedtuple("Identity",
                                  ["architecture", "variables", "source"])
Identity.__doc__ = """The model a model_dir holds (or a configuration builds).

Attributes:
  architecture: {macro: value} (architecture()), or None when unknown.
  variables: {weight name: (shape list, dtype name or None)}, or None when
    not read yet (a model_dir without its identity file: training/
    identity.py reads them from its latest checkpoint).
  source: the file it was read from, for messages (None: a configuration).
"""

# utils.run.model_type -> the kind of model (placements its layers have)
_KINDS = {"bitransformer": "bitransformer", "lm": "lm", "delimited_lm": "lm",
          "aligned": "encoder"}
_PLACEMENTS = {"bitransformer": ("enc_self_attention", "dec_self_attention",
                                 "encdec_attention"),
               "lm": ("dec_self_attention",),
               "encoder": ("enc_self_attention",)}
# macros every model's weights depend on
_MODEL_MACROS = ("num_layers", "d_model", "d_ff", "relative_attention_type")
_GLOBAL_STEP = "global_step"
_SLOT = "_slot_"
# mtf's AdamWeightDecayOptimizer (and nn/optimizers' LAMB) name their slots
# <weight>/adam_m and <weight>/adam_v.
_ADAM_SLOTS = ("/adam_m", "/adam_v")


# --------------------------------------------------------------------------
# the architecture, from gin text


def _class_name(value):
  """'@mtf_th.TalkingHeadsAttention' for a gin reference to a layer class
  (any module path), the text of anything else."""
  if not isinstance(value, gin_text.Reference):
    return repr(value)
  name = value.name.split(".")[-1]
  for variant in spec.VARIANTS:
    if name in spec.layer_class_names(variant):
      return "@mtf_th." + name
  return "@" + value.name


def _variant(class_name):
  name = class_name.split(".")[-1]
  for variant in spec.VARIANTS:
    if name in spec.layer_class_names(variant):
      return spec.VARIANT[variant]
  return None


def _plain(value):
  """A JSON value: ints, floats, strings, None, lists; anything else as text."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)) and not isinstance(
      value, gin_text.Reference):
    return [_plain(v) for v in value]
  return str(value)


def architecture(config):
  """The macros that define the model, from a gin_text.GinConfig.

  The model type (utils.run.model_type, as `kind`: delimited_lm is an lm),
  num_layers, d_model, d_ff, relative_attention_type, the attention class
  of each placement the model has, and the heads dims those classes take
  (heads, d_k, d_v; heads_k with P_l, heads_v with P_w; dynamic, groups).
  A macro the configuration does not define is left out (an
  operative_config.gin keeps only the macros the model used).

  Example: a 2-layer talking-heads lm (gin/experiments/lm_heads/05...gin)
    {"model_type": "lm", "num_layers": 2, "d_model": 128, "d_ff": 512,
     "relative_attention_type": None,
     "dec_self_attention": "@mtf_th.TalkingHeadsAttention", "heads": 4,
     "d_k": 32, "d_v": 32, "heads_k": 4, "heads_v": 4}
  """
  model_type = config.binding("utils.run.model_type",
                              config.binding("run.model_type",
                                             "bitransformer"))
  kind = _KINDS.get(model_type, model_type)
  out = {"model_type": kind}
  for macro in _MODEL_MACROS:
    if macro in config:
      out[macro] = _plain(config.get(macro))
  variants = []
  for macro in _PLACEMENTS.get(kind, _PLACEMENTS["bitransformer"]):
    if macro in config:
      out[macro] = _class_name(config.get(macro))
      variants.append(_variant(out[macro]))
  if variants and None not in variants:
    dims = ["heads"]
    if any(v.name != spec.BILINEAR for v in variants):
      dims += ["d_k", "d_v"]
    if any(v.project_logits for v in variants):
      dims.append("heads_k")
    if any(v.project_weights for v in variants):
      dims.append("heads_v")
    if any(v.name == spec.DYNAMIC for v in variants):
      dims.append("dynamic")
    if any(v.name == spec.GROUPED for v in variants):
      dims.append("groups")
    for macro in dims:
      if macro in config:
        out[macro] = _plain(config.get(macro))
  return out


def architecture_from_gin(gin_files, gin_params=(), gin_dir=None):
  """architecture() of gin files and bindings read as text, or None when
  gin's parser cannot read them (the command reports that itself) or they
  define no model macro."""
  try:
    config = gin_text.GinConfig(list(gin_files), list(gin_params),
                                gin_dir or gin_paths.gin_dir())
    arch = architecture(config)
  except (OSError, ValueError, TypeError, KeyError):
    return None
  return arch if len(arch) > 1 else None


# --------------------------------------------------------------------------
# the identity file


def _variables_from_json(data):
  return {name: (list(shape), dtype) for name, (shape, dtype) in data.items()}


def read(model_dir, files=run_files.LOCAL):
  """The Identity in <model_dir>/model_identity.json, or None without it.

  Raises:
    ValueError: the file is there but damaged (one line naming it and what
      to do).
  """
  path = os.path.join(model_dir, IDENTITY_FILE)
  if not files.exists(path):
    return None
  try:
    data = json.loads(files.read_text(path))
    if data.get("format") != FORMAT:
      raise ValueError("format %r, not %d" % (data.get("format"), FORMAT))
    arch = data["architecture"]
    if arch is not None and not isinstance(arch, dict):
      raise ValueError("architecture is not an object")
    variables = _variables_from_json(data["variables"])
  except files.READ_ERRORS + (ValueError, TypeError, KeyError,
                              AttributeError) as e:
    raise ValueError(
        "%s cannot be read (%s): delete it, and the next run derives it "
        "again from the checkpoints and operative_config.gin beside it"
        % (path, str(e).splitlines()[0] if str(e) else type(e).__name__)
    ) from None
  return Identity(arch, variables, path)


def to_text(identity):
  """model_identity.json's text of an Identity (sorted, one weight a line)."""
  lines = ['{"format": %d,' % FORMAT,
           ' "architecture": %s,' % json.dumps(identity.architecture,
                                               sort_keys=True),
           ' "variables": {']
  items = sorted(identity.variables.items())
  for i, (name, (shape, dtype)) in enumerate(items):
    lines.append("  %s: %s%s" % (json.dumps(name), json.dumps(
        [list(shape), dtype]), "," if i < len(items) - 1 else ""))
  lines.append("}}")
  return "\n".join(lines) + "\n"


def recorded(model_dir, files=run_files.LOCAL):
  """The model model_dir holds, or None when it holds no checkpoint.

  Its identity file; without one (a model_dir trained before it existed),
  the architecture of its operative_config.gin and variables None (the
  caller with TensorFlow reads them from the latest checkpoint).

  Raises:
    ValueError: a damaged identity file while checkpoints are there.
  """
  if not files.exists(model_dir) or not run_files.checkpoint_prefixes(
      model_dir, files):
    return None
  found = read(model_dir, files)
  if found is not None:
    return found
  operative = os.path.join(model_dir, OPERATIVE_CONFIG)
  arch = None
  if files.exists(operative) and "://" not in operative:
    arch = architecture_from_gin([operative])
  return Identity(arch, None, operative)


# --------------------------------------------------------------------------
# comparing architectures (before TensorFlow)


def _gin_value(value):
  if isinstance(value, str) and value.startswith("@"):
    return value
  return repr(value)


def settings_text(arch, keys):
  """'num_layers = 2, heads = 4' for `keys` of an architecture."""
  return ", ".join("%s = %s" % (k, _gin_value(arch[k])) for k in keys)


def differences(old, new):
  """Keys both architectures define with different values, in a fixed
  order (the model type, sizes, placements, heads dims)."""
  if not old or not new:
    return []
  order = ["model_type"] + list(_MODEL_MACROS) + list(
      _PLACEMENTS["bitransformer"]) + ["heads", "heads_k", "heads_v", "d_k",
                                       "d_v", "dynamic", "groups"]
  keys = [k for k in order if k in old and k in new]
  keys += sorted(k for k in old if k in new and k not in order)
  return [k for k in keys if old[k] != new[k]]


def _source_text(found):
  return found.source or "its checkpoints"


def refusal(model_dir, gin_files, gin_params, flag="--model_dir",
            role="train"):
  """One line refusing a configuration of another model than model_dir's,
  or None (no model there yet, the same model, or unknown before
  TensorFlow: then training/identity.py compares the weights).

  Args:
    model_dir: the directory (a gs:// one is left to TensorFlow).
    gin_files, gin_params: the command's configuration (eval, decode:
      without gin files, the model's operative_config.gin).
    flag: the flag naming model_dir.
    role: "train" (train, finetune's own model_dir), "read" (eval,
      decode), "pretrained" (finetune's --pretrained_model_dir) or "sweep"
      (a sweep's run folder).
  Raises:
    ValueError: model_dir's identity file is damaged (one line).
  """
  if not isinstance(model_dir, str) or "://" in model_dir:
    return None
  found = recorded(model_dir)
  if found is None or not found.architecture:
    return None
  files = list(gin_files) or [os.path.join(model_dir, OPERATIVE_CONFIG)]
  arch = architecture_from_gin(files, gin_params)
  keys = differences(found.architecture, arch)
  if not keys:
    return None
  old = settings_text(found.architecture, keys)
  new = settings_text(arch, keys)
  head = ("%s %s holds a model trained with %s (%s), but this configuration "
          "makes %s" % (flag, model_dir, old, _source_text(found), new))
  if role == "read":
    return ("%s: leave out the --gin_file / --gin_param that change it "
            "(without --gin_file the model's operative_config.gin is read), "
            "or give %s" % (head, old))
  if role == "pretrained":
    return ("%s: fine-tuning would initialise the weights that differ; "
            "give the gin files it was trained with (%s), or pass "
            "--allow_partial_load to load only the weights of the same name "
            "and shape and initialise the others" % (head, old))
  if role == "sweep":
    return ("%s: training on would mix two models in one run folder; use "
            "a new --output_dir, or the settings it was trained with (%s)"
            % (head, old))
  return ("%s: training on would mix two models in one directory; use a new "
          "%s, or %s as before" % (head, flag, old))


# --------------------------------------------------------------------------
# comparing weights (what training/identity.py reads with TensorFlow)


def weights(variables):
  """The model's weights of {name: value}: global_step and optimizer slots
  (<weight>_slot_<name>, e.g. p_q_slot_v; <weight>/adam_m) left out."""
  names = set(variables)
  out = {}
  for name, value in variables.items():
    base, sep, _ = name.rpartition(_SLOT)
    adam_base = next((name[:-len(s)] for s in _ADAM_SLOTS
                      if name.endswith(s)), None)
    if (name == _GLOBAL_STEP or (sep and base in names)
        or adam_base in names):
      continue
    out[name] = value
  return out


_BLOCK = re.compile(r"block_(\d+)")


def _index_set(indices):
  """'000' / '{000,002}' / '{000..011}' (bash's brace notation)."""
  indices = sorted(set(indices))
  if len(indices) == 1:
    return indices[0]
  numbers = [int(i) for i in indices]
  if len(numbers) > 2 and numbers == list(range(numbers[0],
                                                numbers[-1] + 1)):
    return "{%s..%s}" % (indices[0], indices[-1])
  return "{%s}" % ",".join(indices)


def compress(names, limit=None):
  """Weight names in brace notation, exact and short: names that differ
  only in their block index, then only in their last component, are one.

  Example:
    compress(["t/block_000/a/p_q", "t/block_001/a/p_q", "t/block_000/a/p_k",
              "t/block_001/a/p_k", "t/embedding"])
    == "t/block_{000,001}/a/{p_k,p_q}, t/embedding"
  Args:
    limit: at most this many items, then "and N more".
  """
  by_pattern = collections.OrderedDict()
  for name in sorted(names):
    match = _BLOCK.search(name)
    if match:
      pattern = name[:match.start(1)] + "\0" + name[match.end(1):]
      by_pattern.setdefault(pattern, []).append(match.group(1))
    else:
      by_pattern.setdefault(name, [])
  by_head = collections.OrderedDict()
  for pattern, blocks in by_pattern.items():
    item = pattern.replace("\0", _index_set(blocks)) if blocks else pattern
    head, _, leaf = item.rpartition("/")
    by_head.setdefault(head, []).append(leaf)
  items = sorted(
      (head + "/" if head else "") + (
          leaves[0] if len(leaves) == 1 else "{%s}" % ",".join(sorted(leaves)))
      for head, leaves in by_head.items())
  if limit is not None and len(items) > limit:
    return "%s and %d more" % (", ".join(items[:limit]), len(items) - limit)
  return ", ".join(items)


def _layer_counts(names):
  """{stack scope: number of blocks} of weight names (.../block_NNN/...)."""
  blocks = collections.defaultdict(set)
  for name in names:
    match = _BLOCK.search(name)
    if match:
      blocks[name[:match.start()].rstrip("/")].add(match.group(1))
  return {stack: len(b) for stack, b in blocks.items()}


def _layer_classes(names):
  """The layer scopes (TalkingHeadsAttention, DenseReluDense, ...) named."""
  out = set()
  for name in names:
    match = re.search(r"/layer_\d+/([^/]+)/", name)
    if match:
      out.add(match.group(1))
  return out


def _shape_text(value):
  shape, dtype = value
  return "%s%s" % (list(shape), " %s" % dtype if dtype else "")


def variable_differences(old, new, dtypes=True):
  """(only in old, only in new, [(name, old value, new value)] of the
  names both have with another shape, or dtype when both know it)."""
  only_old = sorted(set(old) - set(new))
  only_new = sorted(set(new) - set(old))
  changed = []
  for name in sorted(set(old) & set(new)):
    (s1, d1), (s2, d2) = old[name], new[name]
    if list(s1) != list(s2) or (dtypes and d1 and d2 and d1 != d2):
      changed.append((name, old[name], new[name]))
  return only_old, only_new, changed


def describe_difference(old, new, old_name, new_name, dtypes=True):
  """One phrase naming how two models' weights differ ("" when they do not).

  The layer count and the layer classes first when they differ (what a gin
  macro changed: num_layers, the attention class), then the weights.

  Example:
    "2 layers in transformer/ in the model_dir, 1 in this configuration;
     only in the model_dir: transformer/block_001/layer_000/..."
  """
  only_old, only_new, changed = variable_differences(old, new, dtypes)
  if not (only_old or only_new or changed):
    return ""
  parts = []
  counts_old, counts_new = _layer_counts(old), _layer_counts(new)
  for stack in sorted(set(counts_old) & set(counts_new)):
    if counts_old[stack] != counts_new[stack]:
      parts.append("%d layers in %s/ in %s, %d in %s" % (
          counts_old[stack], stack, old_name, counts_new[stack], new_name))
  classes_old, classes_new = _layer_classes(old), _layer_classes(new)
  if classes_old - classes_new or classes_new - classes_old:
    parts.append("layers %s in %s, %s in %s" % (
        ", ".join(sorted(classes_old - classes_new)) or "-", old_name,
        ", ".join(sorted(classes_new - classes_old)) or "-", new_name))
  if changed:
    name, a, b = changed[0]
    parts.append("%s is %s in %s, %s in %s%s" % (
        name, _shape_text(a), old_name, _shape_text(b), new_name,
        " (and %d more of other shapes)" % (len(changed) - 1)
        if len(changed) > 1 else ""))
  if only_old:
    parts.append("only in %s: %s" % (old_name, compress(only_old, 6)))
  if only_new:
    parts.append("only in %s: %s" % (new_name, compress(only_new, 6)))
  return "; ".join(parts)
