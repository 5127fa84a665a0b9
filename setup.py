"""mtf_talking_heads: Talking-Heads Attention (Shazeer et al. 2020) in Mesh-TensorFlow."""
import os

import setuptools
from setuptools.command import build_py

# Exact pins; README.md ("Why each pin") says why each one exists.  The full
# transitive lock is requirements.lock (what `make` installs).
INSTALL_REQUIRES = [
    "tensorflow==2.15.1",
    "tensorflow-text==2.15.0",
    "mesh-tensorflow[transformer]==0.1.21",
    "t5==0.9.4",
    "gin-config==0.5.0",
    "seqio-nightly==0.0.18.dev20250227",
    "tfds-nightly==4.9.2.dev202308090034",
    "tensorflow-datasets==4.9.2",
    "tensorflow-metadata==1.13.1",
    "tensorflow-hub==0.13.0",
    "sentencepiece==0.2.0",
    "setuptools==80.9.0",
    "numpy==1.26.4",
    "matplotlib==3.9.4",
]


class BuildPyWithGin(build_py.build_py):
  """Copies the repository's gin/ into a wheel as mtf_talking_heads/gin.

  A checkout or editable install reads <repo>/gin directly
  (models.gin_dir()); a wheel has no <repo>, so it carries the files.
  """

  def run(self):
    super().run()
    if not getattr(self, "editable_mode", False):
      self.copy_tree("gin", os.path.join(self.build_lib, "mtf_talking_heads",
                                         "gin"))


setuptools.setup(
    name="mtf_talking_heads",
    version="0.1.0",
    description="Talking-Heads Attention on named Mesh-TensorFlow dimensions",
    packages=setuptools.find_packages(include=["mtf_talking_heads", "mtf_talking_heads.*"]),
    python_requires=">=3.11,<3.12",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": ["pytest==8.3.4", "pytest-timeout==2.3.1"]},
    cmdclass={"build_py": BuildPyWithGin},
    entry_points={"console_scripts": ["mtf_th=mtf_talking_heads.cli:main"]},
)
