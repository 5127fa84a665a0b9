"""Will it fit, how fast, which layout: memory and step time per mesh.

  mtf_th plan --gin_file experiments/t5_heads/07_talking_heads_24_32.gin \\
      --hardware tpu_v3 --devices 8

Enumerates the mesh shapes batch:B,model:P of --devices devices, the
sharding strategies that apply to each and the heads-parallel core
recomputed in the backward pass ("+recompute", strategies/recompute.py)
(planner.py), predicts the memory of one training step per device
(memory.py) and its step time (step_time.py), drops what does not fit in
the device's memory with --margin left free (default 10%), and prints the
rest fastest first: mesh_shape, strategy, memory_gib per device (and its
parts: weights + gradients + optimizer state, activations, the n x m x
heads tensors, or the fused core's statistics and masks where it runs:
on --hardware cpu unless the gin files bind mtf_th.core_kernel.kind =
"einsum", memory.py; temporaries), step_s, network_s and the gin bindings
that run it (pass each with --gin_param).  --all lists the candidates that do
not fit too (fits = no).  --batch B overrides the gin files' batch_size
(the whole slice's).  The vocabulary is that of the gin files' task
(MIXTURE_NAME: data/task_names.vocabulary_size; --vocab N to give
another), padded to a multiple of 128 as mtf pads it.  When nothing fits:
one line on stderr with the smallest memory found and what would make it
fit, exit status 1.  Bad arguments exit with status 2 before anything is
computed: --devices must be a slice size of the TPU generation
(estimate/hardware.py's SLICES; cpu: at most MAX_CPU_DEVICES), and the gin
files and bindings pass the checks `mtf_th train` runs before TensorFlow
(commands/prechecks.py: the file order, a misspelt macro, a class or
parameter the configuration does not have, values such as mesh_shape).
TensorFlow is never imported.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import vocabulary
from mtf_talking_heads.core import spec as spec_lib

PROG = "mtf_th plan"
COLUMNS = ("mesh_shape", "strategy", "fits", "memory_gib", "state_gib",
           "activations_gib", "core_gib", "temporaries_gib", "step_s",
           "network_s", "gin")


def _build_parser(hardware_names):
  parser = commands.ArgumentParser(
      prog=PROG,
      description="Predicted memory per device and step time of every mesh "
      "shape and sharding strategy of a model on --devices devices; the "
      "ones that fit, fastest first.  See docs/costs.md.")
  commands.add_gin_arguments(parser)
  parser.add_argument("--hardware", required=True, metavar="NAME",
                      choices=hardware_names,
                      help="one of %s" % ", ".join(hardware_names))
  parser.add_argument("--devices", required=True, type=int, metavar="N",
                      help="mtf devices (TPU v2/v3: cores; v4, v5e: chips)")
  parser.add_argument("--batch", type=int, metavar="B",
                      help="sequences per step on the whole slice "
                      "(default: the gin files' batch_size)")
  parser.add_argument("--margin", type=float, default=0.1, metavar="F",
                      help="fraction of device memory left free (default "
                      "0.1)")
  parser.add_argument("--implementation", metavar="NAME",
                      help="perf implementation (default mtf_th: bfloat16 "
                      "activations; cpu: mtf_th_float32)")
  parser.add_argument("--vocab", type=int, default=None, metavar="N",
                      help="the task's vocabulary size, padded to a "
                      "multiple of 128 as mtf pads it (default: the "
                      "vocabulary of the gin files' MIXTURE_NAME, e.g. 259 "
                      "for the _bytes tasks; the paper's T5: 32128)")
  parser.add_argument("--mesh_shape", metavar="SHAPE",
                      help="only this mesh, e.g. batch:8 (data parallel "
                      "only) or batch:2,model:4")
  parser.add_argument("--paper_table", metavar="NAME",
                      help="instead of --gin_file: one line per row of "
                      "gin/experiments/NAME (e.g. t5_heads) at its batch: "
                      "data parallel memory and verdict, the fastest "
                      "candidate that fits")
  parser.add_argument("--all", action="store_true",
                      help="also list the candidates that do not fit")
  parser.add_argument("--top", type=int, default=10, metavar="K",
                      help="rows to print (default 10; 0: all)")
  parser.add_argument("--format", choices=("md", "csv"), default="md")
  return parser


def _check(args):
  """The arguments, before anything is enumerated; the gin files as
  `mtf_th train` checks them (commands/prechecks.py: one validator)."""
  from mtf_talking_heads.commands import prechecks  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import hardware  # pylint: disable=g-import-not-at-top
  for name in ("devices", "batch", "vocab"):
    if getattr(args, name) is not None:
      spec_lib.positive_int("--" + name, getattr(args, name))
  hardware.check_devices(args.hardware, args.devices)
  prechecks.gin_files(args.gin_file)
  prechecks.gin_order(args.gin_file)
  prechecks.gin_params(args.gin_param)
  if args.gin_file:
    prechecks.gin_bindings(args.gin_file, args.gin_param)
    prechecks.mixture(None, args.gin_file, args.gin_param)
  if not 0 <= args.margin < 1:
    raise commands.UsageError("--margin must be in [0, 1), got %r"
                              % args.margin)
  if args.top < 0:
    raise commands.UsageError("--top must be >= 0, got %d" % args.top)
  if args.paper_table and (args.gin_file or args.gin_param):
    raise commands.UsageError("--paper_table reads its own gin files; drop "
                              "--gin_file / --gin_param")
  if not args.gin_file and not args.paper_table:
    raise commands.UsageError("give --gin_file FILE (repeatable) or "
                              "--paper_table NAME")


def _gib(x):
  return "%.2f" % (x / 2.0 ** 30)


def _strategy(c):
  """The strategy cell: "heads_parallel+recompute" for a recomputed core."""
  return c.strategy + ("+recompute" if c.recompute else "")


def _row(c, fmt):
  m = c.memory
  gin = "; ".join(c.gin)
  return [c.mesh_shape, _strategy(c), "yes" if c.fits else "no",
          _gib(m["total"]),
          _gib(m["weights"] + m["gradients"] + m["optimizer"]),
          _gib(m["activations"]), _gib(m["core"]), _gib(m["temporaries"]),
          "%.4f" % c.step_s, "%.4f" % c.network_s,
          "`%s`" % gin if fmt == "md" else gin]


def dropout_on(gin_files, gin_params):
  """Whether the gin files set a positive dropout_rate macro."""
  from mtf_talking_heads.core import gin_text as gin_reader  # pylint: disable=g-import-not-at-top
  config = gin_reader.GinConfig(gin_files, gin_params)
  return bool(config.get("dropout_rate", 0.0))


def _run(args):
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  _check(args)
  mesh = None
  if args.mesh_shape:
    axes = model_lib.parse_mesh(args.mesh_shape)
    if axes["batch"] * axes["model"] != args.devices:
      raise commands.UsageError(
          "--mesh_shape %r has %d devices, --devices is %d; make them equal"
          % (args.mesh_shape, axes["batch"] * axes["model"], args.devices))
    mesh = "batch:%d,model:%d" % (axes["batch"], axes["model"])
  if args.paper_table:
    return _paper_table(args, mesh)
  params = list(args.gin_param)
  if args.batch:
    params.append("batch_size = %d" % args.batch)
  model = model_lib.model_from_gin(args.gin_file, params,
                                   vocab=vocab(args, args.gin_file, params))
  model_lib.check_gin_layout(args.gin_file, params, model)  # dims, as perf
  dropout = dropout_on(args.gin_file, params)
  candidates = _candidates(model, args, mesh, dropout,
                           _kernel(args.gin_file, params, args.hardware))
  fitting = [c for c in candidates if c.fits]
  usable = planner.usable_bytes(args.hardware, args.devices, args.margin)
  if not fitting:
    best = min(candidates, key=lambda c: c.memory["total"])
    hints = planner.what_would_fit(model, args.hardware, args.devices,
                                   args.implementation, args.margin, dropout)
    raise NothingFits(
        "nothing fits: the smallest is %s GiB per device (%s, %s) against "
        "%s GiB usable of %s GiB on %s (%d%% margin), batch %d on %d "
        "devices; it would fit with %s" % (
            _gib(best.memory["total"]), best.mesh_shape, _strategy(best),
            _gib(usable), _gib(memory.device_memory(args.hardware,
                                                    args.devices)),
            args.hardware, round(100 * args.margin), model.batch,
            args.devices, " or ".join(hints) if hints else
            "nothing: not with a smaller batch nor on the next 6 larger "
            "slices; give a smaller model"))
  shown = candidates if args.all else fitting
  if args.top:
    shown = shown[:args.top]
  return commands.format_table(COLUMNS, [_row(c, args.format) for c in shown],
                               args.format, text_columns=(
                                   "mesh_shape", "strategy", "fits", "gin"))


def _kernel(gin_files, gin_params, hardware):
  """The attention core's kernel the run would use (fit_check.kernel_of:
  the fused core on CPU unless mtf_th.core_kernel.kind = "einsum")."""
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  return fit_check.kernel_of(gin_text.GinConfig(gin_files, gin_params),
                             hardware)


def _candidates(model, args, mesh, dropout=False, kernel="einsum"):
  from mtf_talking_heads.estimate import planner  # pylint: disable=g-import-not-at-top
  try:
    candidates = planner.plan(model, args.hardware, args.devices,
                              args.implementation, args.margin, dropout,
                              kernel=kernel)
  except ValueError:
    if not mesh:
      raise
    candidates = []  # why_not says why this mesh does not split it
  if mesh:
    candidates = [c for c in candidates if c.mesh_shape == mesh]
    if not candidates:
      raise ValueError("--mesh_shape %s does not split this model: %s"
                       % (mesh, why_not(model, mesh, args)))
  return candidates


def why_not(model, mesh, args):
  """Why step_time cannot split `model` on `mesh`: the dim that does not
  divide (the vocabulary as mtf pads it)."""
  from mtf_talking_heads.estimate import step_time  # pylint: disable=g-import-not-at-top
  try:
    step_time.predict(model, args.hardware, mesh, args.implementation or (
        "mtf_th_float32" if args.hardware == "cpu" else "mtf_th"))
  except ValueError as e:
    text = str(e)
    if text.startswith("vocab "):
      text = "the padded " + text + " (%s)" % _vocab_source(args)
    return text
  return "no sharding strategy applies to it"


def _vocab_source(args):
  """e.g. "th_lm_bytes's 259 ids padded to a multiple of 128, as mtf
  pads it"."""
  what = "--vocab %d" % args.vocab if args.vocab else "the task's vocabulary"
  if not args.vocab:
    try:
      what = "%s's %d ids" % vocabulary.task_vocab(args.gin_file,
                                                   args.gin_param)[::-1]
    except (commands.UsageError, ValueError):
      pass
  return what + " padded to a multiple of 128, as mtf pads it"


