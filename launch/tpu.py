#!/usr/bin/env python3
"""Train and evaluate one experiment on a Cloud TPU VM slice (gcloud).

  launch/tpu.py --dry_run --name th-exp --zone europe-west4-a \\
      --project my-project --accelerator v3-32 --parallelism mixed \\
      --model_dir gs://my-bucket/runs/th24 \\
      --experiment experiments/t5_heads/07_talking_heads_24_32.gin

First runs `mtf_th train`'s pre-flight checks here (training.parse_gin and
training.preflight(tpu=...)) on exactly the gin files, mesh and layout it
will send, so a configuration that cannot train (e.g. 24 heads on model:32),
an unknown accelerator type or a missing experiment file stops it with one
line and status 2 before anything is created.  Then prints (--dry_run) or
runs, in order: create the TPU VM slice, copy what a worker needs (the
package, setup.py, requirements.lock, gin/; packed here into one tarball,
never .venv, runs or caches) to every worker, install the pinned Python
packages there (the image's TPU build of TensorFlow 2.15 is kept), train,
evaluate, and (with --delete) delete the slice.  The mesh follows the slice:
v2/v3-N have N TensorCores, v4-N has N/2 devices (megacore);
  --parallelism model   mesh_shape = 'model:<devices>'  (heads, d_ff, vocab split)
  --parallelism batch   mesh_shape = 'batch:<devices>'  (data parallel)
  --parallelism mixed   mesh_shape = 'batch:<devices/8>,model:8'
Activations are bfloat16 on TPU.  Uses TPUEstimator, so the slice needs a TF
2.15 StreamExecutor ("-se") runtime image (v2, v3, v4).  Needs this package
importable here (for the pre-flight), e.g. from the repository's .venv.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {
    "model": "heads:model,d_ff:model,vocab:model",
    "batch": "batch:batch",
    "mixed": "batch:batch,heads:model,d_ff:model,vocab:model",
}


# The generations Cloud TPU offers with the TF 2.15 StreamExecutor runtime
# (TPUEstimator); v5e / v5p / v6e run only PJRT.  Their slice sizes
# (TensorCores per accelerator type vG-N) are estimate/hardware.py's SLICES.
SE_GENERATIONS = (2, 3, 4)
# What a worker needs to install and run mtf_th (relative to the repository).
SHIPPED = ("mtf_talking_heads", "mtf_talking_heads_startup.py", "setup.py",
           "MANIFEST.in", "requirements.lock", "gin")
_NOT_SHIPPED = ("__pycache__", ".pyc", ".pyo")


def slice_sizes():
  """{generation: TensorCores of each slice} (estimate/hardware.py's SLICES,
  through the light package import)."""
  _gin_text()
  from mtf_talking_heads.estimate import hardware  # pylint: disable=g-import-not-at-top
  return {g: hardware.SLICES["tpu_v%d" % g].sizes for g in SE_GENERATIONS}


def devices_of(accelerator):
  """Number of mesh devices of an accelerator type such as v3-32."""
  sizes = slice_sizes()
  match = re.fullmatch(r"v(\d)-(\d+)", accelerator or "")
  known = ", ".join("v%d-{%s}" % (g, ",".join(map(str, n)))
                    for g, n in sorted(sizes.items()))
  if not match:
    raise ValueError("--accelerator %r is not a TPU type: use one of %s"
                     % (accelerator, known))
  generation, cores = int(match.group(1)), int(match.group(2))
  if generation not in sizes:
    raise ValueError("--accelerator %r: TPU v%d has no TensorFlow 2.15 "
                     "StreamExecutor runtime (TPUEstimator); use one of %s"
                     % (accelerator, generation, known))
  if cores not in sizes[generation]:
    raise ValueError("--accelerator %r: v%d slices have %s TensorCores"
                     % (accelerator, generation,
                        ", ".join(map(str, sizes[generation]))))
  return cores // 2 if generation >= 4 else cores


def mesh_for(accelerator, parallelism):
  """(mesh_shape, layout) for a slice and a kind of parallelism."""
  n = devices_of(accelerator)
  if parallelism == "model":
    return "model:%d" % n, LAYOUTS["model"]
  if parallelism == "batch":
    return "batch:%d" % n, LAYOUTS["batch"]
  if parallelism == "mixed":
    if n % 8:
      raise ValueError("--parallelism mixed needs a multiple of 8 devices, "
                       "%s has %d" % (accelerator, n))
    return "batch:%d,model:8" % (n // 8), LAYOUTS["mixed"]
  raise ValueError("--parallelism must be model, batch or mixed, got %r"
                   % parallelism)


# What --parallelism sets; a gin file or binding that sets one of them too
# would silently lose to it (or win over it).
_LAYOUT_SETTINGS = ("mesh_shape", "layout", "utils.run.mesh_shape",
                    "utils.run.layout_rules")


def _gin_text():
  """mtf_talking_heads.core.gin_text without TensorFlow (the mtf_th script's
  light package import; the pre-flight imports what it needs itself)."""
  if "mtf_talking_heads" not in sys.modules:
    import mtf_talking_heads_startup  # pylint: disable=g-import-not-at-top
    mtf_talking_heads_startup.LIGHT_PACKAGE_IMPORT = True
  from mtf_talking_heads.core import gin_text  # pylint: disable=g-import-not-at-top
  return gin_text


def check_layout_choice(args):
  """The mesh and layout come from --parallelism only.

  Raises:
    ValueError: naming the gin file or binding that also sets them.
  """
  mesh, layout = mesh_for(args.accelerator, args.parallelism)
  chosen = "--parallelism %s (mesh_shape = '%s', layout = '%s')" % (
      args.parallelism, mesh, layout)
  for name in args.gin_file:
    try:
      own = _gin_text().own_settings(name)
    except (OSError, ValueError):
      continue  # a missing or malformed file: the pre-flight names it
    clash = [s for s in _LAYOUT_SETTINGS if s in own]
    if clash:
      raise ValueError(
          "--gin_file %s sets %s, which %s overrides; choose the layout "
          "with --parallelism (model, batch or mixed) and drop %s"
          % (name, " and ".join(clash), chosen, name))
  for param in args.gin_param:
    setting = param.partition("=")[0].strip()
    if setting in _LAYOUT_SETTINGS:
      raise ValueError(
          "--gin_param %r overrides %s; choose the layout with "
          "--parallelism (model, batch or mixed) and drop the binding"
          % (param, chosen))


def runtime_version(accelerator):
  single_host = devices_of(accelerator) <= 8
  return "tpu-vm-tf-2.15.0-se" if single_host else "tpu-vm-tf-2.15.0-pod-se"


def hardware_of(accelerator):
  """hardware.py's name of an accelerator type, e.g. v3-32: tpu_v3."""
  return "tpu_v%s" % accelerator[1]


