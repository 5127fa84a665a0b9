"""Bad inputs of issues 20 and 8, each through the real `mtf_th` command line.

Every case asserts the exit status, that stderr is one line, the key words
of that line, and that the shared trained model_dir (one tiny T5 trained
once for the module) keeps its files and their mtimes.  The cases marked
no_tf must be refused before TensorFlow is imported (checked in the child
process) and within REFUSAL_CPU_SECS of the child's CPU time (user + sys:
what an idle machine's wall time is, whatever the load of the test run).
The cases that need TensorFlow (AFTER_TF: gin's parse, the checkpoint's
shapes, launch/tpu.py's pre-flight, a --module_import's tasks) run in one
subprocess that calls each command's main().  The layout-typo cases are
tests/core/test_layout_refusals.py's; stopping a command (Ctrl-C,
SIGTERM): tests/commands/test_stop_signals.py.
"""
import glob
import json
import os
import shutil
import resource
import subprocess
import sys

import pytest

import _cli_util
import _in_process
from mtf_talking_heads.commands import prechecks
from mtf_talking_heads.experiments.sweep import run as run_lib

T5 = ["--gin_file", "experiments/t5_heads/07_talking_heads_24_32.gin",
      "--gin_file", "models/t5_tiny.gin"]
# The refusals before TensorFlow: ~0.1 s of CPU (0.2-0.7 s wall under load).
REFUSAL_CPU_SECS = 2.0
SMALL = ["--gin_param", "num_layers = 1", "--gin_param", "d_model = 32",
         "--gin_param", "d_ff = 64"]


def _make_read_only(path):
  """chmod a-w, and for root (whom mode bits do not stop) chattr +i: then
  nobody can create a file there.  False where neither works."""
  for root, _, files in os.walk(path):
    for name in files:
      os.chmod(os.path.join(root, name), 0o444)
  os.chmod(path, 0o555)
  if os.getuid() != 0:
    return True
  done = subprocess.run(["chattr", "-R", "+i", path], capture_output=True)
  return done.returncode == 0 and not os.access(path, os.W_OK)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """A trained tiny model_dir, a file, a read-only copy, a sweep.json, and
  the outcomes of AFTER_TF (after_tf: one subprocess trains the model_dir,
  then runs those cases)."""
  base = tmp_path_factory.mktemp("bad_inputs")
  model_dir = str(base / "trained")
  outcomes = _train_and_run_after_tf(str(base), model_dir)
  assert outcomes["trained"]["code"] == 0, outcomes["trained"]["stderr"]
  readonly = str(base / "readonly")
  shutil.copytree(model_dir, readonly)
  os.makedirs(os.path.join(readonly, "empty"))  # an empty read-only cache
  read_only = _make_read_only(readonly)
  a_file = str(base / "a_file")
  with open(a_file, "w") as f:
    f.write("not a directory\n")
  sweep_dir = str(base / "sweep")
  os.makedirs(sweep_dir)
  shutil.copy(os.path.join(_cli_util.REPO, "sweeps", "lm_heads",
                           "sweep.json"), sweep_dir)
  yield dict(base=str(base), model_dir=model_dir, readonly=readonly,
             read_only=read_only, file=a_file, sweep=sweep_dir,
             after_tf=outcomes)
  if os.getuid() == 0:
    subprocess.run(["chattr", "-R", "-i", readonly], capture_output=True)
  os.chmod(readonly, 0o755)


