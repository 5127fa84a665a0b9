"""Where this package's gin files are, without importing TensorFlow or mtf.

The light commands (``mtf_th sweep --list_paper_tables``, ``--dry_run``'s
plan) read gin files as text; models.py re-exports gin_dir() for the
commands that build models.
"""
import os

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
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
