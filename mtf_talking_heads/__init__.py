"""Talking-Heads Attention (Shazeer et al. 2020) on named Mesh-TensorFlow dims.

Importing the package mends the old stack (see compat.py) and registers the
gin configurables (layers under the gin module ``mtf_th``) -- except under
the ``mtf_th`` console script (mtf_talking_heads_startup.mtf_th), whose
commands import what they need, so the light ones never load TensorFlow.
"""
import sys as _sys

__version__ = "0.1.0"

if not getattr(_sys.modules.get("mtf_talking_heads_startup"),
               "LIGHT_PACKAGE_IMPORT", False):
  # Registration imports (noqa: F401): each one's import is its effect.
  # compat must come first: it fixes `import mesh_tensorflow`.
  from mtf_talking_heads.core import compat  # noqa: F401
  from mtf_talking_heads.nn import attention  # noqa: F401  pylint: disable=g-bad-import-order
  from mtf_talking_heads.nn import layers  # noqa: F401  the mtf_th.* gin classes
  from mtf_talking_heads.nn import models  # noqa: F401  gin/ on gin's search path
  from mtf_talking_heads.nn import strategies  # noqa: F401  the mtf_th.* strategies