# name -> (argv with {model_dir} {readonly} {file} {base} {sweep} filled in,
#          extra environment, exit status, words of the one stderr line,
#          no TensorFlow imported, needs the read-only directory)
CASES = {
    "model_dir_under_a_file": (
        ["train", "--model_dir", "{file}/run"] + T5, {}, 2,
        ["--model_dir", "is under", "which is a file"], True, False),
    "model_dir_is_a_file": (
        ["train", "--model_dir", "{file}"] + T5, {}, 2,
        ["--model_dir", "is a file, not a directory"], True, False),
    "model_dir_read_only": (
        ["train", "--model_dir", "{readonly}"] + T5, {}, 2,
        ["--model_dir", "read-only", "copy it"], True, True),
    "eval_into_read_only_model_dir": (
        ["eval", "--model_dir", "{readonly}"], {}, 2,
        ["--model_dir", "read-only", "eval_results.csv"], True, True),
    "cache_is_a_file": (  # the model_dir's own model (SMALL)
        ["train", "--model_dir", "{model_dir}"] + T5 + SMALL,
        {"MTF_TH_CACHE": "{file}"}, 2,
        ["MTF_TH_CACHE", "is a file", "writable directory"], True, False),
    "cache_read_only_and_empty": (
        ["train", "--model_dir", "{base}/new_run"] + T5,
        {"MTF_TH_CACHE": "{readonly}/empty"}, 2,
        ["MTF_TH_CACHE", "read-only", "corpus"], True, True),
    "visualize_output_dir_is_a_file": (
        ["visualize", "--model_dir", "{model_dir}", "--output_dir", "{file}"],
        {}, 2, ["--output_dir", "is a file"], True, False),
    "visualize_baseline_missing": (
        ["visualize", "--model_dir", "{model_dir}", "--baseline",
         "{model_dir}/model.ckpt-99"], {}, 2,
        ["--baseline", "no such directory or checkpoint"], True, False),
    "sweep_output_dir_is_a_file": (
        ["sweep", "--paper_table", "lm_heads", "--rows", "1", "--output_dir",
         "{file}"], {}, 2, ["--output_dir", "is a file"], True, False),
    "sweep_dry_run_output_dir_is_a_file": (
        ["sweep", "--paper_table", "lm_heads", "--rows", "1", "--output_dir",
         "{file}", "--dry_run"], {}, 2, ["--output_dir", "is a file"], True,
        False),
    "sweep_dry_run_other_settings": (
        ["sweep", "--paper_table", "lm_heads", "--output_dir", "{sweep}",
         "--train_steps", "7", "--dry_run"], {}, 2,
        ["holds a sweep with other settings", "train_steps"], True, False),
    "eval_metrics_unknown_task": (
        ["eval", "--metrics", "--task", "nosuch_task", "--model_dir",
         "{model_dir}"], {}, 2,
        ["--task 'nosuch_task'", "not a registered task", "th_mlm",
         "--module_import"], True, False),
    "eval_metrics_task_typo": (
        ["eval", "--metrics", "--task", "th_finetune_embeded", "--model_dir",
         "{model_dir}"], {}, 2,
        ["--task 'th_finetune_embeded'", "did you mean th_finetune_embedded"],
        True, False),
    "eval_task_without_metrics": (
        ["eval", "--task", "th_finetune_embedded", "--model_dir",
         "{model_dir}"], {}, 2, ["--task", "go with --metrics"], True, False),
    "eval_forward_pass_exceeds_ram": (  # the model's operative config
        ["eval", "--model_dir", "{model_dir}", "--gin_param",
         "batch_size = 1000000"], {}, 2,
        ["predicted", "per device for eval's forward pass", "batch_size "
         "1000000", "GiB of RAM", "lower batch_size"], True, False),
    "decode_forward_pass_exceeds_ram": (
        ["decode", "--model_dir", "{model_dir}", "--gin_param",
         "batch_size = 1000000"] + T5 + SMALL, {}, 2,
        ["predicted", "per device for decode's forward pass",
         "batch_size 1000000", "GiB of RAM"], True, False),
    "module_import_missing": (  # issue 8: mtf_th's --module_import
        ["train", "--model_dir", "{model_dir}", "--module_import",
         "no_such_module_xyz"] + T5, {}, 2,
        ["--module_import", "cannot import 'no_such_module_xyz'"], True,
        False),
    "train_tpu_name_without_network": (
        ["train", "--tpu", "my-tpu", "--model_dir", "{model_dir}"] + T5 +
        SMALL, {},
        2, ["--tpu my-tpu", "cannot resolve", "metadata.google.internal",
            "grpc://"], True, False),
    "gin_param_unquoted_string": (
        ["train", "--model_dir", "{model_dir}", "--gin_param",
         "mesh_shape = model:4"] + T5, {}, 2,
        ["--gin_param", "not a gin value", "mesh_shape = 'model:4'"], True,
        False),
    "pretrained_model_dir_missing": (
        ["finetune", "--model_dir", "{base}/ft", "--pretrained_model_dir",
         "{base}/no_such_run"] + T5, {}, 2,
        ["--pretrained_model_dir", "does not exist"], True, False),
    "scale_file_first": (
        ["train", "--model_dir", "{model_dir}", "--gin_file",
         "models/t5_tiny.gin", "--gin_file",
         "experiments/t5_heads/07_talking_heads_24_32.gin"], {}, 2,
        ["includes models/t5_base.gin", "d_model", "put the scale file last"],
        True, False),
    "gin_file_missing": (
        ["train", "--model_dir", "{model_dir}", "--gin_file",
         "experiments/t5_heads/07_talking_heads_24_23.gin"], {}, 2,
        ["no such file", "07_talking_heads_24_32.gin"], True, False),
    "eval_checkpoint_steps_not_numbers": (
        ["eval", "--model_dir", "{model_dir}", "--checkpoint_steps", "foo"],
        {}, 2, ["--checkpoint_steps", "'foo'"], True, False),
    "eval_model_dir_missing": (
        ["eval", "--model_dir", "{base}/no_such_run"], {}, 2,
        ["--model_dir", "does not exist"], True, False),
    "train_mixture_name_typo": (
        ["train", "--model_dir", "{base}/new_run", "--gin_param",
         "MIXTURE_NAME = 'th_span_corruption_byte'"] + T5, {}, 2,
        ["MIXTURE_NAME 'th_span_corruption_byte'",
         "did you mean th_span_corruption_bytes"], True, False),
    "finetune_mixture_name_unknown": (
        ["finetune", "--model_dir", "{base}/ft", "--pretrained_model_dir",
         "{model_dir}", "--gin_param", "MIXTURE_NAME = 'my_glue'"] + T5, {},
        2, ["MIXTURE_NAME 'my_glue'", "not a registered task",
            "--module_import"], True, False),
    "comm_unknown_strategy": (
        ["comm", "--variant", "talking_heads", "--heads", "4", "--d_k", "4",
         "--d_v", "4", "--d_model", "16", "--length", "8", "--batch", "4",
         "--mesh_shape", "model:2", "--strategy", "nosuch"], {}, 2,
        ["--strategy", "invalid choice"], True, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(world, name):
  argv, env, code, words, no_tf, read_only = CASES[name]
  if read_only and not world["read_only"]:
    pytest.skip("no way to make a directory read-only here")
  argv = [a.format(**world) for a in argv]
  env = {k: v.format(**world) for k, v in env.items()}
  before = _cli_util.snapshot(world["model_dir"])
  start = resource.getrusage(resource.RUSAGE_CHILDREN)
  result = _cli_util.run(argv, extra_env=env, cwd=world["base"])
  end = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (end.ru_utime + end.ru_stime) - (start.ru_utime + start.ru_stime)
  lines = result.stderr.splitlines()
  if not no_tf:  # after TensorFlow: the announce and model-size lines
    lines = [l for l in lines if not l.startswith("[")]
  assert result.code == code, result.stderr
  assert len(lines) == 1, result.stderr
  for word in words:
    assert word in lines[0], lines[0]
  assert lines[0].startswith("mtf_th %s: error: " % argv[0]), lines[0]
  if no_tf:
    assert result.tensorflow is False
    assert cpu < REFUSAL_CPU_SECS, cpu
  assert _cli_util.snapshot(world["model_dir"]) == before


# Bad inputs that need TensorFlow (gin's parse, the checkpoint's shapes,
# tpu.py's pre-flight, a --module_import's tasks), issue 8's among them: the
# subprocess that trains the shared model_dir (world) then calls each
# command's main() in-process, in order, and records its status, stderr and
# the model_dir's snapshot after it; then seqio's task and mixture names.
# name -> (command, argv with {model_dir} {base}, words of the one line)
TWELVE = ["--gin_param", "heads_k = 12", "--gin_param", "heads = 12",
          "--gin_param", "heads_v = 12"]
TPU = ["--dry_run", "--name", "th24", "--zone", "europe-west4-a",
       "--project", "proj", "--model_dir", "gs://bucket/runs/th24"]
EXPERIMENT = ["--experiment", "experiments/t5_heads/07_talking_heads_24_32.gin"]
# another model than the one trained: refused from the gin text
# (runtime/identity.py; tests/commands/test_bad_inputs_identity.py)
SHAPE_WORDS = ["--model_dir", "holds a model trained with heads = 24, "
               "heads_k = 24, heads_v = 24 (", "model_identity.json), but "
               "this configuration makes heads = 12, heads_k = 12, heads_v = "
               "12: "]
AFTER_TF = {
    "issue8_other_shape_train": (
        "train", ["--model_dir", "{model_dir}", "--train_steps", "2"] + T5 +
        SMALL + TWELVE, SHAPE_WORDS),
    "issue8_other_shape_eval": (
        "eval", ["--model_dir", "{model_dir}"] + T5 + SMALL + TWELVE,
        SHAPE_WORDS),
    "issue8_other_shape_decode": (
        "decode", ["--model_dir", "{model_dir}", "--input", "a b"] + T5 +
        SMALL + TWELVE, SHAPE_WORDS),
    "issue8_macro_typo": (
        "train", ["--model_dir", "{model_dir}", "--train_steps", "2",
                  "--gin_param", "heds = 12"] + T5 + SMALL,
        ["'heds'", "Did you mean 'heads'"]),
    "issue8_t5_model_parallelism": (
        "train", ["--model_dir", "{model_dir}", "--train_steps", "2",
                  "--gin_param", "utils.tpu_mesh_shape.model_parallelism = 4"]
        + T5 + SMALL, ["is ignored", "mesh_shape = 'model:4'"]),
    "issue8_tpu_heads_do_not_split": (
        "tpu", TPU + EXPERIMENT + ["--accelerator", "v3-32", "--parallelism",
                                   "model"],
        ["'heads' (size 24)", "model:32"]),
    "issue8_tpu_unknown_accelerator": (
        "tpu", TPU + EXPERIMENT + ["--accelerator", "v9-8"],
        ["--accelerator", "v9"]),
    "issue8_tpu_missing_experiment": (
        "tpu", TPU + ["--experiment", "experiments/t5_heads/99_no.gin",
                      "--accelerator", "v3-8"], ["99_no.gin", "no such file"]),
    # the scale-file-last mistake's model (base T5) cannot fit in RAM:
    # memory.py's prediction (fit_check.cpu_refusal) before the graph,
    # with the fused core (202.41 GiB with kind = "einsum"), the task's
    # vocabulary as `mtf_th plan` prices it (vocabulary.priced_vocab: 8192)
    "base_model_exceeds_ram": (
        "train", ["--model_dir", "{base}/base", "--gin_file",
                  "experiments/t5_heads/07_talking_heads_24_32.gin"],
        ["mtf_th train: error: predicted 102.94 GiB per device for mesh "
         "model:1 (1 device)", "models/t5_tiny.gin) as the LAST --gin_file"]),
    # a --module_import registers more tasks: --task is then checked after
    # the import (tfds_data.get_provider), with the user's names
    "eval_metrics_task_of_a_module_import": (
        "eval", ["--metrics", "--task", "my_mixtur", "--module_import",
                 "my_tasks", "--model_dir", "{model_dir}"],
        ["--task 'my_mixtur'", "did you mean my_mixture"]),
}

# Run after AFTER_TF (they may touch the model_dir): name -> (command, argv)
AFTER_TF_LAST = {
    # train of a run already at its last step: its first lines
    "model_size": ("train", ["--model_dir", "{model_dir}", "--train_steps",
                             "1"] + T5 + SMALL),
}

_AFTER_TF_SCRIPT = r"""
import json, os, sys
cases, model_dir = json.loads(sys.argv[1]), sys.argv[2]
from _cli_util import load_script, snapshot
from _in_process import call
from mtf_talking_heads.commands import decode, evaluate, train
tpu = load_script(os.path.join("launch", "tpu.py"), "launch_tpu")
mains = {"train": train.main, "eval": evaluate.main, "decode": decode.main,
         "tpu": tpu.main}

out = {}
for name, command, argv in cases:
  out[name] = dict(call(mains[command], argv), snapshot=snapshot(model_dir))
  if name == "trained":
    out["before"] = snapshot(model_dir)
import seqio
out["registry"] = sorted(seqio.TaskRegistry.names()) + sorted(
    seqio.MixtureRegistry.names())
print("JSON" + json.dumps(out))
"""

MY_TASKS = """
import seqio
import mtf_talking_heads.data  # this package's tasks first
seqio.MixtureRegistry.add("my_mixture", [("th_mlm", 1.0)])
"""


def _train_and_run_after_tf(base, model_dir):
  """Trains `model_dir` (`mtf_th train --train_steps 1`, in-process), then
  runs AFTER_TF and AFTER_TF_LAST, in one subprocess.

  Returns:
    {case: {code, stderr, stdout, snapshot}, "trained": train's outcome,
    "before": the model_dir's snapshot after training, "registry": seqio's
    task and mixture names}.
  """
  modules = os.path.join(base, "modules")
  os.makedirs(modules, exist_ok=True)
  with open(os.path.join(modules, "my_tasks.py"), "w") as f:
    f.write(MY_TASKS)
  paths = dict(base=base, model_dir=model_dir)
  cases = [("trained", "train", ["--model_dir", model_dir, "--train_steps",
                                 "1"] + T5 + SMALL)]
  cases += [(name, command, [a.format(**paths) for a in argv])
            for name, (command, argv) in sorted(
                (n, c[:2]) for n, c in AFTER_TF.items())]
  cases += [(name, command, [a.format(**paths) for a in argv])
            for name, (command, argv) in AFTER_TF_LAST.items()]
  return _in_process.run_script(_AFTER_TF_SCRIPT, [json.dumps(cases),
                                                  model_dir], cwd=base,
                                paths=[modules])


@pytest.fixture(scope="module")
def after_tf(world):
  return world["after_tf"]


@pytest.mark.parametrize("name", sorted(AFTER_TF))
def test_bad_input_after_tensorflow(after_tf, name):
  command, _, words = AFTER_TF[name]
  result = after_tf[name]
  lines = [l for l in result["stderr"].splitlines() if not l.startswith("[")]
  assert result["code"] == 2, result["stderr"][-2000:]
  assert len(lines) == 1, result["stderr"][-2000:]
  for word in words:
    assert word in lines[0], lines[0]
  if command != "tpu":
    assert lines[0].startswith("mtf_th %s: error: " % command), lines[0]
  assert result["stdout"] == ""
  assert result["snapshot"] == after_tf["before"]


def test_task_names_match_seqios_registry(after_tf):
  """data/task_names.py (what prechecks.task reads without TensorFlow) lists
  exactly what the real import registers, so the two cannot drift."""
  ours, t5_names = prechecks.task_names()
  registered = set(after_tf["registry"]) - {"my_mixture"}
  missing = sorted(registered - set(ours) - set(t5_names))
  stale = sorted(set(ours + t5_names) - registered)
  assert not missing, (
      "registered but not in mtf_talking_heads/data/task_names.py (add them "
      "to THIS_PACKAGE, or T5 after a t5 upgrade): %s" % missing)
  assert not stale, ("in mtf_talking_heads/data/task_names.py but no longer "
                     "registered (remove them): %s" % stale)
  assert len(set(ours)) == len(ours) and len(set(t5_names)) == len(t5_names)


def test_task_is_left_to_the_registry_when_gin_imports_a_module(tmp_path):
  """A gin file's `import my_tasks` may register tasks, as --module_import
  does: prechecks.task then leaves the name to seqio's registry."""
  plain, importing = tmp_path / "plain.gin", tmp_path / "importing.gin"
  plain.write_text("import mtf_talking_heads.data\nd_model = 8\n")
  importing.write_text("import my_tasks\nd_model = 8\n")
  with pytest.raises(prechecks.commands.UsageError, match="my_task"):
    prechecks.task("my_task", [str(plain)])
  prechecks.task("my_task", [str(importing)])
  prechecks.task("my_task", [str(plain)], module_imports=["my_tasks"])
  prechecks.task("th_mlm", [str(plain)])


def test_tpu_name_is_left_to_tensorflow_where_it_may_resolve(monkeypatch):
  """prechecks.tpu refuses only a name that needs an unknown metadata host."""
  prechecks.tpu("grpc://10.0.0.2:8470")  # an address: nothing to look up
  prechecks.tpu("my-tpu", "europe-west4-a", "p")  # the Cloud TPU API's
  monkeypatch.setenv("GCE_METADATA_HOST", "localhost:8080")  # resolves
  prechecks.tpu("my-tpu")
  monkeypatch.setenv("GCE_METADATA_HOST", "nosuch.invalid")
  with pytest.raises(prechecks.commands.UsageError, match="nosuch.invalid"):
    prechecks.tpu("my-tpu", "europe-west4-a")


def test_comm_help_needs_no_tensorflow():
  result = _cli_util.run(["comm", "--help"])
  assert result.code == 0 and "--strategy" in result.stdout
  assert result.tensorflow is False


def test_train_prints_the_model_size_first(after_tf):
  """The first lines of train (here: a run already at its last step)."""
  result = after_tf["model_size"]
  assert result["code"] == 0, result["stderr"][-2000:]
  lines = result["stderr"].splitlines()
  assert lines[0].startswith("[train] ")
  assert lines[1].startswith("[train] model: bitransformer, ")
  for words in ("parameters", "d_model 32", "1 layers per stack",
                "heads 24 (heads_k 24, heads_v 24, d_k 32, d_v 32)"):
    assert words in lines[1], lines[1]


def test_base_model_on_cpu_is_refused_before_the_graph(after_tf, world):
  """base_model_exceeds_ram created nothing."""
  assert after_tf["base_model_exceeds_ram"]["code"] == 2
  assert not os.path.exists(os.path.join(world["base"], "base"))


def test_eval_and_decode_memory_is_one_forward_pass():
  """memory.predict_forward: weights and one forward pass's live tensors,
  not a training step's (which would refuse evals that fit)."""
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import memory  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  att = model_lib.make_attention("talking_heads", 4, 16, heads_k=4, heads_v=4)
  lm = model_lib.make_model("lm", 2, 32, 64, 128, 8, 32, 32, dec_self=att,
                            relative_bias=False)
  forward = memory.predict_forward(lm, "batch:1", "mtf_th_float32")
  # the attention layer at its core: X, Q, K, V and two n x m x heads
  # tensors
  assert forward["activations"] == 4 * (
      8 * 32 * (32 + 3 * 4 * 16) + 2 * 8 * 32 * 32 * 4)
  assert forward["weights"] == memory.predict(lm, "batch:1",
                                              "mtf_th_float32")["weights"]
  # the base T5 of the scale-file-first mistake: training needs ~204 GiB
  # per device (refused above), its eval ~7.5 GiB (fits 24 GiB of RAM)
  base = model_lib.model_from_gin(
      ["experiments/t5_heads/07_talking_heads_24_32.gin"])
  gib = memory.predict_forward(base, "model:1",
                               "mtf_th_float32")["total"] / memory.GiB
  assert 7.5 < gib < 7.7, gib
  # an eval runs the fused core, which keeps no n x m x heads tensor
  fused = fit_check.smallest_forward(base, "model:1", "mtf_th_float32",
                                     kernel="fused") / memory.GiB
  assert 4.5 < fused < 4.6, fused
  # with its task's 8192 ids, as the pre-flight prices it (docs/training.md)
  task = model_lib.model_from_gin(
      ["experiments/t5_heads/07_talking_heads_24_32.gin"], vocab=8192)
  task_gib = {kernel: fit_check.smallest_forward(
      task, "model:1", "mtf_th_float32", kernel=kernel) / memory.GiB
              for kernel in ("fused", "einsum")}
  assert 2.4 < task_gib["fused"] < 2.5, task_gib
  assert 7.45 < task_gib["einsum"] < 7.55, task_gib
  assert memory.predict(base, "model:1", "mtf_th_float32")["total"] > (
      20 * gib * memory.GiB)
  # decoding it keeps every decoder layer's K and V too (docs/training.md)
  decode = memory.predict_forward(base, "model:1", "mtf_th_float32",
                                  decode=True)["total"] / memory.GiB
  assert 10.0 < decode < 10.1, decode


def test_sweep_progress_lines_have_the_runs_eta(tmp_path, monkeypatch):
  """A line per new evaluation and one per PROGRESS_EVERY_SECS, from a real
  child process writing the run's CSV files as `mtf_th train` does."""
  monkeypatch.setattr(run_lib, "POLL_SECS", 0.05)
  monkeypatch.setattr(run_lib, "PROGRESS_EVERY_SECS", 0.3)
  model_dir = str(tmp_path)
  script = (
      "import sys, time, os\n"
      "d = sys.argv[1]\n"
      "with open(os.path.join(d, 'train_log.csv'), 'w') as f:\n"
      "  f.write('step,loss,steps_per_sec,elapsed_sec\\n')\n"
      "  for s in range(1, 11):\n"
      "    f.write('%d,%.3f,2,%.1f\\n' % (s, 5 - s / 10, s / 2)); f.flush()\n"
      "time.sleep(0.6)\n"
      "with open(os.path.join(d, 'eval_results.csv'), 'w') as f:\n"
      "  f.write('step,split,ln_ppl,tokens\\n10,validation,4.25,99\\n')\n"
      "time.sleep(0.4)\n")
  lines = []

  class Log(object):
    def write(self, text):
      lines.extend(text.splitlines())

    def flush(self):
      pass

  runner = run_lib.Runner.__new__(run_lib.Runner)
  runner.log = Log()

  class Run(object):
    row = type("Row", (), {"name": "04_talking_heads_8"})
    seed = 1

  proc = subprocess.Popen([sys.executable, "-c", script, model_dir])
  assert runner._watch(proc, Run, model_dir, Log(), 40) == 0  # pylint: disable=protected-access
  periodic = [l for l in lines if "ln(PPL)" not in l]
  assert periodic and periodic[0] == (
      "    04_talking_heads_8 seed 1: step 10/40, loss 4.0000, 2.00 steps/s;"
      " ETA 15s for this run's training")
  evals = [l for l in lines if "ln(PPL)" in l]
  assert evals == ["    04_talking_heads_8 seed 1: ln(PPL) 4.2500 at step 10;"
                   " step 10/40, loss 4.0000, 2.00 steps/s; ETA 15s for this "
                   "run's training"]


def test_every_shipped_gin_files_mixture_name_passes(tmp_path):
  """prechecks.mixture refuses no MIXTURE_NAME the shipped gin files set
  (each file alone, as a run's last --gin_file sees it)."""
  gin_dir = os.path.join(_cli_util.REPO, "gin")
  names = sorted(os.path.relpath(p, gin_dir) for p in glob.glob(
      os.path.join(gin_dir, "**", "*.gin"), recursive=True))
  assert len(names) > 50
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  mixtures = set()
  for name in names:
    prechecks.mixture(str(tmp_path), [name], [])
    mixtures.add(gin_text.GinConfig([name], (), gin_dir).get("MIXTURE_NAME"))
  assert {"th_lm_bytes", "th_span_corruption_bytes", "th_mlm_sop",
          "th_finetune_embedded"} <= mixtures  # the files were read


def test_damaged_checkpoint_file_is_refused_and_nothing_is_written(
    world, tmp_path):
  """A `checkpoint` file cut or garbled by hand: TF would read no latest
  checkpoint and train from step 0 over model.ckpt-N; train refuses in one
  line and leaves the model_dir as it was."""
  model_dir = str(tmp_path / "damaged")
  shutil.copytree(world["model_dir"], model_dir)
  with open(os.path.join(model_dir, "checkpoint"), "w") as f:
    f.write('model_checkpoint_path: "model.ckpt-')
  before = _cli_util.snapshot(model_dir)
  result = _cli_util.run(["train", "--model_dir", model_dir,
                          "--train_steps", "2"] + T5 + SMALL)
  lines = [l for l in result.stderr.splitlines() if not l.startswith("[")]
  assert result.code == 2, result.stderr[-2000:]
  assert len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith(
      "mtf_th train: error: --model_dir %s: its 'checkpoint' file cannot be "
      "trusted (it does not parse" % model_dir), lines[0]
  assert lines[0].endswith(
      "while model.ckpt-0, 1 is here; training would start again at step 0 "
      "over it: write model_checkpoint_path: \"model.ckpt-1\" into that "
      "file, or use a new --model_dir"), lines[0]
  assert _cli_util.snapshot(model_dir) == before
