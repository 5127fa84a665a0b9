"""The fused op alone at two or more revisions of its source, side by side.

  PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python benchmarks/fused_ab.py 6140d38 HEAD --rounds 31

For tuning nn/fused/fused_core.cc: each argument is a git revision (or a
path to a .cc file); its fused_core.cc is compiled like the package's
(build.plan's compiler and flags) with its ops renamed by a suffix, so all
load into one process.  At the t5.1.th.base attention (h_k = h = h_v = 24,
d_k = d_v = 32, n = m = 512, batch 1, the causal mask) it times, for
talking heads and multi-head, the forward op and the gradient op alone
(the gradient fed the forward's log-sum-exp from a variable, so it does not
rerun the forward), one of each per round, interleaved, and prints median
milliseconds and, per variant, the median over rounds of each revision's
time over the first's.  Before timing it checks every revision's O and
gradients against the first's (largest relative difference).
"""
import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn.fused import build

SOURCE = "mtf_talking_heads/nn/fused/fused_core.cc"
OPS = ("FusedAttentionCoreGrad", "FusedAttentionCore")
HEADS, LENGTH, DIM = 24, 512, 32


def source_of(revision):
  """The text of fused_core.cc at a git revision, or of a file."""
  if os.path.isfile(revision):
    with open(revision) as f:
      return f.read()
  return subprocess.run(["git", "show", "%s:%s" % (revision, SOURCE)],
                        check=True, capture_output=True, text=True).stdout


def compile_renamed(text, suffix, directory):
  """The op library of `text` with its ops renamed Op + suffix; returns the
  loaded module."""
  for op in OPS:  # the longer name first: the shorter is its prefix
    text = text.replace('"%s"' % op, '"%s%s"' % (op, suffix))
  digest = hashlib.sha256(text.encode()).hexdigest()[:16]
  source = os.path.join(directory, "%s_%s.cc" % (suffix, digest))
  library = source[:-3] + ".so"
  with open(source, "w") as f:
    f.write(text)
  _, command = build.plan()
  command = [source if part == build.SOURCE else
             library if part is None else part for part in command]
  subprocess.run(command, check=True, capture_output=True)
  return tf.load_op_library(library)


def _inputs(talking, rng):
  shape = [1, 1, HEADS, LENGTH, DIM]
  q, k = (tf.Variable(0.3 * rng.randn(*shape).astype(np.float32))
          for _ in range(2))
  v = tf.Variable(rng.randn(*shape).astype(np.float32))
  p = [tf.Variable(rng.randn(1, HEADS, HEADS).astype(np.float32) /
                   np.sqrt(HEADS)) if talking else tf.zeros([0])
       for _ in range(2)]
  causal = np.triu(np.full((LENGTH, LENGTH), -1e9, np.float32), 1)
  return [q, k, v] + p + [tf.constant(causal[None, None])]


def build_runs(modules, rng):
  """{(variant, op, index): (fetch, outputs to compare)}."""
  runs = {}
  for variant in ("TH", "MH"):
    talking = variant == "TH"
    x = _inputs(talking, rng)
    d_o = tf.Variable(rng.randn(1, 1, HEADS, LENGTH, DIM).astype(np.float32))
    attrs = dict(has_p_l=talking, has_p_w=talking, has_bias=True)
    with tf.Session() as session:  # the forward's statistics, once
      session.run(tf.global_variables_initializer())
      lse = session.run(modules[0].fused_attention_core_v0(
          *x, **attrs)[1])
    lse = tf.Variable(lse)
    for i, module in enumerate(modules):
      o, _ = getattr(module, "fused_attention_core_v%d" % i)(*x, **attrs)
      grads = getattr(module, "fused_attention_core_grad_v%d" % i)(
          *(x + [lse, d_o]), **attrs)[:5 if talking else 3]
      runs[variant, "forward", i] = (tf.reduce_sum(o), [o])
      runs[variant, "gradient", i] = (
          tf.add_n([tf.reduce_sum(g) for g in grads]), list(grads))
  return runs


TOLERANCE = 1e-5  # relative, as tests/nn/test_fused_op.py's


def check(session, runs, count):
  """Prints the largest relative difference of each revision's outputs from
  the first's, per variant; returns False if one is above TOLERANCE."""
  agree = True
  for variant in ("TH", "MH"):
    worst = 0.0
    for i in range(1, count):
      for op in ("forward", "gradient"):
        ref = session.run(runs[variant, op, 0][1])
        got = session.run(runs[variant, op, i][1])
        for a, b in zip(ref, got):
          worst = max(worst, float(np.max(np.abs(a - b)) /
                                   (np.max(np.abs(a)) + 1e-30)))
    print("%s: largest relative difference from the first: %.1e"
          % (variant, worst))
    agree = agree and worst <= TOLERANCE
  return agree


def timed(session, runs, rounds):
  keys = list(runs)
  for key in keys:
    session.run(runs[key][0])
  times = {key: [] for key in keys}
  for r in range(rounds):
    for key in keys if r % 2 == 0 else keys[::-1]:
      start = time.perf_counter()
      session.run(runs[key][0])
      times[key].append(time.perf_counter() - start)
  return times


def report(times, revisions):
  print("\n| variant | op | revision | median (ms) | / %s |" % revisions[0])
  print("|---|---|---|---:|---:|")
  for variant in ("TH", "MH"):
    for op in ("forward", "gradient"):
      base = times[variant, op, 0]
      for i, revision in enumerate(revisions):
        mine = times[variant, op, i]
        ratio = statistics.median(a / b for a, b in zip(mine, base))
        print("| %s | %s | %s | %.2f | %.3f |" % (
            variant, op, revision, 1e3 * statistics.median(mine), ratio))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("revisions", nargs="+",
                      help="git revisions (or .cc files); the first is the "
                      "reference")
  parser.add_argument("--rounds", type=int, default=21)
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error("--rounds takes a positive count")
  try:
    texts = [source_of(r) for r in args.revisions]
  except subprocess.CalledProcessError as e:
    parser.error("no %s at that revision: %s" % (SOURCE, e.stderr.strip()))
  tf.disable_eager_execution()
  with tempfile.TemporaryDirectory() as directory:
    modules = [compile_renamed(text, "V%d" % i, directory)
               for i, text in enumerate(texts)]
    runs = build_runs(modules, np.random.RandomState(0))
    config = tf.ConfigProto(inter_op_parallelism_threads=1)
    with tf.Session(config=config) as session:
      session.run(tf.global_variables_initializer())
      if not check(session, runs, len(modules)):
        print("fused_ab.py: the revisions disagree by more than %g; not "
              "timed" % TOLERANCE, file=sys.stderr)
        return 1
      report(timed(session, runs, args.rounds), args.revisions)
  return 0


if __name__ == "__main__":
  sys.exit(main())
