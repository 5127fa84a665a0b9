"""Talking-Heads Attention (Shazeer et al. 2020) on named Mesh-TensorFlow dims.

Importing the package mends the old stack (see compat.py) and registers the
gin configurables (layers under the gin module ``mtf_th``) -- except under
the ``mtf_th`` console script (mtf_talking_heads_startup.mtf_th), whose
commands import what they need, so the light ones never load TensorFlow.

The modules are in packages by job (docs/architecture.md); the few module
paths that gin files imported before that still import (MOVED_MODULES).
"""
import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys

__version__ = "0.1.0"

# Module paths gin files imported before the package was split by job
# (issue 33): gin copies a file's `import` lines into a model_dir's
# operative_config.gin, which eval and decode parse again, so model_dirs
# trained before then, and users' own gin files, still say
# `import mtf_talking_heads.layers`.  Each imports the module of today.
MOVED_MODULES = {
    "mtf_talking_heads.layers": "mtf_talking_heads.nn.layers",
    "mtf_talking_heads.optimizers": "mtf_talking_heads.nn.optimizers",
    "mtf_talking_heads.models": "mtf_talking_heads.nn.models",
    "mtf_talking_heads.attention": "mtf_talking_heads.nn.attention",
}


class _MovedModuleFinder(object):
  """Imports a path of MOVED_MODULES as the module that holds it now (a
  meta path finder and its loader; importlib.abc is not imported for them:
  the console script's start-up stays light).

  Example:
    import mtf_talking_heads.layers  # the module mtf_talking_heads.nn.layers
  """

  def find_spec(self, name, path=None, target=None):
    del path, target  # unused
    if name in MOVED_MODULES:
      return _importlib_util.spec_from_loader(name, self)
    return None

  def create_module(self, spec):
    return _importlib.import_module(MOVED_MODULES[spec.name])

  def exec_module(self, module):
    del module  # create_module returned the module, already executed


if not any(isinstance(f, _MovedModuleFinder) for f in _sys.meta_path):
  _sys.meta_path.append(_MovedModuleFinder())

if not getattr(_sys.modules.get("mtf_talking_heads_startup"),
               "LIGHT_PACKAGE_IMPORT", False):
  # Registration imports (noqa: F401): each one's import is its effect.
  # compat must come first: it fixes `import mesh_tensorflow`.
  from mtf_talking_heads.core import compat  # noqa: F401
  from mtf_talking_heads.nn import attention  # noqa: F401  pylint: disable=g-bad-import-order
  from mtf_talking_heads.nn import layers  # noqa: F401  the mtf_th.* gin classes
  from mtf_talking_heads.nn import models  # noqa: F401  gin/ on gin's search path
  from mtf_talking_heads.nn import strategies  # noqa: F401  the mtf_th.* strategies
