"""The model a step is priced for: a whole transformer, without TensorFlow.

Pure Python.  A Model is what the gin files of `mtf_th train` configure
(kind, layers, sizes, batch, lengths, the Attention of each placement, the
optimizer); step_time.py prices its training step, memory.py its bytes per
device, the planner both.  Made by make_model / paper_model, or read from
gin files as text (model_from_gin: no TensorFlow, gin's global
configuration untouched; nn/live_gin.py reads the same macros from gin's
live bindings).  parse_mesh reads a --mesh_shape of batch and model axes.

Example (the paper's T5, 12 heads of d_k = 64):

  >>> model = paper_model(heads=12, d_k=64, variant="multi_head")
  >>> model.enc_self.heads, parameter_count(model) > 2e8
  (12, True)
"""
import collections
import math
import os

from mtf_talking_heads.core import gin_paths
from mtf_talking_heads.core import gin_text as gin_reader
from mtf_talking_heads.core import spec as spec_lib
from mtf_talking_heads.estimate import costs

Attention = spec_lib.AttentionSpec  # groups: grouped_talking_heads only
Model = collections.namedtuple("Model", [
    "kind", "num_layers", "d_model", "d_ff", "vocab", "batch",
    "inputs_length", "targets_length", "enc_self", "dec_self", "encdec",
    "relative_bias", "optimizer", "shared_layers"])
Model.__doc__ = """A whole transformer, as its gin files configure it.

Attributes:
  kind: "bitransformer" (encoder + decoder), "lm" (decoder only, on
    targets_length) or "encoder" (encoder only, on inputs_length).
  num_layers: layers per stack.
  d_model, d_ff, vocab: sizes (embedding shared with the softmax).
  batch: sequences per step (whole mesh).
  inputs_length, targets_length: sequence lengths.
  enc_self, dec_self, encdec: the Attention of each placement (None where
    the model has none).
  relative_bias: True if self-attention adds a T5 relative position bias.
  optimizer: one of OPTIMIZERS.
  shared_layers: True if the layers of a stack share their weights (ALBERT):
    the work is per layer, the parameters (optimizer, all-reduce) once.
"""
KINDS = ("bitransformer", "lm", "encoder")
# The optimizers modelled: step_time.OPTIMIZER_PASSES and
# memory.OPTIMIZER_SLOTS price each.
OPTIMIZERS = ("adafactor", "adam", "lamb")
# mtf's Unitransformer pads the vocabulary to a multiple of this
VOCAB_DIVISOR = 128
PLACEMENTS = ("enc_self", "dec_self", "encdec")
# The attention placements each kind of model has.
KIND_PLACEMENTS = {"bitransformer": PLACEMENTS, "lm": ("dec_self",),
                   "encoder": ("enc_self",)}



