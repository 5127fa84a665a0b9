"""Extracts English prose from the Python standard library (stdlib only).

This file imports nothing outside the standard library, so it can run as a
script in an isolated interpreter (``python -I -S _stdlib_text.py OUT``): with
``-S`` site-packages is not even on sys.path, so the text cannot depend on what
else is installed.  corpus.py runs it that way and turns its output into the
train/validation files.

Sources, in this (deterministic) order:
  1. ``pydoc_data.topics``: the Python language reference topics that
     ``help()`` shows, one unit per topic (sorted by topic name);
  2. docstrings of built-in and ``lib-dynload`` extension modules (C code, so
     they can only be read by importing; a small deny list skips modules with
     side effects and test-only modules), sorted by module name;
  3. every ``.py`` file under the stdlib directory, files sorted by relative
     path, never imported or executed: read by a small regex tokenizer
     (source_texts) that yields its docstrings, its full-line comment blocks
     and its other str literals (messages, help texts), in source order.
     The ``test`` package is included when the Python build ships it.
     Skipped: site-packages, pydoc_data (source 1), and packages that
     distributions split into separate OS packages (tkinter, idlelib,
     turtledemo, lib2to3, distutils, ensurepip), so the corpus is more alike
     across builds.

Every text is split into paragraphs (blank lines), code-like paragraphs are
dropped (see clean_paragraph), typographic quotes and dashes become ASCII,
whitespace is collapsed to single spaces, and paragraphs already seen (exact
text) are dropped.  The kept paragraphs of one source unit (a topic, a
docstring, a comment block, a string) form one document.  The output does not
depend on the number of worker processes.
"""
import ast
import hashlib
import importlib
import inspect
import io
import json
import os
import re
import sys
import sysconfig
import tokenize

# Bump when the extraction rules change: it is part of the cache key.
EXTRACTOR_VERSION = 1

_SKIP_TOP = frozenset([
    "site-packages", "dist-packages", "__pycache__", "idlelib", "tkinter",
    "turtledemo", "lib2to3", "distutils", "ensurepip", "lib-dynload",
    "pydoc_data",  # read as topics (source 1)
])
_SKIP_C_MODULES = frozenset([
    "_tkinter", "readline", "_curses", "_curses_panel", "antigravity", "this",
    "_ctypes_test", "xxsubtype", "_xxsubinterpreters", "_xxinterpchannels",
])
_SKIP_C_PREFIXES = ("_test", "xx", "_xx")

_WS = re.compile(r"\s+")
_FUNCTION_WORDS = (
    "the a an is are was be been to of and in it its this that these for with "
    "as or not by on if from at which when then than can may will should must "
    "no all any each one other only also but so such there used").split()
# Whole space-separated words (the text has single spaces only).
_PLAIN_WORD = re.compile(
    r"(?<![^ ])[(\"']?[A-Za-z][a-z]*(?:'[a-z]+)?[.,;:!?)\"']*(?![^ ])")
_FUNCTION_WORD = re.compile(
    r"(?<![^ ])[(]?(?:%s)[.,;:()]*(?![^ ])" % "|".join(_FUNCTION_WORDS))
_BAD_CHARS = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffd]")


_STDLIB_DIR = []


def stdlib_dir():
  if not _STDLIB_DIR:
    _STDLIB_DIR.append(sysconfig.get_paths()["stdlib"])
  return _STDLIB_DIR[0]


def python_files(root=None):
  """Sorted relative paths of the stdlib .py files the corpus reads."""
  root = root or stdlib_dir()
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    parts = [] if rel == "." else rel.split(os.sep)
    if parts and (parts[0] in _SKIP_TOP or "__pycache__" in parts):
      dirnames[:] = []
      continue
    dirnames.sort()
    for name in sorted(filenames):
      if name.endswith(".py"):
        out.append(os.path.join(rel, name) if parts else name)
  return sorted(out)


def c_module_names():
  """Sorted names of built-in and lib-dynload extension modules we read."""
  names = set(sys.builtin_module_names)
  dynload = os.path.join(stdlib_dir(), "lib-dynload")
  if os.path.isdir(dynload):
    for name in os.listdir(dynload):
      if name.endswith((".so", ".pyd")):
        names.add(name.split(".")[0])
  return sorted(n for n in names
                if n not in _SKIP_C_MODULES and not n.startswith(_SKIP_C_PREFIXES)
                and n not in ("__main__",))


def fingerprint():
  """A digest of everything the corpus depends on (cheap: stats, no reads)."""
  root = stdlib_dir()
  h = hashlib.sha256()
  h.update(("v%d|%s|%s|" % (EXTRACTOR_VERSION, sys.version, sys.platform)).encode())
  for rel in python_files(root) + [os.path.join("pydoc_data", "topics.py")]:
    path = os.path.join(root, rel)
    size = os.path.getsize(path) if os.path.exists(path) else -1
    h.update(("%s:%d|" % (rel, size)).encode())
  for name in c_module_names():
    h.update(("c:%s|" % name).encode())
  return h.hexdigest()


