"""A run's files: the train log, the eval table and the checkpoints listed.

Files other commands read (keep the formats exactly):

  <model_dir>/train_log.csv     step,loss,steps_per_sec,elapsed_sec
      one row per logged step, appended while training; `step` is the global
      step after the update (1 = the first update), `loss` the training loss
      of that update's batch, `steps_per_sec` the rate since the previous
      row, `elapsed_sec` training wall time summed over all runs that led to
      this step (a resumed run continues from the largest elapsed_sec in the
      file, so the column never decreases).
      A resumed run writes no row for a step that is already in the file.
  <model_dir>/eval_results.csv  step,split,ln_ppl,tokens
      one row per evaluated checkpoint and split (re-evaluating replaces it).
  <model_dir>/checkpoint, model.ckpt-N.index, model.ckpt-N.data-K-of-M
      written by TF's Saver; read here as tf.train.get_checkpoint_state and
      tf.train.latest_checkpoint read them (the `checkpoint` file is a text
      CheckpointState proto: model_checkpoint_path: "model.ckpt-N", then
      all_model_checkpoint_paths: "..." per kept checkpoint).

Both CSV files are written so a crash (even kill -9) leaves at most a partial
last line, which the next run removes before appending (a last row that is
complete but lacks its newline is kept, the newline added).  Two kinds of
readers: read_train_log / read_eval_results repair the file that way (its
owner, or anyone once the writer is done); scan_train_log /
scan_eval_results never write and skip a line that does not parse (a
watcher beside a live writer: the sweep's progress lines, the comparison).
A file that is damaged otherwise (a folder, binary, another header, a
garbled line before the last) raises DamagedFile, one line naming the file
and what to do, and is never rewritten; check_file checks one without
writing (the commands, before TensorFlow).  Eval and decode may share a
model_dir: every read-and-rewrite of a CSV file holds an flock on the
model_dir itself (_exclusive; no file is added), so two evals writing
eval_results.csv at once keep both's rows.

Imports only the standard library (the sweep and the comparison read these
files without TensorFlow).  The checkpoint functions take the file
operations to use (`files`, default LOCAL); training/checkpoints.py passes
tf.io.gfile's, so a gs:// model_dir is listed as before.
"""
import collections
import contextlib
import csv
import fcntl
import glob
import io
import logging
import os
import re
import threading

TRAIN_LOG = "train_log.csv"
TRAIN_LOG_FIELDS = ("step", "loss", "steps_per_sec", "elapsed_sec")
EVAL_RESULTS = "eval_results.csv"
EVAL_FIELDS = ("step", "split", "ln_ppl", "tokens")
CHECKPOINT_STATE = "checkpoint"
CHECKPOINT_PATTERN = "model.ckpt-*.index"

# tf.train's checkpoint functions log through this logger; the same lines
# (and levels) come from here.
_LOG = logging.getLogger("tensorflow")


# --------------------------------------------------------------------------
# train_log.csv and eval_results.csv


class DamagedFile(ValueError):
  """A run's file that cannot be read as it was written (a folder, binary,
  a garbled line); the message, one line, names the file and what to do.
  Nothing is rewritten then."""


# The writers' rows, complete: a last line without its newline that matches
# is kept (the newline is added); one that does not was cut by a crash.
_COMPLETE = {
    TRAIN_LOG_FIELDS: re.compile(r"\d+,[^,]+,[^,]+,-?\d+\.\d{3}\Z"),
    EVAL_FIELDS: re.compile(
        r"\d+,[^,]+,(-?\d+\.\d{6}|nan|-?inf),\d+\Z")}
_KINDS = {TRAIN_LOG_FIELDS: (int, float, float, float),
          EVAL_FIELDS: (int, str, float, int)}


