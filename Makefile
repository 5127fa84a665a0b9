# `make demo` and `make test` set everything up themselves: a .venv built
# from requirements.lock (exact versions of every package), then the package
# in editable mode.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest-xdist workers, one test file at a time each (tests/conftest.py).
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: all demo test test-fast test-onednn venv clean

all: test

$(STAMP): requirements.lock setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (TF 2.15.1 wheels)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# The main job: trains a small byte-level language model with multi-head and
# with talking-heads attention on the embedded corpus and compares them at
# equal steps and equal time (see README).
demo: $(STAMP)
	$(BIN)/mtf_th demo

# The whole suite (what CI runs) on TF's default (Eigen) CPU kernels, then
# the strategy tests again with oneDNN's kernels (test-onednn).  The work
# is CPU-bound Python (graph building) and TensorFlow subprocesses, so two
# workers on 2 cores take about half of one process's time: the Eigen pass
# took 61.7 min with one process on 2026-11-27 (3862 CPU-s, 2 cores shared
# with a sweep), and 34.1 min on two workers later that day (1210 tests,
# 60.5 CPU-min, the 2 cores to itself), after the sharding matrices went to
# one run per code path (52 graph runs fewer).  Each pass pins its kernel path, because TF picks
# oneDNN by itself on CPUs with AVX-512 (Intel, and newer AMD EPYC such as
# the test machine of 2026-11-26): left to TF, both passes could run oneDNN.
test: $(STAMP)
	TF_ENABLE_ONEDNN_OPTS=0 $(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS) tests
	$(MAKE) --no-print-directory test-onednn

# The split strategies' cores run again with TF's oneDNN kernels forced on
# (TF 2.15's default on CPUs with AVX-512, off on older ones), whose
# Softmax refuses tensors of more than 5 dims (docs/sharding.md): the tests
# of test_strategies.py that run a split core - the 768-heads training,
# greedy decoding, and the batch:2 x model:4 runs of its matrix, where the
# split cores have the most dims, for talking heads and dynamic projections
# (multi-head's and logits-only's cores run a subset of their op types at
# the same ranks) and the two strategies that run one model per mesh.  Left
# out: heads-parallel runs (a 4-dim softmax), the pre-flight-only and error
# tests (no kernel runs).  These sessions keep TF's graph rewrites, as
# training does (tests/_strategy_util.session_config).
# tests/test_kernel_ranks.py checks the ranks of every strategy's graphs,
# multi-head's and talking heads', statically in the main run.
# 12 tests (34 before), 254 CPU-s on two workers (2026-11-27, measured
# while the 2 cores were shared with about 20 other processes, so its wall
# time, 38.7 min, says nothing; not yet timed on quiet cores).
ONEDNN_TESTS := tests/test_strategies.py
ONEDNN_SELECT := (batch2xmodel4 and (th- or dynamic- or batch_split_gathered or batch_query_split) and not heads_parallel) or 768_heads or greedy_decoding
test-onednn: $(STAMP)
	TF_ENABLE_ONEDNN_OPTS=1 $(BIN)/python -m pytest -q -n 2 --dist load $(PYTEST_ARGS) -k "$(ONEDNN_SELECT)" $(ONEDNN_TESTS)

# The quick loop while developing: every test except those marked slow
# (the full sharding matrices, the real sweep, fine-tuning, stock t5 script).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) .pytest_cache
