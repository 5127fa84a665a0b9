"""The embedded default corpus, and which corpus the th_* tasks read.

The default corpus is English prose taken from the Python standard library of
the interpreter that runs this code (see _stdlib_text.py for the exact rules):
the language-reference topics that ``help()`` shows, docstrings of the stdlib
(Python and C modules), full-line comment blocks and prose string literals.
It exists on every machine where the package installs, needs no download and
does not depend on what else is installed (the extraction runs in an isolated
``python -I -S`` subprocess that cannot see site-packages).

It is built once per Python build and cached under ``cache_dir()``:

  <cache>/corpus-v1-py3.11.7-<stdlib fingerprint>/
      train.txt        one document per line (UTF-8), ~98% of documents
      validation.txt   one document per line, ~2% of documents
      stats.json       sizes, per-source counts, sha256 of each file

A document goes to validation iff int(sha256(text)[:8], 16) % 1000 < 20, and
both files list documents sorted by sha256(text) (a fixed pseudo-random
order, so neighbouring lines come from different modules).  Two builds from
the same stdlib give byte-identical files.  The cache key includes the Python
version and a fingerprint of the stdlib file list (names and sizes), so a
different stdlib never reuses a stale cache.  Files are written atomically
(temporary directory + os.rename), so concurrent builds are safe.
"""
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import gin

from mtf_talking_heads.core import cache_paths
from mtf_talking_heads.data import _stdlib_text

CORPUS_VERSION = 1
# A document is in the validation split iff its hash bucket (of 1000) is below
# this: ~2% of documents.
VALIDATION_PER_MILLE = 20
SPLITS = ("train", "validation")


cache_dir = cache_paths.cache_dir  # $MTF_TH_CACHE, else ~/.cache/mtf_talking_heads


_KEY_MEMO = {}


def corpus_key():
  """Names this Python build's corpus: version + stdlib fingerprint."""
  memo_key = (sys.version, _stdlib_text.stdlib_dir())
  if memo_key not in _KEY_MEMO:
    v = sys.version_info
    _KEY_MEMO[memo_key] = "corpus-v%d-py%d.%d.%d-%s" % (
        CORPUS_VERSION, v.major, v.minor, v.micro,
        _stdlib_text.fingerprint()[:12])
  return _KEY_MEMO[memo_key]


def default_corpus_dir():
  return os.path.join(cache_dir(), corpus_key())