def _read_text(path):
  """The text of a run's file; DamagedFile (one line) if it is a folder or
  not text."""
  name = os.path.basename(path)
  try:
    with open(path, "rb") as f:
      data = f.read()
  except IsADirectoryError:
    raise DamagedFile(
        "%s is a folder, not the run's %s: move it away (mv %s %s.bad) and "
        "rerun" % (path, name, path, path)) from None
  if b"\0" in data:
    why = "has NUL bytes"
  else:
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError as e:
      why = "is not UTF-8 text (byte %d)" % e.start
  raise DamagedFile(
      "%s %s: it is not the run's %s as written; restore it from a copy, or "
      "move it away (mv %s %s.bad) and rerun (its rows are then gone)"
      % (path, why, name, path, path))


def _row_parses(line, fields):
  cells = line.split(",")
  if len(cells) != len(fields) or not all(cells):
    return False
  try:
    for kind, cell in zip(_KINDS[fields], cells):
      kind(cell)
  except ValueError:
    return False
  return True


def _check_rows(path, fields):
  """The rows of a run's CSV file and the text it should have.

  Every line but the last must be the header or a row; the last line
  without its newline is what a crash leaves: kept if it is a complete row
  (_COMPLETE), else dropped (cut short).

  Returns:
    (text, sound text): equal unless the last line lacks its newline (a
    missing or cut header included).
  Raises:
    DamagedFile: a folder, binary, another header, a line that is not a row.
  """
  text = _read_text(path)
  header = ",".join(fields)
  lines = text.split("\n")
  last = lines.pop()  # "" when the text ends with a newline
  if last and (_COMPLETE[fields].match(last) and lines
               or not lines and last == header):
    lines.append(last)
  elif not lines:  # empty, or a header cut short
    lines = [header if header.startswith(last) else last]
  if lines[0] != header:
    raise DamagedFile(
        "%s: its first line is %r, not the header %s: it is not the run's "
        "%s; restore it, or move it away (mv %s %s.bad) and rerun"
        % (path, lines[0][:60], header, os.path.basename(path), path, path))
  for number, line in enumerate(lines[1:], 2):
    if not _row_parses(line, fields):
      raise DamagedFile(
          "%s: line %d (%r) is not a row of %s: correct or delete that line"
          % (path, number, line[:60], header))
  return text, "\n".join(lines) + "\n"


_HELD = threading.local()  # this thread's _exclusive depth


@contextlib.contextmanager
def _exclusive(directory):
  """Holds an exclusive flock on `directory` (a run's model_dir) while a CSV
  file of it is read and rewritten, so two processes writing it at once
  (two evals of one model_dir) neither lose the other's rows nor replace
  its temporary file.  Re-entrant in a thread; nothing where the directory
  cannot be opened or the file system refuses the lock (gs://, some NFS).

  Example:
    with _exclusive(model_dir):
      rows = _repair(path, EVAL_FIELDS)
      _write_atomic(path, ...)
  """
  depth = getattr(_HELD, "depth", 0)
  fd = None
  if depth == 0:
    try:
      fd = os.open(directory or ".", os.O_RDONLY)
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
      pass
  _HELD.depth = depth + 1
  try:
    yield
  finally:
    _HELD.depth = depth
    if fd is not None:
      os.close(fd)  # releases the flock


def _repair(path, fields):
  """Drops a cut last line (adds a missing final newline); returns the rows.

  Raises:
    DamagedFile: see _check_rows (the file is left as it is).
  """
  with _exclusive(os.path.dirname(path)):
    if not os.path.exists(path):
      return []
    text, sound = _check_rows(path, fields)
    if sound != text:
      _write_atomic(path, sound)
  return list(csv.DictReader(io.StringIO(sound)))


def check_file(model_dir, name):
  """Raises DamagedFile if <model_dir>/name (TRAIN_LOG or EVAL_RESULTS)
  cannot be read; writes nothing (a cut last line is not damage)."""
  path = os.path.join(model_dir, name)
  if os.path.lexists(path):
    _check_rows(path, {TRAIN_LOG: TRAIN_LOG_FIELDS,
                       EVAL_RESULTS: EVAL_FIELDS}[name])