def gin_args(args):
  """(gin files, gin bindings) that train and eval receive."""
  mesh, layout = mesh_for(args.accelerator, args.parallelism)
  files = [args.experiment] + args.gin_file
  # Auto predicts step time and memory for the slice's TPU (its default
  # hardware is the CPU the mesh runs on elsewhere)
  params = ['mesh_shape = "%s"' % mesh, 'layout = "%s"' % layout,
            'activation_dtype = "bfloat16"',
            'mtf_th.Auto.hardware = "%s"' % hardware_of(args.accelerator)
            ] + args.gin_param
  return files, params


def tarball_path(args):
  return os.path.join(tempfile.gettempdir(),
                      "mtf_talking_heads-%s.tar.gz" % args.name)


def _shipped(tarinfo):
  name = os.path.basename(tarinfo.name)
  if name in _NOT_SHIPPED or name.endswith(_NOT_SHIPPED):
    return None
  return tarinfo


def pack(path, repo=REPO):
  """Writes the tarball of SHIPPED (no caches) and returns its member names."""
  with tarfile.open(path, "w:gz") as tar:
    for name in SHIPPED:
      tar.add(os.path.join(repo, name), arcname=name, filter=_shipped)
  with tarfile.open(path) as tar:
    return tar.getnames()


def commands(args):
  """The gcloud commands, as argument lists."""
  files, params = gin_args(args)
  where = ["--zone=%s" % args.zone, "--project=%s" % args.project]
  tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
  gin = (["--gin_file=%s" % f for f in files] +
         ["--gin_param=%s" % p for p in params])
  tpu_flags = ["--tpu=%s" % args.name, "--tpu_zone=%s" % args.zone,
               "--gcp_project=%s" % args.project,
               "--model_dir=%s" % args.model_dir]
  train = ["mtf_th", "train"] + tpu_flags + gin
  if args.train_steps:
    train.append("--train_steps=%d" % args.train_steps)
  evaluate = ["mtf_th", "eval"] + tpu_flags + gin + [
      "--checkpoint_steps=%s" % args.checkpoint_steps]
  install = ("rm -rf ~/mtf_talking_heads && mkdir ~/mtf_talking_heads && "
             "tar -xzf ~/mtf_talking_heads.tar.gz -C ~/mtf_talking_heads && "
             "cd ~/mtf_talking_heads && "
             "grep -v -E '^(tensorflow|tensorflow-cpu|tf-keras|libtpu)==' "
             "requirements.lock > /tmp/requirements.tpu && "
             "pip install --no-deps -r /tmp/requirements.tpu && "
             "pip install --no-deps -e .")
  home = "export PATH=$HOME/.local/bin:$PATH && cd ~/mtf_talking_heads && "
  out = [
      tpu + ["create", args.name] + where + [
          "--accelerator-type=%s" % args.accelerator,
          "--version=%s" % runtime_version(args.accelerator)],
      tpu + ["scp", tarball_path(args),
             "%s:~/mtf_talking_heads.tar.gz" % args.name,
             "--worker=all"] + where,
      tpu + ["ssh", args.name, "--worker=all"] + where + [
          "--command=%s" % install],
      tpu + ["ssh", args.name, "--worker=0"] + where + [
          "--command=%s" % (home + " ".join(shlex.quote(a) for a in train))],
      tpu + ["ssh", args.name, "--worker=0"] + where + [
          "--command=%s" % (home + " ".join(shlex.quote(a) for a in evaluate))],
  ]
  if args.delete:
    out.append(tpu + ["delete", args.name, "--quiet"] + where)
  return out


