"""Where this package's gin files are, without importing TensorFlow or mtf.

The light commands (``mtf_th sweep --list_paper_tables``, ``--dry_run``'s
plan) read gin files as text; models.py re-exports gin_dir() for the
commands that build models.
"""
import os

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An editable install or a checkout: <repo>/gin; a wheel ships <package>/gin.
CANDIDATE_GIN_DIRS = (os.path.join(os.path.dirname(_PACKAGE_DIR), "gin"),
                      os.path.join(_PACKAGE_DIR, "gin"))


def gin_dir():
  """The directory holding this repository's gin files.

  Returns:
    an absolute path.
  Raises:
    FileNotFoundError: if neither <repo>/gin nor <package>/gin exists.
  """
  for path in CANDIDATE_GIN_DIRS:
    if os.path.isfile(os.path.join(path, "mtf_th.gin")):
      return path
  raise FileNotFoundError(
      "mtf_talking_heads' gin files were not found in %s; install the "
      "package from its repository (pip install -e .)"
      % " or ".join(CANDIDATE_GIN_DIRS))


def list_gin_files(root):
  """Relative paths of the .gin files under `root`, sorted."""
  out = []
  for dirpath, _, names in os.walk(root):
    out.extend(os.path.relpath(os.path.join(dirpath, n), root)
               for n in names if n.endswith(".gin"))
  return sorted(out)


def resolve(name, search_dirs=()):
  """Absolute path of gin file `name`: a path, or relative to the current
  directory, gin_dir() or one of `search_dirs`.

  Raises:
    FileNotFoundError: one line naming the file, the directories searched
      and close matches among the shipped files.
  """
  import difflib  # pylint: disable=g-import-not-at-top
  if not isinstance(name, str) or not name.strip():
    raise FileNotFoundError(
        "--gin_file is empty (%r): give a gin file such as "
        "experiments/t5_heads/07_talking_heads_24_32.gin" % (name,))
  try:
    root = gin_dir()
  except FileNotFoundError:
    root = None
  dirs = [d for d in list(search_dirs) + ([root] if root else []) if d]
  dirs = list(dict.fromkeys(dirs))
  candidates = [name] if os.path.isabs(name) else (
      [name] + [os.path.join(d, name) for d in dirs])
  for path in candidates:
    if os.path.isfile(path):
      return os.path.abspath(path)
  if os.path.isdir(name):
    raise FileNotFoundError("--gin_file %r is a directory: give a .gin file "
                            "(see `ls %s`)" % (name, name))
  known = list_gin_files(root) if root else []
  close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
  hint = (" Did you mean %s?" % " or ".join(close)) if close else ""
  raise FileNotFoundError(
      "--gin_file %r: no such file (looked in the current directory and %s)."
      "%s Files shipped with mtf_talking_heads are listed by `ls %s`."
      % (name, ", ".join(dirs) or "nowhere else", hint, root))
