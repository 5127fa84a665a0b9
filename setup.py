"""mtf_talking_heads: Talking-Heads Attention (Shazeer et al. 2020) in Mesh-TensorFlow."""
import os

import setuptools
from setuptools.command import build_py
from setuptools.command import editable_wheel

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


# Python runs this line of site-packages/mtf_talking_heads_startup.pth at
# start-up: it only adds an import hook that applies compat.py just before
# mesh_tensorflow is imported (see mtf_talking_heads_startup.py), so the
# stock t5_mesh_transformer script works (stack breakage 8).
STARTUP_PTH = "mtf_talking_heads_startup.pth"
STARTUP_LINE = ("import mtf_talking_heads_startup; "
                "mtf_talking_heads_startup.install()\n")


class BuildPyWithGin(build_py.build_py):
  """Copies the repository's gin/ into a wheel as mtf_talking_heads/gin.

  A checkout or editable install reads <repo>/gin directly
  (models.gin_dir()); a wheel has no <repo>, so it carries the files.  The
  wheel also gets the start-up .pth file at its root (site-packages).
  """

  def run(self):
    super().run()
    if not getattr(self, "editable_mode", False):
      self.copy_tree("gin", os.path.join(self.build_lib, "mtf_talking_heads",
                                         "gin"))
      with open(os.path.join(self.build_lib, STARTUP_PTH), "w") as f:
        f.write(STARTUP_LINE)


class _StrategyWithStartupPth(object):
  """An editable-install strategy that also writes the start-up .pth file."""

  def __init__(self, strategy):
    self._strategy = strategy

  def __call__(self, wheel, files, mapping):
    result = self._strategy(wheel, files, mapping)
    wheel.writestr(STARTUP_PTH, STARTUP_LINE)
    return result

  def __enter__(self):
    self._strategy.__enter__()
    return self

  def __exit__(self, *exc):
    return self._strategy.__exit__(*exc)


class EditableWheelWithStartupPth(editable_wheel.editable_wheel):
  """`pip install -e .` (what the Makefile runs) installs the .pth file too."""

  def _select_strategy(self, *args, **kwargs):
    return _StrategyWithStartupPth(super()._select_strategy(*args, **kwargs))


setuptools.setup(
    name="mtf_talking_heads",
    version="0.1.0",
    description="Talking-Heads Attention on named Mesh-TensorFlow dimensions",
    packages=setuptools.find_packages(include=["mtf_talking_heads", "mtf_talking_heads.*"]),
    # the fused attention core's C++ source, compiled on the user's machine
    # (nn/fused/build.py)
    package_data={"mtf_talking_heads.nn.fused": ["fused_core.cc"]},
    py_modules=["mtf_talking_heads_startup"],
    python_requires=">=3.11,<3.12",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": ["pytest==8.3.4", "pytest-timeout==2.3.1",
                             "pytest-xdist==3.8.0", "ruff==0.17.6"]},
    cmdclass={"build_py": BuildPyWithGin,
              "editable_wheel": EditableWheelWithStartupPth},
    entry_points={"console_scripts": [
        "mtf_th=mtf_talking_heads_startup:mtf_th"]},
)