def preflight(args):
  """`mtf_th train`'s checks, here, on what train will parse on the slice.

  Raises:
    ValueError: with the check's message.
  """
  try:
    from mtf_talking_heads.core import compat  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (first: quiet, fixed imports)
    from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError("the pre-flight needs mtf_talking_heads importable "
                     "(run launch/tpu.py with the repository's "
                     ".venv/bin/python): %s" % e) from e
  files, params = gin_args(args)
  extra = (["utils.run.train_steps = %d" % args.train_steps]
           if args.train_steps else [])
  try:
    training.parse_gin(files, params, extra)
    training.preflight(tpu=args.name)
  except training.ConfigError as e:
    raise ValueError("pre-flight of mtf_th train for %s --parallelism %s: %s"
                     % (args.accelerator, args.parallelism, e)) from e
  from mtf_talking_heads.commands import vocabulary  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.estimate import fit_check  # pylint: disable=g-import-not-at-top
  line = fit_check.warning("launch/tpu.py", files, params,
                           hardware_of(args.accelerator),
                           devices_of(args.accelerator),
                           vocab=vocabulary.priced_vocab(files, params))
  if line:
    print(line, file=sys.stderr)


def _build_parser():
  parser = argparse.ArgumentParser(
      prog="launch/tpu.py", description=__doc__.splitlines()[0])
  parser.add_argument("--dry_run", action="store_true",
                      help="check, then print the commands; run nothing")
  parser.add_argument("--name", required=True, help="TPU VM name")
  parser.add_argument("--zone", required=True)
  parser.add_argument("--project", required=True)
  parser.add_argument("--accelerator", default="v3-8",
                      help="v2-8, v3-8, v3-32, v4-8, ...")
  parser.add_argument("--parallelism", default="model",
                      choices=sorted(LAYOUTS))
  parser.add_argument("--model_dir", required=True,
                      help="a gs:// directory (TPUs read and write GCS)")
  parser.add_argument("--experiment", required=True,
                      help="an experiment gin file (base scale)")
  parser.add_argument("--gin_file", action="append", default=[])
  parser.add_argument("--gin_param", action="append", default=[])
  parser.add_argument("--train_steps", type=int, default=None)
  parser.add_argument("--checkpoint_steps", default="all")
  parser.add_argument("--delete", action="store_true",
                      help="delete the slice at the end")
  return parser


def main(argv=None):
  parser = _build_parser()
  args = parser.parse_args(argv)
  try:
    if not args.model_dir.startswith("gs://"):
      raise ValueError("--model_dir must be a gs:// path (got %r): TPU "
                       "workers write checkpoints to Cloud Storage"
                       % args.model_dir)
    check_layout_choice(args)
    cmds = commands(args)
    preflight(args)
  except ValueError as e:
    print("%s: error: %s" % (parser.prog, e), file=sys.stderr)
    return 2
  print("%s: pre-flight passed; ships %s" % (parser.prog, ", ".join(SHIPPED)),
        file=sys.stderr)
  for i, cmd in enumerate(cmds):
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    if args.dry_run:
      continue
    if i == 1:  # the copy: pack what a worker needs
      pack(tarball_path(args))
    subprocess.run(cmd, check=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
