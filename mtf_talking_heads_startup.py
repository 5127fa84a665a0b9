"""Start-up pieces of mtf_talking_heads that must not import it (stdlib only).

Two jobs, both before TensorFlow or mesh_tensorflow is loaded:

* ``install()`` puts a one-shot finder on ``sys.meta_path`` that loads
  mtf_talking_heads/core/compat.py (whose import hooks apply its fixes) just
  before ``mesh_tensorflow`` is first imported.  setup.py installs ``mtf_talking_heads_startup.pth`` (for a wheel
  and for ``pip install -e .``), which calls ``install()`` when Python starts,
  so scripts that import mesh_tensorflow before they could import us -- the
  stock ``t5_mesh_transformer --module_import=mtf_talking_heads`` (stack
  breakage 8) -- work.  A process that never imports mesh_tensorflow pays one
  string comparison per import.
* ``mtf_th()`` is the ``mtf_th`` console script.  It asks the package for a
  light import (no TensorFlow in ``mtf_talking_heads/__init__.py``), so
  ``mtf_th --help``, ``mtf_th costs`` and ``mtf_th sweep --list_paper_tables``
  start in well under a second; commands that need TensorFlow import it
  themselves, and compat's hooks (installed first) mend it for them.
"""
import importlib
import importlib.util
import os
import sys

# True while the `mtf_th` console script runs: mtf_talking_heads/__init__.py
# then skips importing TensorFlow and registering the gin layers.
LIGHT_PACKAGE_IMPORT = False
_PACKAGE = "mtf_talking_heads"
_COMPAT = _PACKAGE + ".core.compat"  # the one module of stack mends


class _MeshTensorflowFinder(object):
  """Loads compat.py once, when `mesh_tensorflow` is about to be imported,
  and lets compat's own finder (which runs the fix) find it."""

  def find_spec(self, name, path=None, target=None):
    if name != "mesh_tensorflow":
      return None
    uninstall()
    compat = load_compat()
    if compat is None:
      return None
    return compat.find_spec(name, path, target)


_FINDER = _MeshTensorflowFinder()


def install():
  """Adds the finder to sys.meta_path (idempotent; no-op once mtf is loaded)."""
  if "mesh_tensorflow" in sys.modules or _COMPAT in sys.modules:
    return
  if not any(f is _FINDER for f in sys.meta_path):
    sys.meta_path.insert(0, _FINDER)


def uninstall():
  sys.meta_path[:] = [f for f in sys.meta_path if f is not _FINDER]


def load_compat():
  """Imports mtf_talking_heads.core.compat (which installs its import hooks).

  compat.py imports only the standard library.  When the package itself is
  not imported yet, compat.py is loaded on its own under its full name:
  importing the package here would register the gin layers, which import
  mesh_tensorflow, the very module being imported.  The package's later
  `from mtf_talking_heads.core import compat` reuses that module.

  Returns:
    the module, or None if mtf_talking_heads is not installed.
  """
  name = _COMPAT
  if name in sys.modules:
    return sys.modules[name]
  if _PACKAGE in sys.modules:
    return importlib.import_module(name)
  package = importlib.util.find_spec(_PACKAGE)
  if package is None or not package.submodule_search_locations:
    return None
  path = os.path.join(list(package.submodule_search_locations)[0], "core",
                      "compat.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return module


def mtf_th():
  """The `mtf_th` console script: cli.console() after a light import."""
  global LIGHT_PACKAGE_IMPORT
  LIGHT_PACKAGE_IMPORT = True
  uninstall()
  load_compat()
  from mtf_talking_heads import cli  # pylint: disable=g-import-not-at-top
  return cli.console()


if __name__ == "__main__":  # `python -m mtf_talking_heads_startup`: a sweep's
  import mtf_talking_heads_startup as _startup  # runs; the module, not __main__
  sys.exit(_startup.mtf_th())