def _write_atomic(path, text):
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _makedirs(model_dir):
  """Creates a local model_dir (a gs:// one is left to TensorFlow)."""
  if "://" not in model_dir:
    os.makedirs(model_dir, exist_ok=True)


def read_train_log(model_dir):
  """Rows of <model_dir>/train_log.csv as dicts of numbers, by step."""
  path = os.path.join(model_dir, TRAIN_LOG)
  if not os.path.exists(path):
    return []
  rows = _repair(path, TRAIN_LOG_FIELDS)
  return [{"step": int(r["step"]), "loss": float(r["loss"]),
           "steps_per_sec": float(r["steps_per_sec"]),
           "elapsed_sec": float(r["elapsed_sec"])} for r in rows]


class TrainLog(object):
  """Appends rows to <model_dir>/train_log.csv, never duplicating a step."""

  def __init__(self, model_dir):
    self.path = os.path.join(model_dir, TRAIN_LOG)
    _makedirs(model_dir)
    if os.path.exists(self.path):
      rows = read_train_log(model_dir)
    else:
      _write_atomic(self.path, ",".join(TRAIN_LOG_FIELDS) + "\n")
      rows = []
    self.steps = set(r["step"] for r in rows)
    self.elapsed_at = {r["step"]: r["elapsed_sec"] for r in rows}

  def last_elapsed(self):
    """The largest elapsed_sec logged (0 if none): where a resumed run's
    clock continues, so elapsed_sec never decreases down the file (a run
    killed after its last checkpoint logged steps that the resumed run does
    again; their time counts too)."""
    return max(self.elapsed_at.values()) if self.elapsed_at else 0.0

  def append(self, step, loss, steps_per_sec, elapsed_sec):
    """Writes one row (flushed) unless `step` is already logged."""
    if step in self.steps:
      return False
    with open(self.path, "a", newline="") as f:
      f.write("%d,%.9g,%.6g,%.3f\n" % (step, loss, steps_per_sec, elapsed_sec))
      f.flush()
    self.steps.add(step)
    self.elapsed_at[step] = elapsed_sec
    return True


def write_eval_results(model_dir, results):
  """Adds/replaces rows (dicts with EVAL_FIELDS) in eval_results.csv."""
  path = os.path.join(model_dir, EVAL_RESULTS)
  _makedirs(model_dir)
  with _exclusive(model_dir):  # another eval may write it now
    rows = _repair(path, EVAL_FIELDS) if os.path.exists(path) else []
    table = {(int(r["step"]), r["split"]): r for r in rows}
    for r in results:
      table[(int(r["step"]), r["split"])] = {
          "step": int(r["step"]), "split": r["split"],
          "ln_ppl": "%.6f" % r["ln_ppl"], "tokens": int(r["tokens"])}
    out = io.StringIO()
    writer = csv.DictWriter(out, EVAL_FIELDS, lineterminator="\n")
    writer.writeheader()
    for key in sorted(table):
      writer.writerow(table[key])
    _write_atomic(path, out.getvalue())
  return path


def read_eval_results(model_dir):
  path = os.path.join(model_dir, EVAL_RESULTS)
  if not os.path.exists(path):
    return []
  return [{"step": int(r["step"]), "split": r["split"],
           "ln_ppl": float(r["ln_ppl"]), "tokens": int(r["tokens"])}
          for r in _repair(path, EVAL_FIELDS)]


def _number(kind, text):
  try:
    return kind(text)
  except (TypeError, ValueError):
    return None


