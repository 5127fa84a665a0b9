"""Train, evaluate, decode and fine-tune the paper's models, from gin only.

Python API (the ``mtf_th`` commands call these):

  train(model_dir, gin_files, gin_params, train_steps=None)
      trains up to global step train_steps (default: the configuration's
      utils.run.train_steps), resuming from the latest checkpoint in
      model_dir and skipping the batches it has already seen, so a resumed
      run follows the same loss curve as an uninterrupted one.
  evaluate(model_dir, gin_files, gin_params, checkpoint_steps=None)
      -> [dict(step, split, ln_ppl, tokens)]: held-out ln(PPL), the mean
      token cross-entropy in nats over the split's target tokens.
  decode(model_dir, gin_files, gin_params, inputs=None) -> [dict(input, output)]
  finetune(model_dir, pretrained_model_dir, gin_files, gin_params)
  score(model_dir, gin_files, gin_params, max_examples=None)
      -> [dict(task, metric, value, step, examples)]: a fine-tuned
      checkpoint's downstream metrics (decoded, the tasks' metric_fns).

How: mesh_tensorflow.transformer.utils.run builds the TPUEstimator exactly as
``t5_mesh_transformer`` would from the same gin (model, mesh, layout,
optimiser, schedule, batch, lengths); its ``train_model_fn`` hook receives
that estimator.  Our ``mtf_th.train_model`` (bound by gin/mtf_th.gin, so the
stock script uses it too) seeds the graph, exposes every logical CPU device
to the session, skips seen data and attaches hooks.ProgressHook; eval and
decode pass their own function to the same hook.  On CPU the mesh is
PlacementMeshImpl over logical CPU devices; with ``tpu=...`` utils.run uses
SimdMeshImpl on the TPU slice.

Everything that can be checked before a graph exists is checked first (gin
files and bindings, corpus paths, mesh shape against devices, layout against
the model's dims, divisibility, sequence lengths), raising ConfigError (a
ValueError) that names the parameter and the fix.

Files written to model_dir: checkpoints (model.ckpt-N.*, written by TF's
Saver: data to a temporary name, then renamed, then the ``checkpoint`` index
updated, so a killed run never leaves a listed checkpoint half-written),
operative_config.gin, model_identity.json, TensorBoard events (train;
eval_<split>/), and the CSV
files of runtime/run_files.py.

The package, one job per file:
  errors.py       ConfigError, TrainingError, Interrupted; op-failure lines.
  settings.py     parse_gin, Settings (what utils.run will receive).
  checks.py       preflight(), check_settings(): every check before a graph.
  model_size.py   the model's size line and the RAM bound, before a graph.
  setup.py        prepare(): the one setup sequence of train, eval, decode
                  and finetune (checkpoints, gin, pre-flight, size line,
                  checkpoint match), in one order.
  devices.py      mtf_th.mesh_devices: logical CPU devices for the mesh.
  estimator.py    run(): utils.run with our train_model_fn; the estimator's
                  seed (initial weights seeded by name: ../nn/init_seeds.py)
                  and devices; no retry of failing ops; the model_dir lock
                  (../runtime/dir_lock.py); --tpu resolved first.
  hooks.py        OrderReadsBeforeWritesHook (reproducible steps),
                  ProgressHook (train_log.csv, progress lines).
  checkpoints.py  which checkpoints to keep, which exist, whether they fit.
  identity.py     the model a model_dir holds (model_identity.json, written
                  at the first save) against the configured weights; what
                  finetune loads and initialises.
  loop.py         mtf_th.train_model and train().
  evaluation.py   mtf_th.evaluate_checkpoints and evaluate().
  decoding.py     decode().
  finetuning.py   finetune() (paper section 7.1) and BERT's / ALBERT's
                  fine-tuning schedule.
  metrics.py      score(): downstream metrics (seqio metric_fns) of a
                  fine-tuned checkpoint, downstream_results.csv.
  tfds_data.py    --data_dir: t5's TFDS tasks read from it, checked first.
  t5_api.py       mtf_model(): t5's Python API (t5.models.MtfModel) with
                  this package's gin, trained as `mtf_th train` trains.
gin/mtf_th.gin imports this package, which registers every mtf_th.*
configurable above.
"""
# pylint: disable=g-importing-member  (this file only re-exports)
from mtf_talking_heads.training.checkpoints import checkpoint_steps
from mtf_talking_heads.training.checkpoints import configured_variables
from mtf_talking_heads.training.checkpoints import latest_step
from mtf_talking_heads.training.checks import check_settings
from mtf_talking_heads.training.checks import preflight
from mtf_talking_heads.training.decoding import decode
from mtf_talking_heads.training.devices import available_cpu_devices
from mtf_talking_heads.training.devices import DEFAULT_MAX_CPU_DEVICES
from mtf_talking_heads.training.devices import mesh_devices
from mtf_talking_heads.training.errors import ConfigError
from mtf_talking_heads.training.errors import Interrupted
from mtf_talking_heads.training.errors import TrainingError
from mtf_talking_heads.training.evaluation import eval_dataset
from mtf_talking_heads.training.evaluation import evaluate
from mtf_talking_heads.training.evaluation import evaluate_checkpoints
from mtf_talking_heads.training.finetuning import finetune
from mtf_talking_heads.training.hooks import OrderReadsBeforeWritesHook
from mtf_talking_heads.training.loop import train
from mtf_talking_heads.training.loop import train_model
from mtf_talking_heads.training.metrics import score
from mtf_talking_heads.training.settings import parse_gin
from mtf_talking_heads.training.settings import resolve_gin_file
from mtf_talking_heads.training.settings import Settings

__all__ = [
    "available_cpu_devices",
    "check_settings",
    "checkpoint_steps",
    "ConfigError",
    "configured_variables",
    "decode",
    "DEFAULT_MAX_CPU_DEVICES",
    "eval_dataset",
    "evaluate",
    "evaluate_checkpoints",
    "finetune",
    "Interrupted",
    "latest_step",
    "mesh_devices",
    "OrderReadsBeforeWritesHook",
    "parse_gin",
    "preflight",
    "resolve_gin_file",
    "score",
    "Settings",
    "train",
    "train_model",
    "TrainingError",
]
