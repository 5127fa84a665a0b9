# `make demo` and `make test` set everything up themselves: a .venv built
# from requirements.lock (exact versions of every package), then the package
# in editable mode, then the fused attention core's op library, compiled
# with the machine's C++ compiler ($CXX, else g++; about a minute) into the
# cache (mtf_talking_heads/nn/fused/build.py; without a compiler the einsum
# core runs).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest-xdist workers, one test file at a time each (tests/conftest.py).
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: all demo test test-fast test-onednn lint venv clean

all: test

$(STAMP): requirements.lock setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (TF 2.15.1 wheels)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m mtf_talking_heads.nn.fused.build || echo "warning: the fused attention core was not built (the line above says why); the einsum core runs instead"
	touch $(STAMP)

venv: $(STAMP)

# The main job: trains a small byte-level language model with multi-head and
# with talking-heads attention on the embedded corpus and compares them at
# equal steps and equal time (see README).
demo: $(STAMP)
	$(BIN)/mtf_th demo

# The whole suite (what CI runs), on TF's Eigen CPU kernels, with the
# split strategies' cores run once more under oneDNN's kernels by
# tests/strategies/test_onednn.py (a pytest process of its own with
# TF_ENABLE_ONEDNN_OPTS=1).  Each kernel path is pinned, because TF picks
# oneDNN by itself on CPUs with AVX-512 (Intel, and newer AMD EPYC such as
# the test machine of 2026-11-26).  The work is CPU-bound Python (graph
# building) and TensorFlow processes, so two workers (pytest-xdist, one
# file each at a time: tests/conftest.py) share the 2 cores.  Time on 2
# cores: README.md, "The two commands".
test: $(STAMP)
	TF_ENABLE_ONEDNN_OPTS=0 $(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS) tests

# pyflakes and bugbear over the whole checkout (ruff.toml says which rules
# and why); a few seconds.  CI runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .

# The split strategies' cores again with TF's oneDNN kernels forced on
# (tests/strategies/test_onednn.py says which and why); `make test` runs that file
# among the others, this target alone.
test-onednn: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) tests/strategies/test_onednn.py

# The quick loop while developing: every test except those marked slow
# (the full sharding matrices, the real sweep, fine-tuning, stock t5 script).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) .pytest_cache