def scan_train_log(model_dir):
  """Rows of <model_dir>/train_log.csv as written so far; never writes.

  For a reader beside a live writer (read_train_log repairs the file).
  Returns:
    [{field: number or None}] of TRAIN_LOG_FIELDS, in file order; a field
    is None where its cell does not parse (a line cut short); [] without a
    readable file.
  Raises:
    DamagedFile: the file is a folder or not text.
  """
  kinds = dict(zip(TRAIN_LOG_FIELDS, (int, float, float, float)))
  try:
    text = _read_text(os.path.join(model_dir, TRAIN_LOG))
  except OSError:
    return []
  return [{k: _number(kinds[k], r.get(k)) for k in TRAIN_LOG_FIELDS}
          for r in csv.DictReader(io.StringIO(text))]


def scan_eval_results(model_dir, split="validation"):
  """{step: ln_ppl} of `split` in <model_dir>/eval_results.csv as written so
  far; never writes (a line that does not parse is skipped; {} without a
  readable file; DamagedFile for a folder or a file that is not text)."""
  out = {}
  try:
    text = _read_text(os.path.join(model_dir, EVAL_RESULTS))
  except OSError:
    return out
  for r in csv.DictReader(io.StringIO(text)):
    step, ln_ppl = _number(int, r.get("step")), _number(float,
                                                        r.get("ln_ppl"))
    if r.get("split") == split and step is not None and ln_ppl is not None:
      out[step] = ln_ppl
  return out


# --------------------------------------------------------------------------
# the checkpoints a model_dir holds


class LocalFiles(object):
  """The file operations the checkpoint functions use: the local file system.

  training/checkpoints.py passes an object with the same members backed by
  tf.io.gfile (READ_ERRORS: tf.errors.OpError).
  """
  READ_ERRORS = (OSError,)

  @staticmethod
  def exists(path):
    return os.path.exists(path)

  @staticmethod
  def glob(pattern):
    return glob.glob(pattern)

  @staticmethod
  def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
      return f.read()


LOCAL = LocalFiles()

CheckpointState = collections.namedtuple("CheckpointState",
                                         ["latest", "paths"])


def checkpoint_step(path):
  """The global step N of a path containing model.ckpt-N (mtf's rule)."""
  match = re.match(r".*model\.ckpt\-(\d+).*", path)
  if match is None:
    raise ValueError("Invalid checkpoint path {}".format(path))
  return int(match.group(1))


def _parse_state(text):
  """(model_checkpoint_path, [all_model_checkpoint_paths]) of a text-format
  CheckpointState, read as protobuf's text_format.Merge reads it (see
  _ProtoText); raises _ProtoText.ParseError where Merge raises its own."""
  return _ProtoText(text).state()


def checkpoint_state(model_dir, files=LOCAL):
  """The checkpoints <model_dir>/checkpoint lists.

  As tf.train.get_checkpoint_state reads them: the same answers, and a
  warning at the same level where TF logs one (its parse error's wording
  and exception names differ: this parser is not protobuf's).

  Returns:
    CheckpointState(latest, paths), relative paths joined to model_dir; None
    without the file, or (logged) if it cannot be read or does not parse.
  Raises:
    ValueError: the file names no latest checkpoint (TF's message).
  """
  path = os.path.join(model_dir, CHECKPOINT_STATE)
  try:
    if not files.exists(path):
      return None
    latest, paths = _parse_state(files.read_text(path))
  except files.READ_ERRORS + (_ProtoText.ParseError,) as e:
    _LOG.warning("%s: %s", type(e).__name__, e)
    _LOG.warning("%s: Checkpoint ignored", path)
    return None
  if not latest:
    raise ValueError("Invalid checkpoint state loaded from " + model_dir)
  def join(p):
    return p if os.path.isabs(p) else os.path.join(model_dir, p)
  return CheckpointState(join(latest), [join(p) for p in paths])


def latest_checkpoint(model_dir, files=LOCAL):
  """The prefix of the latest listed checkpoint if its files are there, else
  None (tf.train.latest_checkpoint)."""
  state = checkpoint_state(model_dir, files)
  if state is None:
    return None
  if files.glob(state.latest + ".index") or files.glob(state.latest):
    return state.latest
  _LOG.error("Couldn't match files for checkpoint %s", state.latest)
  return None


