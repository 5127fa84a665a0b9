"""Talking-Heads Attention (Shazeer et al. 2020) on named Mesh-TensorFlow dims.

Importing the package mends the old stack (see compat.py) and registers the
gin configurables (layers under the gin module ``mtf_th``).
"""
from mtf_talking_heads import compat  # must come first: fixes `import mesh_tensorflow`
from mtf_talking_heads import attention  # pylint: disable=g-bad-import-order
from mtf_talking_heads import layers
from mtf_talking_heads import models  # puts the repository's gin/ on gin's search path

__version__ = "0.1.0"