def padded_vocab(size):
  """The vocabulary dim mtf computes with: `size` rounded up to VOCAB_DIVISOR.

  >>> padded_vocab(259)  # seqio.ByteVocabulary: pad, eos, unk, 256 bytes
  384
  """
  return -(-size // VOCAB_DIVISOR) * VOCAB_DIVISOR

def make_attention(variant, heads, d_k=None, d_v=None, heads_k=None,
                   heads_v=None, dynamic=(), groups=None):
  """An Attention, validated by costs.resolve_config.

  variant "dynamic_projections" is talking heads with `dynamic` terms; d_v
  defaults to d_k; groups: the head groups of grouped_talking_heads.
  """
  d_v = d_k if d_v is None else d_v
  if variant == spec_lib.DYNAMIC:
    if not dynamic:
      raise ValueError("variant 'dynamic_projections' needs dynamic terms "
                       "(a subset of %s)" % ", ".join(costs.DYNAMIC_TERMS))
    variant = spec_lib.TALKING_HEADS
  if variant == spec_lib.BILINEAR:
    d_k = d_v = None  # d_model, known only with the model
  # d_model and length do not matter to these checks: any valid value
  cfg = costs.resolve_config(variant, heads_k, heads, heads_v, d_k, d_v,
                             d_model=d_k or 1, length=1, dynamic=dynamic,
                             groups=groups)
  return Attention(variant, cfg["heads_k"], cfg["heads"], cfg["heads_v"],
                   d_k if variant != spec_lib.BILINEAR else None,
                   d_v if variant != spec_lib.BILINEAR else None,
                   cfg["dynamic"], cfg["groups"])


def make_model(kind, num_layers, d_model, d_ff, vocab, batch, inputs_length,
               targets_length, enc_self=None, dec_self=None, encdec=None,
               relative_bias=True, optimizer="adafactor",
               shared_layers=False):
  """A validated Model (see Model's attributes)."""
  if kind not in KINDS:
    raise ValueError("kind=%r is unknown; choose one of: %s"
                     % (kind, ", ".join(KINDS)))
  for name, value in (("num_layers", num_layers), ("d_model", d_model),
                      ("d_ff", d_ff), ("vocab", vocab), ("batch", batch),
                      ("inputs_length", inputs_length),
                      ("targets_length", targets_length)):
    spec_lib.positive_int(name, value)
  if optimizer not in OPTIMIZERS:
    raise ValueError("optimizer=%r is not modelled; choose one of: %s"
                     % (optimizer, ", ".join(OPTIMIZERS)))
  needed = KIND_PLACEMENTS[kind]
  given = dict(enc_self=enc_self, dec_self=dec_self, encdec=encdec)
  for name in needed:
    if not isinstance(given[name], Attention):
      raise ValueError("a %s model needs an Attention for %s" % (kind, name))
  return Model(kind, num_layers, d_model, d_ff, vocab, batch, inputs_length,
               targets_length, *(given[n] if n in needed else None
                                 for n in PLACEMENTS),
               relative_bias=bool(relative_bias), optimizer=optimizer,
               shared_layers=bool(shared_layers))


# The paper's T5 (section 7.1): 12 + 12 layers, d_model 768, d_ff 3072,
# batch 128 x (512 inputs, 114 targets); T5's SentencePiece vocabulary of
# 32000 pieces + 100 sentinels, padded by mtf to a multiple of 128.
PAPER_T5 = dict(kind="bitransformer", num_layers=12, d_model=768, d_ff=3072,
                vocab=32128, batch=128, inputs_length=512,
                targets_length=114)


def paper_model(heads, d_k=None, variant=spec_lib.MULTI_HEAD, heads_k=None,
                heads_v=None, d_v=None, dynamic=(), placement="all"):
  """The paper's T5 with one attention configuration.

  placement "all" puts it in every attention layer; "enc_self", "dec_self"
  or "encdec" in that kind only, multi-head (same heads, d_k, d_v)
  elsewhere (Table 4, tab:dp_enc_only).
  """
  d_v = d_k if d_v is None else d_v
  att = make_attention(variant, heads, d_k, d_v, heads_k, heads_v, dynamic)
  mh = make_attention(spec_lib.MULTI_HEAD, heads, d_k or PAPER_T5["d_model"],
                      d_v or PAPER_T5["d_model"])
  if placement != "all" and placement not in PLACEMENTS:
    raise ValueError("placement=%r is unknown; choose all or one of %s"
                     % (placement, ", ".join(PLACEMENTS)))
  chosen = {p: att if placement in ("all", p) else mh for p in PLACEMENTS}
  return make_model(**dict(PAPER_T5, **chosen))


def stacks(model):
  """[(stack, length, [(placement, memory length)])] of the model."""
  n_in, n_out = model.inputs_length, model.targets_length
  if model.kind == "encoder":
    return [("encoder", n_in, [("enc_self", n_in)])]
  if model.kind == "lm":
    return [("decoder", n_out, [("dec_self", n_out)])]
  return [("encoder", n_in, [("enc_self", n_in)]),
          ("decoder", n_out, [("dec_self", n_out), ("encdec", n_in)])]


def loss_positions(model):
  """Positions per example that get a softmax over the vocabulary."""
  return model.inputs_length if model.kind == "encoder" else \
      model.targets_length


def parameter_count(model):
  """Learned parameters: attention (costs.py), feed-forward, norms,
  relative-position biases, the shared embedding."""
  d = model.d_model
  total = model.vocab * d
  for _, _, layers in stacks(model):
    per_layer = 2 * d * model.d_ff + d  # FFN + its norm
    for placement, _ in layers:
      att = getattr(model, placement)
      terms = costs.attention_terms(att.variant, att.heads_k, att.heads,
                                    att.heads_v, att.d_k, att.d_v, d, 1,
                                    dynamic=att.dynamic, groups=att.groups)
      per_layer += sum(math.prod(s) for s in terms["params"].values()) + d
    copies = 1 if model.shared_layers else model.num_layers
    total += per_layer * copies + d  # + final norm
    if model.relative_bias:
      total += 32 * getattr(model, layers[0][0]).heads  # 32 buckets, shared
  return total


# ---------------------------------------------------------------------------
# The mesh.

def parse_mesh(mesh_shape):
  """{"batch": B, "model": P} from "batch:4,model:8" (either may be absent).

  Raises:
    ValueError: naming --mesh_shape.
  """
  sizes = {"batch": 1, "model": 1}
  for item in spec_lib.split_rules(mesh_shape):
    try:
      (name, size), = spec_lib.parse_mesh_shape(item)
    except ValueError:
      name = None
    if name not in sizes:
      raise ValueError(
          "--mesh_shape %r: %r is not NAME:SIZE with NAME batch or model and "
          "a positive SIZE (e.g. batch:16 or batch:2,model:8)"
          % (mesh_shape, item))
    sizes[name] = size
  return sizes


# ---------------------------------------------------------------------------
# Reading a model from gin files (text only: no TensorFlow, gin's global
# configuration untouched).

# utils.run.model_type -> Model kind; a delimited_lm (a decoder-only model
# fine-tuned text-to-text) is an lm over "<inputs> EOS <targets> EOS".
_MODEL_TYPES = {"bitransformer": "bitransformer", "lm": "lm",
                "delimited_lm": "lm", "aligned": "encoder"}
_PLACEMENT_MACROS = ("enc_self_attention", "dec_self_attention",
                     "encdec_attention")


def _placement_variant(ref, where):
  name = ref.name.split(".")[-1] if isinstance(ref, gin_reader.Reference) \
      else None
  for variant in spec_lib.VARIANTS:
    if name in spec_lib.layer_class_names(variant):
      return variant
  raise ValueError("%s = %r is not an mtf_th attention class (one of %s)"
                   % (where, ref, ", ".join(
                       "mtf_th." + v.layer for v in spec_lib.VARIANT_TABLE)))


# optimizer classes (utils.run.optimizer) -> OPTIMIZERS
_OPTIMIZER_CLASSES = {"AdafactorOptimizer": "adafactor",
                      "BertAdamOptimizer": "adam", "LambOptimizer": "lamb"}


def _optimizer(ref, where):
  if ref is None:
    return "adafactor"  # mtf_th.gin's
  name = ref.name.split(".")[-1] if isinstance(ref, gin_reader.Reference) \
      else None
  if name not in _OPTIMIZER_CLASSES:
    raise ValueError("%s: utils.run.optimizer = %r is not modelled; perf "
                     "knows %s" % (where, ref, ", ".join(_OPTIMIZER_CLASSES)))
  return _OPTIMIZER_CLASSES[name]


def model_from_gin(gin_files, gin_params=(), vocab=PAPER_T5["vocab"],
                   gin_dir=None):
  """The Model that `mtf_th train` would build from these gin files.

  Reads the macros num_layers, d_model, d_ff, batch_size, inputs_length,
  targets_length, heads_k, heads, heads_v, d_k, d_v, dynamic,
  relative_attention_type and the placement macros (enc_self_attention,
  dec_self_attention, encdec_attention), and the binding
  utils.run.model_type.  The vocabulary comes from the task, not from gin:
  `vocab` (default T5's 32128).

  Raises:
    ValueError: a missing file or macro, naming it.
  """
  gin_dir = gin_dir or gin_paths.gin_dir()
  config = gin_reader.GinConfig(gin_files, gin_params, gin_dir)
  return model_from_config(config, ", ".join(gin_files) or "the gin files",
                           vocab)


def model_from_config(config, where, vocab=PAPER_T5["vocab"]):
  """model_from_gin's Model from a gin_text.GinConfig (or an object that
  answers its binding, get, require and `in`); `where` names it in errors."""

  def get(name):
    return config.require(name, where)

  model_type = config.binding("utils.run.model_type", "bitransformer")
  if model_type not in _MODEL_TYPES:
    raise ValueError("%s: utils.run.model_type = %r is not one of %s"
                     % (where, model_type, ", ".join(_MODEL_TYPES)))
  kind = _MODEL_TYPES[model_type]
  dims = dict(heads=get("heads"), d_k=get("d_k"), d_v=get("d_v"),
              heads_k=get("heads_k"), heads_v=get("heads_v"),
              dynamic=tuple(get("dynamic") or ()))
  placements = {}
  for macro in _PLACEMENT_MACROS:
    if macro not in config:
      continue
    variant = _placement_variant(get(macro), macro)
    kw = dict(dims)
    v = spec_lib.VARIANT[variant]
    if not v.project_logits:  # tied to heads
      kw.update(heads_k=None)
    if not v.project_weights:
      kw.update(heads_v=None)
    if variant != spec_lib.DYNAMIC:
      kw.update(dynamic=())
    if variant == spec_lib.GROUPED:
      kw.update(groups=get("groups"))
    try:
      placements[macro.split("_attention")[0]] = make_attention(variant, **kw)
    except ValueError as e:
      raise ValueError("%s: %s: %s" % (where, macro, e)) from None
  needed = KIND_PLACEMENTS[kind]
  lengths = [get(name) if name in config or uses else 1 for name, uses in (
      ("inputs_length", kind != "lm"), ("targets_length", kind != "encoder"))]
  if model_type == "delimited_lm":  # one sequence: inputs, then targets
    lengths[1] += get("inputs_length")
  return make_model(
      kind, get("num_layers"), get("d_model"), get("d_ff"), vocab,
      get("batch_size"), lengths[0], lengths[1],
      relative_bias=get("relative_attention_type") is not None,
      optimizer=_optimizer(config.binding("utils.run.optimizer"), where),
      shared_layers=config.binding(
          "transformer.make_layer_stack.block_scope") is False,
      **{k: v for k, v in placements.items() if k in needed})


def model_dim_names(model):
  """The dim names a layout may split in `model`: spec.MODEL_DIMS, the
  split strategies' core_shard and each placement's attention dims."""
  names = set(spec_lib.MODEL_DIMS) | {spec_lib.CORE_SHARD}
  for placement in PLACEMENTS:
    att = getattr(model, placement)
    if att is not None:
      names.update(att.dim_sizes())
  return sorted(names)


def check_gin_layout(gin_files, gin_params, model, gin_dir=None):
  """The `layout` macro of the gin files, if any, names the axes batch or
  model and dims of `model` (spec.check_layout_names).

  `mtf_th perf` prices the heads-parallel layout on --mesh_shape's batch and
  model axes whatever the files lay out; a misspelt rule is refused, not
  ignored.
  """
  config = gin_reader.GinConfig(gin_files, gin_params,
                                gin_dir or gin_paths.gin_dir())
  layout = config.get("layout")
  if isinstance(layout, str):
    spec_lib.check_layout_names(
        spec_lib.parse_layout(layout), spec_lib.STANDARD_MESH_AXES,
        model_dim_names(model), what="layout %r:" % layout)


def row_label(gin_files, gin_params=(), gin_dir=None):
  """The experiment's row_label macro ("" if the files define none)."""
  return gin_reader.GinConfig(gin_files, gin_params,
                              gin_dir or gin_paths.gin_dir()).get(
                                  "row_label", "")


def experiment_rows(table, vocab=PAPER_T5["vocab"], gin_dir=None):
  """[(row name, row_label, Model)] of gin/experiments/<table>/*.gin.

  Raises:
    ValueError: an unknown table, naming --paper_table and the valid ones.
  """
  gin_dir = gin_dir or gin_paths.gin_dir()
  root = os.path.join(gin_dir, "experiments")
  names = sorted(d for d in os.listdir(root)
                 if os.path.isdir(os.path.join(root, d)))
  if table not in names:
    raise ValueError("--paper_table %r is unknown; choose one of: %s"
                     % (table, ", ".join(names)))
  rows = []
  for filename in sorted(os.listdir(os.path.join(root, table))):
    if not filename.endswith(".gin"):
      continue
    rel = "experiments/%s/%s" % (table, filename)
    rows.append((filename[:-4], row_label([rel], gin_dir=gin_dir),
                 model_from_gin([rel], vocab=vocab, gin_dir=gin_dir)))
  return rows
