#!/usr/bin/env python3
"""Train and evaluate one experiment on a Cloud TPU VM slice (gcloud).

  launch/tpu.py --dry_run --name th-exp --zone europe-west4-a \\
      --project my-project --accelerator v3-32 --parallelism model \\
      --model_dir gs://my-bucket/runs/th24 \\
      --experiment experiments/t5_heads/07_talking_heads_24_32.gin

Prints (--dry_run) or runs, in order: create the TPU VM slice, copy this
checkout to every worker, install the pinned Python packages there (the
image's TPU build of TensorFlow 2.15 is kept), train, evaluate, and (with
--delete) delete the slice.  The mesh follows the slice: v2/v3-N have N
TensorCores, v4-N has N/2 devices (megacore);
  --parallelism model   mesh_shape = 'model:<devices>'  (heads, d_ff, vocab split)
  --parallelism batch   mesh_shape = 'batch:<devices>'  (data parallel)
  --parallelism mixed   mesh_shape = 'batch:<devices/8>,model:8'
The split dims must divide (e.g. 24 heads on model:8, not model:32):
mtf_th checks this before it builds anything.  Activations are bfloat16 on
TPU.  Uses TPUEstimator, so the slice needs a TF 2.15 StreamExecutor
("-se") runtime image.  Only Python's standard library is needed here.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {
    "model": "heads:model,d_ff:model,vocab:model",
    "batch": "batch:batch",
    "mixed": "batch:batch,heads:model,d_ff:model,vocab:model",
}


def devices_of(accelerator):
  """Number of mesh devices of an accelerator type such as v3-32."""
  match = re.fullmatch(r"v(\d)[a-z]*-(\d+)", accelerator or "")
  if not match:
    raise ValueError("--accelerator must look like v3-8 or v3-32, got %r"
                     % accelerator)
  generation, cores = int(match.group(1)), int(match.group(2))
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


def runtime_version(accelerator):
  single_host = devices_of(accelerator) <= 8
  return "tpu-vm-tf-2.15.0-se" if single_host else "tpu-vm-tf-2.15.0-pod-se"


def commands(args):
  """The gcloud commands, as argument lists."""
  mesh, layout = mesh_for(args.accelerator, args.parallelism)
  where = ["--zone=%s" % args.zone, "--project=%s" % args.project]
  tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
  gin = ["--gin_file=%s" % f for f in [args.experiment] + args.gin_file]
  gin += ["--gin_param=%s" % p for p in [
      'mesh_shape = "%s"' % mesh, 'layout = "%s"' % layout,
      'activation_dtype = "bfloat16"'] + args.gin_param]
  tpu_flags = ["--tpu=%s" % args.name, "--tpu_zone=%s" % args.zone,
               "--gcp_project=%s" % args.project,
               "--model_dir=%s" % args.model_dir]
  train = ["mtf_th", "train"] + tpu_flags + gin
  if args.train_steps:
    train.append("--train_steps=%d" % args.train_steps)
  evaluate = ["mtf_th", "eval"] + tpu_flags + gin + [
      "--checkpoint_steps=%s" % args.checkpoint_steps]
  install = ("cd ~/mtf_talking_heads && "
             "grep -v -E '^(tensorflow|tensorflow-cpu|tf-keras|libtpu)==' "
             "requirements.lock > /tmp/requirements.tpu && "
             "pip install --no-deps -r /tmp/requirements.tpu && "
             "pip install --no-deps -e .")
  home = "export PATH=$HOME/.local/bin:$PATH && cd ~/mtf_talking_heads && "
  out = [
      tpu + ["create", args.name] + where + [
          "--accelerator-type=%s" % args.accelerator,
          "--version=%s" % runtime_version(args.accelerator)],
      tpu + ["scp", "--recurse", REPO, "%s:~/mtf_talking_heads" % args.name,
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


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="launch/tpu.py", description=__doc__.splitlines()[0])
  parser.add_argument("--dry_run", action="store_true",
                      help="print the commands, run nothing")
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
  args = parser.parse_args(argv)
  try:
    cmds = commands(args)
  except ValueError as e:
    parser.error(str(e))
  if not args.model_dir.startswith("gs://"):
    parser.error("--model_dir must be a gs:// path (got %r): TPU workers "
                 "write checkpoints to Cloud Storage" % args.model_dir)
  for cmd in cmds:
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    if not args.dry_run:
      subprocess.run(cmd, check=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
