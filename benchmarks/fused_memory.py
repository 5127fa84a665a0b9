"""Peak memory of a talking-heads training step: the fused core vs einsums.

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/fused_memory.py

A one-layer decoder-only LM with the t5.1.th.base attention (talking heads,
h_k = h = h_v = 24, d_k = d_v = 32; d_model 768, d_ff 3072, vocabulary 128,
Adafactor) takes one training step (measure/memory_measure.py's StepGraph:
forward, backward and update in one session.run, ops one at a time, one
logical CPU device) at n = 512, 1024, 2048, 4096 with batch 1, with the
einsum core and with the fused core (mtf_th.core_kernel.kind,
nn/core_kernel.py), each row in a fresh process.  Measured: TensorFlow's
allocator peak of the step plus the variables (memory_measure.measure);
predicted: memory.predict(..., kernel=...), with the n x m x heads (einsum)
or statistics-and-mask (fused) bytes it keeps, its `core`.  Then one step
at n = 4096 with batch --big_batch (4): memory.predict for both kernels
against this machine's usable RAM (planner.usable_bytes: 90% of it); the
fused step is run and measured, the einsum one only if predicted to fit.
No row predicted above --max_gib (default: the usable RAM) is run.
"""
import argparse
import json
import subprocess
import sys

from mtf_talking_heads.estimate import memory
from mtf_talking_heads.estimate import planner

LENGTHS = (512, 1024, 2048, 4096)
KERNELS = ("einsum", "fused")
MODEL = dict(variant="talking_heads", heads=24, d_k=32, num_layers=1,
             d_model=768, d_ff=3072, vocab=128, mesh_shape="batch:1")
GiB = memory.GiB


def config(kernel, length, batch):
  """The memory_measure.MeasureConfig of one row (imports TensorFlow)."""
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  return memory_measure.MeasureConfig(length=length, batch=batch,
                                      kernel=kernel, **MODEL)


def predicted(kernel, length, batch):
  """memory.predict's dict for a row, without TensorFlow."""
  from mtf_talking_heads.estimate import model as model_lib  # pylint: disable=g-import-not-at-top
  att = model_lib.make_attention("talking_heads", MODEL["heads"],
                                 MODEL["d_k"], heads_k=MODEL["heads"],
                                 heads_v=MODEL["heads"])
  model = model_lib.make_model(
      "lm", MODEL["num_layers"], MODEL["d_model"], MODEL["d_ff"],
      MODEL["vocab"], batch, length, length, dec_self=att,
      relative_bias=False)
  return memory.predict(model, MODEL["mesh_shape"], "mtf_th_float32",
                        kernel=kernel, threads=1)  # memory_measure.THREADS


def measure_row(kernel, length, batch):
  """Runs in a child process: prints {"measured": bytes} as JSON."""
  from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
  compat.split_cpu(1)
  from mtf_talking_heads.measure import memory_measure  # pylint: disable=g-import-not-at-top
  result = memory_measure.measure(config(kernel, length, batch))
  print(json.dumps({"measured": result["peak_bytes"]}))


def in_process(kernel, length, batch):
  """The measured peak of one row, in a fresh process (bytes)."""
  argv = [sys.executable, __file__, "--row", "%s,%d,%d" % (kernel, length,
                                                          batch)]
  proc = subprocess.run(argv, capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit("benchmarks/fused_memory.py: the %s row n=%d batch=%d "
                     "failed: %s" % (kernel, length, batch,
                                     proc.stderr.strip().splitlines()[-1:]))
  return json.loads(proc.stdout.strip().splitlines()[-1])["measured"]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                      help="comma-separated sequence lengths (batch 1)")
  parser.add_argument("--big_batch", type=int, default=4,
                      help="the batch of the n = 4096 step einsum cannot fit")
  parser.add_argument("--max_gib", type=float, default=None,
                      help="run no row predicted above this (default: the "
                      "machine's usable RAM)")
  parser.add_argument("--row", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.row:
    kernel, length, batch = args.row.split(",")
    measure_row(kernel, int(length), int(batch))
    return 0
  usable = planner.usable_bytes("cpu", 1)
  limit = usable if args.max_gib is None else args.max_gib * GiB
  lengths = [int(n) for n in args.lengths.split(",")]
  rows = [(k, n, 1) for n in lengths for k in KERNELS]
  rows += [(k, 4096, args.big_batch) for k in KERNELS]
  print("usable RAM (90%% of this machine's): %.2f GiB; rows predicted above "
        "%.2f GiB are not run\n" % (usable / GiB, limit / GiB))
  print("| kernel | n | batch | measured GiB | predicted GiB | ratio | "
        "predicted core GiB |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for kernel, length, batch in rows:
    p = predicted(kernel, length, batch)
    measured = None
    if p["total"] <= limit:
      measured = in_process(kernel, length, batch)
    print("| %s | %d | %d | %s | %.3f | %s | %.3f |" % (
        kernel, length, batch,
        "-" if measured is None else "%.3f" % (measured / GiB),
        p["total"] / GiB,
        "-" if measured is None else "%.3f" % (p["total"] / measured),
        p["core"] / GiB), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
