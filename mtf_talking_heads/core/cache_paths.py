"""Where the package caches its corpus, vocabulary and compiled ops (stdlib only).

corpus.py builds the corpus and vocabulary there, nn/fused/build.py the
fused attention core's op library (under ops_dir()); the `mtf_th` commands
check the place before TensorFlow is imported (commands/prechecks.py).
"""
import glob
import os
import sys


def cache_dir():
  """Root of all caches: $MTF_TH_CACHE, else ~/.cache/mtf_talking_heads.

  $XDG_CACHE_HOME replaces ~/.cache when set.  Read at every call, so tests
  (and users) can switch it with the environment variable.
  """
  path = os.environ.get("MTF_TH_CACHE")
  if not path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "mtf_talking_heads")
  return os.path.abspath(path)


def ops_dir():
  """Where compiled op libraries go (nn/fused/build.py): $MTF_TH_OPS_DIR,
  else <cache_dir()>/ops.

  Outside the checkout, so git never sees a .so; each library's name carries
  a hash of what built it, so a stale one is never loaded.  $MTF_TH_OPS_DIR
  lets a process with a cache of its own (a test's MTF_TH_CACHE) share the
  library already built.
  """
  return os.path.abspath(os.environ.get("MTF_TH_OPS_DIR") or
                         os.path.join(cache_dir(), "ops"))


def has_built_data(root):
  """True when `root` holds a complete corpus of this Python and a
  vocabulary (what the first run on the embedded corpus writes)."""
  v = sys.version_info
  corpora = glob.glob(os.path.join(
      root, "corpus-v*-py%d.%d.%d-*" % (v.major, v.minor, v.micro)))
  complete = [c for c in corpora if all(
      os.path.exists(os.path.join(c, f))
      for f in ("train.txt", "validation.txt", "stats.json"))]
  return bool(complete) and bool(
      glob.glob(os.path.join(root, "vocab", "*.model")))