@contextlib.contextmanager
def file_lock(path):
  """An exclusive advisory lock (no-op where fcntl is missing)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    import fcntl  # pylint: disable=g-import-not-at-top
  except ImportError:
    yield
    return
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def extract_documents():
  """[(kind, text)] from the stdlib, via an isolated subprocess.

  ``python -I -S`` keeps site-packages and PYTHON* variables out; if the
  subprocess cannot run (e.g. an embedded interpreter), the same code runs
  in-process.
  """
  script = os.path.abspath(_stdlib_text.__file__)
  if script.endswith((".pyc", ".pyo")):
    script = script[:-1]
  fd, out = tempfile.mkstemp(prefix="mtf_th_corpus_", suffix=".jsonl")
  os.close(fd)
  try:
    ok = False
    if sys.executable and os.path.exists(script):
      proc = subprocess.run([sys.executable, "-I", "-S", script, out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            check=False)
      ok = proc.returncode == 0
    if ok:
      with open(out, encoding="utf-8") as f:
        return [tuple(json.loads(line)) for line in f]
    return _stdlib_text.documents()
  finally:
    if os.path.exists(out):
      os.remove(out)


def _split_of_digest(hexdigest):
  return ("validation" if int(hexdigest[:8], 16) % 1000 < VALIDATION_PER_MILLE
          else "train")


def split_of(text):
  """'validation' for ~2% of documents (by sha256 of the text), else 'train'."""
  return _split_of_digest(hashlib.sha256(text.encode("utf-8")).hexdigest())


def _write_atomic(path, data):
  tmp = path + ".tmp%d" % os.getpid()
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def build_corpus(out_dir, final_dir=None):
  """Builds the default corpus into out_dir; returns its stats dict.

  Writes train.txt, validation.txt and (last) stats.json; each file is
  written to a temporary name first and moved into place.  final_dir: where
  out_dir will be moved to (recorded in stats["paths"]); default out_dir.
  """
  start = time.time()
  docs = extract_documents()
  keyed = sorted((hashlib.sha256(t.encode("utf-8")).hexdigest(), kind, t)
                 for kind, t in docs)
  by_split = {s: [] for s in SPLITS}
  sources = {}
  for digest, kind, text in keyed:
    split = _split_of_digest(digest)
    by_split[split].append(text)
    src = sources.setdefault(kind, {"documents": 0, "bytes": 0})
    src["documents"] += 1
    src["bytes"] += len(text.encode("utf-8")) + 1
  os.makedirs(out_dir, exist_ok=True)
  stats = {
      "corpus_version": CORPUS_VERSION,
      "python": sys.version.split()[0],
      "stdlib": _stdlib_text.stdlib_dir(),
      "stdlib_fingerprint": _stdlib_text.fingerprint(),
      "validation_per_mille": VALIDATION_PER_MILLE,
      "sources": {k: sources[k] for k in sorted(sources)},
      "documents": {}, "bytes": {}, "sha256": {}, "paths": {},
  }
  for split in SPLITS:
    data = "".join(t + "\n" for t in by_split[split]).encode("utf-8")
    path = os.path.join(out_dir, split + ".txt")
    _write_atomic(path, data)
    stats["documents"][split] = len(by_split[split])
    stats["bytes"][split] = len(data)
    stats["sha256"][split] = hashlib.sha256(data).hexdigest()
    stats["paths"][split] = os.path.join(final_dir or out_dir, split + ".txt")
  stats["total_bytes"] = sum(stats["bytes"].values())
  stats["ascii_fraction"] = _ascii_fraction(by_split)
  stats["build_seconds"] = round(time.time() - start, 2)
  _write_atomic(os.path.join(out_dir, "stats.json"),
                json.dumps(stats, indent=1, sort_keys=True).encode("utf-8"))
  return stats


def _ascii_fraction(by_split):
  total = ascii_chars = 0
  for texts in by_split.values():
    for t in texts:
      total += len(t)
      ascii_chars += len(t.encode("ascii", "ignore"))
  return round(ascii_chars / max(total, 1), 6)


def _complete(path):
  return all(os.path.exists(os.path.join(path, f))
             for f in ("train.txt", "validation.txt", "stats.json"))


def ensure_default_corpus():
  """Builds the cached default corpus if needed; returns its directory."""
  final = default_corpus_dir()
  if _complete(final):
    return final
  root = os.path.dirname(final)
  with file_lock(os.path.join(root, ".corpus.lock")):
    if _complete(final):  # built by another process meanwhile
      return final
    tmp = tempfile.mkdtemp(prefix=".tmp-corpus-", dir=root)
    try:
      build_corpus(tmp, final_dir=final)
      if os.path.isdir(final):  # an incomplete leftover: replace it
        _rmtree(final)
      os.rename(tmp, final)
    finally:
      if os.path.isdir(tmp):
        _rmtree(tmp)
  return final


def _rmtree(path):
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(path, ignore_errors=True)


def default_corpus_paths():
  """{"train": path, "validation": path} of the embedded corpus (built lazily).

  Text files, UTF-8, one document per line.
  """
  d = ensure_default_corpus()
  return {s: os.path.join(d, s + ".txt") for s in SPLITS}


def stats():
  """The stats dict of the embedded corpus (see build_corpus), building it if needed."""
  with open(os.path.join(ensure_default_corpus(), "stats.json"), encoding="utf-8") as f:
    return json.load(f)


# ------------------------------------------------------------------ user data

TEXT = "text"
TFRECORD = "tfrecord"
FILE_FORMATS = ("auto", TEXT, TFRECORD)


@gin.configurable(module="th_data")
def corpus_paths(train=None, validation=None, file_format="auto"):
  """Which corpus the th_* tasks read (gin: th_data.corpus_paths.*).

  Leave both paths unset for the embedded default corpus.  Otherwise set both:
  each a path, a glob pattern or a list of them, to either
    * text files: one document per line (plain wrapped text works too: every
      non-empty line becomes a document, and the objectives concatenate
      documents before cutting them into sequences), or
    * TFRecord files of tf.train.Example protos with a bytes feature "text".
  file_format: "auto" (TFRecord iff every file name contains ".tfrecord"),
    "text" or "tfrecord".

  Read when a th_* task first builds a dataset (after gin files are parsed),
  not at import.

  Returns:
    dict with keys train, validation, file_format (unvalidated; see
    resolve_corpus).
  """
  return {"train": train, "validation": validation, "file_format": file_format}


def _as_list(paths):
  if isinstance(paths, (list, tuple)):
    return list(paths)
  return [paths]


def check_paths(paths, param):
  """Expands a path/glob/list; raises ValueError naming `param` if unusable.

  Unusable: None, "", a pattern matching no file, or files all empty.

  Returns:
    sorted list of existing files.
  """
  if paths is None or (isinstance(paths, str) and not paths.strip()) or (
      isinstance(paths, (list, tuple)) and not paths):
    raise ValueError(
        "%s is %s: give a text or TFRecord file (path or glob pattern)."
        % (param, "not set" if paths is None else "empty (%r)" % (paths,)))
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  files = []
  for p in _as_list(paths):
    if not isinstance(p, str) or not p.strip():
      raise ValueError("%s contains an empty path: %r" % (param, paths))
    matched = sorted(tf.io.gfile.glob(p))
    if not matched:
      raise ValueError("%s=%r: no file matches %r." % (param, paths, p))
    files.extend(matched)
  if all(tf.io.gfile.stat(f).length == 0 for f in files):
    raise ValueError("%s=%r: the file(s) are empty." % (param, paths))
  return files


def detect_format(files, file_format="auto", param="file_format"):
  if file_format not in FILE_FORMATS:
    raise ValueError("%s must be one of %s, got %r" % (param, FILE_FORMATS, file_format))
  if file_format != "auto":
    return file_format
  if all(".tfrecord" in os.path.basename(f) for f in files):
    return TFRECORD
  return TEXT


def resolve_corpus(train=None, validation=None, file_format="auto",
                   names=("train", "validation"), prefix=""):
  """Validates user corpus paths; None for both means the embedded corpus.

  Args:
    train, validation: path, glob or list (see corpus_paths), or both None.
    file_format: "auto", "text" or "tfrecord".
    names: parameter names used in error messages.
    prefix: prefix of the names in error messages (e.g. "th_data.corpus_paths.").
  Returns:
    dict(train=[files], validation=[files], file_format="text"|"tfrecord",
         default=bool)
  Raises:
    ValueError: naming the parameter that is missing, empty or unusable.
  """
  if train is None and validation is None:
    paths = default_corpus_paths()
    return {"train": [paths["train"]], "validation": [paths["validation"]],
            "file_format": TEXT, "default": True}
  out = {"default": False}
  for split, value, name in (("train", train, names[0]),
                             ("validation", validation, names[1])):
    out[split] = check_paths(value, prefix + name)
  out["file_format"] = detect_format(out["train"] + out["validation"],
                                     file_format, prefix + "file_format")
  return out


def configured_corpus():
  """The corpus the gin-configured th_* tasks read (see corpus_paths)."""
  cfg = corpus_paths()
  return resolve_corpus(cfg["train"], cfg["validation"], cfg["file_format"],
                        prefix="th_data.corpus_paths.")