_ASCII_PUNCT = {
    0x2018: "'", 0x2019: "'", 0x201c: '"', 0x201d: '"', 0x2013: "-",
    0x2014: "--", 0x2026: "...", 0x00a0: " ", 0x2212: "-",
}


def clean_paragraph(lines):
  """Returns one normalised line of prose, or None for code-like text.

  Kept: at least 30 characters and 6 words, at most 5% non-ASCII, no control
  characters, at least 70% plain words (letters with optional surrounding
  punctuation), at least 12% (and 2) English function words, no doctest or
  shell prompts.
  """
  stripped = [l.strip() for l in lines]
  if any(l.startswith((">>>", "... ", "$ ", "%")) for l in stripped):
    return None
  text = _WS.sub(" ", " ".join(stripped).translate(_ASCII_PUNCT)).strip()
  if len(text) < 30:
    return None
  n_words = text.count(" ") + 1
  if n_words < 6:
    return None
  if len(text) - len(text.encode("ascii", "ignore")) > 0.05 * len(text):
    return None
  if _BAD_CHARS.search(text):  # control characters, lone surrogates
    return None
  if len(_PLAIN_WORD.findall(text)) < 0.7 * n_words:
    return None
  if len(_FUNCTION_WORD.findall(text.lower())) < max(2, 0.12 * n_words):
    return None
  return text


def paragraphs(text):
  """Splits text on blank lines into lists of lines."""
  out, cur = [], []
  for line in text.splitlines():
    if line.strip():
      cur.append(line)
    elif cur:
      out.append(cur)
      cur = []
  if cur:
    out.append(cur)
  return out


def topic_texts():
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  for key in sorted(topics.topics):
    yield "topics", topics.topics[key]


def _c_docstrings(name):
  module = importlib.import_module(name)
  yield module.__doc__
  for key in sorted(vars(module)):
    if key.startswith("__"):
      continue
    value = getattr(module, key)
    if not (inspect.isroutine(value) or inspect.isclass(value)):
      continue
    if inspect.isclass(value) and getattr(value, "__module__", None) != name:
      continue
    yield getattr(value, "__doc__", None)
    if inspect.isclass(value):
      for attr in sorted(vars(value)):
        if attr.startswith("__") and attr != "__init__":
          continue
        yield getattr(vars(value)[attr], "__doc__", None)


def c_module_texts():
  for name in c_module_names():
    try:
      docs = list(_c_docstrings(name))
    except Exception:  # pylint: disable=broad-except
      continue
    for doc in docs:
      if isinstance(doc, str) and doc.strip():
        yield "c_docstrings", inspect.cleandoc(doc)


# One token per match: comments, str literals, newlines, whitespace and runs
# of other code (brackets are counted).  Enough to find docstrings (a string
# literal that is a whole statement, first after a line ending in ':' at
# bracket depth 0, or first in the file), full-line comments and other string
# literals ~20x faster than ast.parse.  On CPython 3.11.7's stdlib it finds
# the same docstrings as ast.get_docstring except 24 of 8771 (and 3 extra).
# It never executes or imports the file.
_TOKEN = re.compile(r'''
 (?P<com>\#[^\n]*)
|(?P<str>[rRbBuUfF]{0,2}(?:"""(?:\\.|[^\\])*?"""|\'\'\'(?:\\.|[^\\])*?\'\'\'
                        |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
|(?P<nl>\n)
|(?P<ws>[ \t\r\f]+|\\\r?\n)
|(?P<other>(?:[^\n\#"'rRbBuUfF]|[rRbBuUfF](?![rRbBuUfF]?["']))+)
''', re.S | re.X)


def _literal_text(literal):
  """The value of a str literal; None for bytes, f-strings and bad literals."""
  prefix = re.match(r"[A-Za-z]*", literal).group().lower()
  if "b" in prefix or "f" in prefix:
    return None
  if "\\" not in literal:  # fast path: no escapes, so the text is the value
    q = 3 if literal[len(prefix):len(prefix) + 3] in ('"""', "'''") else 1
    return literal[len(prefix) + q:len(literal) - q]
  try:
    value = ast.literal_eval(literal)
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return None
  return value if isinstance(value, str) else None


