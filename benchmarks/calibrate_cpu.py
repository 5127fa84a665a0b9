"""Measures this machine's matmul FLOP/s and memory bandwidth for `mtf_th perf`.

  .venv/bin/python benchmarks/calibrate_cpu.py            # print the figures
  .venv/bin/python benchmarks/calibrate_cpu.py --write    # and store them

With TensorFlow (the library the training steps run on), float32, all
cores TensorFlow uses by default:

* matmul FLOP/s: a [N, N] x [N, N] tf.linalg.matmul (N = 2048 by default),
  2 N^3 FLOPs per call;
* memory bandwidth: y = x * a + b over a float32 vector of 64 M elements
  (256 MiB, far beyond any cache), one read and one write per element.

Each figure is the median of --repeats timed calls inside one compiled
tf.function (after a warm-up call), so Python overhead is not counted.
--write stores them, with the date, the CPU model, the core count and the
load average seen, in mtf_talking_heads/estimate/cpu_calibration.py, which
hardware.py reads for `--hardware cpu`.  The machine is shared: run it when
nothing else runs, or read the load average it records.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "mtf_talking_heads", "estimate", "cpu_calibration.py")

TEMPLATE = '''"""This machine's figures for `mtf_th perf --hardware cpu`.

Written by benchmarks/calibrate_cpu.py --write; do not edit by hand.
"""

CPU = {
    "matmul_flops": %(matmul_flops).4g,
    "memory_bytes_per_s": %(memory_bytes_per_s).4g,
    "measured": %(measured)r,
    "cpu": %(cpu)r,
    "cores": %(cores)d,
    "load_average": %(load_average)r,
    "command": "benchmarks/calibrate_cpu.py --write",
}
'''


def _cpu_model():
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _median_seconds(fn, repeats):
  fn()  # trace, compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn().numpy()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(n=2048, elements=64 * 2**20, repeats=7):
  """(matmul FLOP/s, memory bytes/s) measured with TensorFlow on this CPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  a = tf.random.uniform([n, n], dtype=tf.float32)
  b = tf.random.uniform([n, n], dtype=tf.float32)
  x = tf.random.uniform([elements], dtype=tf.float32)

  @tf.function
  def matmul():
    return tf.reduce_sum(tf.linalg.matmul(a, b)[0])

  @tf.function
  def stream():
    return (x * 1.0001 + 0.5)[-1]

  t_mm = _median_seconds(matmul, repeats)
  t_mem = _median_seconds(stream, repeats)
  return 2.0 * n ** 3 / t_mm, 2.0 * 4 * elements / t_mem


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=2048,
                      help="matmul size N (default 2048)")
  parser.add_argument("--elements", type=int, default=64 * 2**20,
                      help="float32 elements streamed (default 64 Mi)")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--write", action="store_true",
                      help="store the figures in %s" % OUTPUT)
  args = parser.parse_args(argv)
  for name in ("n", "elements", "repeats"):
    if getattr(args, name) <= 0:
      parser.error("--%s must be positive" % name)
  flops, bandwidth = measure(args.n, args.elements, args.repeats)
  info = dict(matmul_flops=flops, memory_bytes_per_s=bandwidth,
              measured=datetime.date.today().isoformat(), cpu=_cpu_model(),
              cores=os.cpu_count() or 1,
              load_average=tuple(round(x, 2) for x in os.getloadavg()))
  print("matmul %.1f GFLOP/s, memory %.2f GB/s (%s, %d cores, load %s)"
        % (flops / 1e9, bandwidth / 1e9, info["cpu"], info["cores"],
           info["load_average"]))
  if args.write:
    with open(OUTPUT, "w") as f:
      f.write(TEMPLATE % info)
    print("wrote %s" % OUTPUT)
  return 0


if __name__ == "__main__":
  sys.exit(main())