def vocab(args, gin_files, gin_params):
  """The vocabulary dim mtf computes with: --vocab, else the gin files'
  task's (vocabulary.task_vocab), padded (model.padded_vocab).

  Raises:
    commands.UsageError: the task's vocabulary is unknown here.
  """
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  size = args.vocab or vocabulary.task_vocab(gin_files, gin_params)[0]
  return model_lib.padded_vocab(size)


PAPER_COLUMNS = ("row", "label", "batch_per_device", "data_parallel_gib",
                 "fits_data_parallel", "best_mesh", "best_strategy",
                 "best_gib", "best_step_s")


def _paper_table(args, mesh):
  """One line per experiment row: data parallel, and the best that fits."""
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  rows = []
  for name, label, model in model_lib.experiment_rows(args.paper_table):
    model = model._replace(vocab=vocab(
        args, ["experiments/%s/%s.gin" % (args.paper_table, name)], []))
    if args.batch:
      model = model._replace(batch=args.batch)
    candidates = _candidates(model, args, mesh)
    data = [c for c in candidates if c.mesh_shape.endswith(",model:1")
            and not c.recompute]
    fitting = [c for c in candidates if c.fits]
    best = fitting[0] if fitting else None
    rows.append([name, label, "%g" % (model.batch / args.devices),
                 _gib(data[0].memory["total"]) if data else "",
                 ("yes" if data[0].fits else "no") if data else "",
                 best.mesh_shape if best else "none fits",
                 _strategy(best) if best else "",
                 _gib(best.memory["total"]) if best else "",
                 "%.4f" % best.step_s if best else ""])
  return commands.format_table(PAPER_COLUMNS, rows, args.format,
                               text_columns=("row", "label", "best_mesh",
                                             "best_strategy",
                                             "fits_data_parallel"))


class NothingFits(Exception):
  """No candidate fits: the one line to print, exit status 1."""


def main(argv=None):
  from mtf_talking_heads.estimate import hardware  # pylint: disable=g-import-not-at-top
  parser = _build_parser(hardware.hardware_names())
  argv = list(sys.argv[1:] if argv is None else argv)
  args = commands.parse(parser, argv)
  if isinstance(args, int):
    return args
  try:
    text = _run(args)
  except (commands.UsageError, ValueError) as e:
    print("%s: error: %s" % (PROG, e), file=sys.stderr)
    return 2
  except NothingFits as e:
    print("%s: %s" % (PROG, e), file=sys.stderr)
    return 1
  sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