def latest_step(model_dir, files=LOCAL):
  """Global step of the latest checkpoint in model_dir, or None."""
  path = latest_checkpoint(model_dir, files) if files.exists(
      model_dir) else None
  return None if path is None else checkpoint_step(path)


def damaged_state(model_dir, files=LOCAL):
  """Why <model_dir>/checkpoint cannot be trusted while checkpoints are here,
  or None (no such file, no model.ckpt-N.index beside it, or a sound file).

  tf.train.latest_checkpoint answers None for such a file (garbage, cut, or
  naming a checkpoint whose files were removed), so training would start
  again at step 0 and save over the checkpoints that are here.

  Example:
    damaged_state(d) == "it names model.ckpt-900, whose files are not here"
  """
  path = os.path.join(model_dir, CHECKPOINT_STATE)
  if not files.exists(path) or not checkpoint_prefixes(model_dir, files):
    return None
  try:
    latest, _ = _parse_state(files.read_text(path))
  except files.READ_ERRORS + (_ProtoText.ParseError,) as e:
    return "it does not parse (%s)" % e
  if not latest:
    return "it names no latest checkpoint"
  full = latest if os.path.isabs(latest) else os.path.join(model_dir, latest)
  if re.match(r".*model\.ckpt\-(\d+).*", latest) is None:
    return "it names %r, not a model.ckpt-N" % latest
  if not (files.glob(full + ".index") or files.glob(full)):
    return "it names %s, whose files are not here" % latest
  return None


def listed_latest_step(model_dir):
  """The step <model_dir>/checkpoint names as the latest, whether or not its
  files are here (None: no such file, or it names none); logs nothing."""
  try:
    latest, _ = _parse_state(
        LOCAL.read_text(os.path.join(model_dir, CHECKPOINT_STATE)))
  except (FileNotFoundError, _ProtoText.ParseError):
    return None
  return checkpoint_step(latest) if latest else None


def checkpoint_prefixes(model_dir, files=LOCAL):
  """Prefixes (model_dir/model.ckpt-N) of the checkpoints with an index file."""
  return [p[:-len(".index")] for p in files.glob(
      os.path.join(model_dir, CHECKPOINT_PATTERN))]


def checkpoint_steps(model_dir, files=LOCAL):
  """Steps of the complete checkpoints in model_dir.

  A checkpoint counts if it is listed in model_dir/checkpoint or its index
  file exists, and its index and every data shard are present.
  """
  if not files.exists(model_dir):
    return []
  prefixes = set(checkpoint_prefixes(model_dir, files))
  state = checkpoint_state(model_dir, files)
  if state is not None:
    for path in state.paths:
      prefixes.add(path if os.path.isabs(path) else
                   os.path.join(model_dir, path))
  steps = []
  for prefix in prefixes:
    shards = files.glob(prefix + ".data-*-of-*")
    if (files.exists(prefix + ".index") and shards and
        len(shards) == int(shards[0].rsplit("-of-", 1)[1])):
      steps.append(checkpoint_step(prefix))
  return sorted(set(steps))


