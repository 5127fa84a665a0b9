"""Session-wide set-up: the CPU is split into 8 logical devices before any
TensorFlow op runs (it can only be done once per process), so every test
module can use meshes of up to 8 devices with PlacementMeshImpl.

`make test` runs the suite on two pytest-xdist workers, each a process of
its own with its own 8 devices, one test file per worker at a time
(`--dist loadfile`: a file's module-scoped graphs, sessions and trained
models stay in one process).  Files are handed out in collection order, so
the files that take longest are collected first (LONGEST_FIRST); the two
workers then finish within about one short file of each other.
"""
import os
import warnings

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gin  # noqa: E402
import pytest  # noqa: E402

NUM_DEVICES = 8


def pytest_configure(config):
  """Splits the CPU (before any test module, which may import TensorFlow,
  is collected) in every process that runs tests: not in pytest-xdist's
  controller, which only hands out files (it would load TensorFlow and the
  package for nothing)."""
  if (getattr(config, "workerinput", None) is None
      and config.getoption("numprocesses", None)):
    return
  with warnings.catch_warnings():  # pytest.ini's filters apply from here on
    warnings.simplefilter("ignore", DeprecationWarning)
    from mtf_talking_heads.core import compat  # pylint: disable=g-import-not-at-top
    compat.split_cpu(NUM_DEVICES)


# The longest files of the suite, longest first (measured on 2 cores; a
# file not listed runs after these, in its usual order).  A stale order
# costs only balance between the two workers, never a test.
LONGEST_FIRST = (
    "test_strategies.py",
    "test_docs_commands.py",
    "test_onednn.py",
    "test_training.py",
    "test_sharded.py",
    "test_cluster_faults.py",
    "test_fused_core.py",
    "test_bad_inputs_identity.py",
    "test_bad_inputs_files.py",
    "test_small_regime.py",
    "test_cluster.py",
    "test_sweep.py",
    "test_bad_inputs.py",
    "test_stop_signals.py",
    "test_finetune_chain.py",
    "test_experiments_train.py",
    "test_stock_t5.py",
    "test_t5_api.py",
    "test_tpu_program.py",
    "test_init_seeds.py",
    "test_training_failures.py",
    "test_auto.py",
    "test_comm.py",
    "test_enc_dec_strategies.py",
    "test_decode.py",
    "test_quiet.py",
    "test_albert_bert.py",
    "test_grouped.py",
    "test_memory.py",
    "test_cli_errors.py",
)


def pytest_collection_modifyitems(items):
  """Collects the files of LONGEST_FIRST first (a stable sort by file)."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _pinned_core_kernel():
  """MTF_TH_TEST_CORE_KERNEL=einsum (or fused) pins mtf_th.core_kernel.kind
  for every test of the process: test_onednn.py runs the split strategies'
  einsum cores under oneDNN this way (in the main run they take the fused
  op wherever it applies, which runs no TensorFlow softmax)."""
  kind = os.environ.get("MTF_TH_TEST_CORE_KERNEL")
  if not kind:
    yield
    return
  from mtf_talking_heads.nn import core_kernel  # pylint: disable=g-import-not-at-top
  with core_kernel.bound(kind):
    yield


@pytest.fixture(autouse=True, scope="module")
def _fresh_gin_config_per_module():
  """Gin bindings made in-process by one test module (training commands
  parse whole configs) must not leak into the next one's graphs."""
  yield
  from mtf_talking_heads.measure import harness  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.clear_config()
  harness.parse_mtf_defaults.done = False
