"""Session-wide set-up: the CPU is split into 8 logical devices before any
TensorFlow op runs (it can only be done once per process), so every test
module can use meshes of up to 8 devices with PlacementMeshImpl."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mtf_talking_heads import compat  # noqa: E402  (fixes mtf imports)

NUM_DEVICES = 8
compat.split_cpu(NUM_DEVICES)


import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _fresh_gin_config_per_module():
  """Gin bindings made in-process by one test module (training commands
  parse whole configs) must not leak into the next one's graphs."""
  yield
  from mtf_talking_heads import harness  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.clear_config()
  harness.parse_mtf_defaults.done = False