class _ProtoText(object):
  """Reads the text format of TF's CheckpointState as protobuf's
  text_format.Merge does (its Tokenizer's token rules, per line): fields
  `name: value` in any order, separated by nothing, ',' or ';'; `#`
  comments; strings in " or ' with C escapes, adjacent ones joined; a
  repeated field also as `name: [v, ...]`; a singular field given twice
  keeps the last value.  Anything else (an unknown field, a missing ':',
  a bad value) raises ParseError where Merge raises its ParseError.
  """

  class ParseError(ValueError):
    """The text does not parse (protobuf's ParseError)."""

  _SPACE = re.compile(r"(\s|(#.*$))+", re.MULTILINE)
  _TOKEN = re.compile("|".join([
      r"[a-zA-Z_][0-9a-zA-Z_+-]*",  # an identifier
      r"([0-9+-]|(\.[0-9]))[0-9a-zA-Z_.+-]*",  # a number
  ] + [r"{qt}[^{qt}\n\\]*((\\.)+[^{qt}\n\\]*)*({qt}|\\?$)".format(qt=mark)
       for mark in "\"'"]))
  _NAME = re.compile(r"\w+")
  _HEX = re.compile(r"(\\+)x([0-9a-fA-F])(?![0-9a-fA-F])")
  _INFINITY = re.compile("-?inf(?:inity)?f?$", re.IGNORECASE)
  _NAN = re.compile("nanf?$", re.IGNORECASE)
  # field -> (repeated, kind)
  FIELDS = {"model_checkpoint_path": (False, "string"),
            "all_model_checkpoint_paths": (True, "string"),
            "all_model_checkpoint_timestamps": (True, "double"),
            "last_preserved_timestamp": (False, "double")}

  def __init__(self, text):
    self._tokens = []
    for line in text.split("\n"):
      column = 0
      while True:
        space = self._SPACE.match(line, column)
        if space:
          column = space.end()
        if column >= len(line):
          break
        token = self._TOKEN.match(line, column)
        token = token.group(0) if token else line[column]
        self._tokens.append(token)
        column += len(token)
    self._tokens.reverse()

  def _peek(self):
    return self._tokens[-1] if self._tokens else ""

  def _next(self):
    return self._tokens.pop() if self._tokens else ""

  def _try(self, token):
    if self._peek() == token:
      self._next()
      return True
    return False

  def state(self):
    """(model_checkpoint_path, [all_model_checkpoint_paths])."""
    latest, paths = "", []
    while self._peek():
      name = self._next()
      if name == "[" or not self._NAME.match(name):
        raise self.ParseError("expected a field name, got %r" % name)
      if name not in self.FIELDS:
        raise self.ParseError('no field named "%s"' % name)
      repeated, kind = self.FIELDS[name]
      if not self._try(":"):
        raise self.ParseError('expected ":" after %s' % name)
      if repeated and self._try("["):
        found = []
        if not self._try("]"):
          while True:
            found.append(self._value(kind))
            if self._try("]"):
              break
            if not self._try(","):
              raise self.ParseError('expected ","')
      else:
        found = [self._value(kind)]
      if name == "model_checkpoint_path":
        latest = found[-1]
      elif name == "all_model_checkpoint_paths":
        paths.extend(found)
      if not self._try(","):
        self._try(";")
    return latest, paths

  def _value(self, kind):
    if kind == "double":
      return self._double(self._next())
    parts = [self._string(self._next())]
    while self._peek()[:1] in ("'", '"'):
      parts.append(self._string(self._next()))
    try:
      return str(b"".join(parts), "utf-8")
    except UnicodeDecodeError as e:
      raise self.ParseError(str(e)) from None

  def _string(self, token):
    """One quoted token's bytes (protobuf's text_encoding.CUnescape)."""
    if len(token) < 2 or token[0] not in "'\"" or token[-1] != token[0]:
      raise self.ParseError("expected a string, got %r" % token)
    def pad_hex(m):  # '\xf' -> '\x0f' (unless the backslash is escaped)
      if len(m.group(1)) & 1:
        return m.group(1) + "x0" + m.group(2)
      return m.group(0)
    text = self._HEX.sub(pad_hex, token[1:-1])
    try:
      return (text.encode("utf-8").decode("unicode_escape")
              .encode("raw_unicode_escape"))
    except ValueError as e:
      raise self.ParseError(str(e)) from None

  def _double(self, token):
    try:
      return float(token)
    except ValueError:
      pass
    if self._INFINITY.match(token):
      return float("-inf") if token[0] == "-" else float("inf")
    if self._NAN.match(token):
      return float("nan")
    try:
      return float(token.rstrip("f"))
    except ValueError:
      raise self.ParseError("could not parse float: %s" % token) from None