def source_texts(text):
  """(kind, text) pairs of one source text, in source order.

  kinds: "docstrings" (a string literal that is a whole statement, first after
  a ':' at bracket depth 0 or first in the file; cleaned like
  inspect.cleandoc), "comments" (blocks of consecutive lines holding only a
  comment) and "strings" (every other str literal, implicit concatenations
  merged: messages, help texts).  bytes and f-strings are skipped.
  """
  out = []
  depth = 0
  at_start = True      # no token yet on this logical line
  prev_colon = True    # previous logical line ended with ':' (or file start)
  line_empty = True    # no token at all on this physical line
  run = []             # consecutive string literals (implicit concatenation)
  run_is_doc = [False]
  block = []

  def flush_block():
    if block:
      out.append(("comments", "\n".join(block)))
      del block[:]

  def flush_run(statement_end):
    if not run:
      return
    is_doc = statement_end and run_is_doc[0] and len(run) == 1
    if not is_doc and sum(len(lit) for lit in run) < 32:
      del run[:]  # too short to hold a 30-character paragraph
      return
    parts = [_literal_text(lit) for lit in run]
    del run[:]
    value = "".join(p for p in parts if p)
    if value.strip():
      if is_doc:
        out.append(("docstrings", inspect.cleandoc(value)))
      else:
        out.append(("strings", value))

  continued = False    # the last code token ended with a backslash
  for m in _TOKEN.finditer(text):
    kind = m.lastgroup
    if kind == "ws":
      continue
    if kind == "com":
      if line_empty and depth == 0:
        body = m.group()[1:]
        if not (body.startswith("!") or ("-*-" in body and "coding" in body)):
          block.append(body.lstrip("#"))
      line_empty = False
      continue
    if kind == "nl":
      if line_empty:
        flush_block()   # blank line
      line_empty = True
      if continued:
        continued = False
      elif depth == 0:
        flush_run(statement_end=True)
        at_start = True
      continue
    flush_block()
    line_empty = False
    if kind == "str":
      if not run:
        run_is_doc[0] = at_start and prev_colon and depth == 0
      run.append(m.group())
      prev_colon = False
      continued = False
    else:  # other code: brackets, ':' and everything else up to a quote or '#'
      flush_run(statement_end=False)
      t = m.group().rstrip(" \t\r\f")
      depth += (t.count("(") + t.count("[") + t.count("{")
                - t.count(")") - t.count("]") - t.count("}"))
      depth = max(depth, 0)
      prev_colon = depth == 0 and t.endswith(":")
      continued = t.endswith("\\")
    at_start = False
  flush_block()
  flush_run(statement_end=True)
  return out


def file_texts(path):
  """(kind, text) pairs of one .py file (see source_texts)."""
  with open(path, "rb") as f:
    src = f.read()
  try:
    encoding = tokenize.detect_encoding(io.BytesIO(src).readline)[0]
    text = src.decode(encoding, "replace")
  except (SyntaxError, LookupError):
    text = src.decode("utf-8", "replace")
  return source_texts(text)


def clean_unit(text):
  """The kept, normalised paragraphs of one source unit (a list of str)."""
  kept = []
  for para in paragraphs(text):
    clean = clean_paragraph(para)
    if clean is not None:
      kept.append(clean)
  return kept


def _file_units_worker(args):
  root, rel = args
  out = []
  for kind, text in file_texts(os.path.join(root, rel)):
    kept = clean_unit(text)
    if kept:
      out.append((kind, kept))
  return out


def iter_units(processes=None):
  """All (kind, [clean paragraphs]) source units, in the documented order.

  Files are processed by a process pool (results keep file order), so the
  output does not depend on the number of processes.
  """
  for kind, text in list(topic_texts()) + list(c_module_texts()):
    kept = clean_unit(text)
    if kept:
      yield kind, kept
  root = stdlib_dir()
  jobs = [(root, rel) for rel in python_files(root)]
  processes = processes or min(os.cpu_count() or 1, 8)
  results = None
  if processes > 1:
    try:
      import concurrent.futures  # pylint: disable=g-import-not-at-top
      with concurrent.futures.ProcessPoolExecutor(processes) as pool:
        results = list(pool.map(_file_units_worker, jobs, chunksize=8))
    except Exception:  # pylint: disable=broad-except
      results = None
  if results is None:
    results = [_file_units_worker(j) for j in jobs]
  for units in results:
    for unit in units:
      yield unit


def documents(processes=None):
  """Deduplicated documents: list of (kind, one-line text), in source order.

  A paragraph seen before (exact text, anywhere earlier) is dropped; the
  remaining paragraphs of a unit are joined by single spaces.
  """
  seen = set()
  docs = []
  for kind, paras in iter_units(processes):
    kept = []
    for para in paras:
      if para in seen:
        continue
      seen.add(para)
      kept.append(para)
    if kept:
      docs.append((kind, " ".join(kept)))
  return docs


def main(argv):
  out_path = argv[1]
  docs = documents()
  tmp = out_path + ".part"
  with open(tmp, "w", encoding="utf-8") as f:
    for kind, text in docs:
      f.write(json.dumps([kind, text]) + "\n")
  os.replace(tmp, out_path)


if __name__ == "__main__":
  main(sys.argv)
