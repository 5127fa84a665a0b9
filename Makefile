# `make demo` and `make test` set everything up themselves: a .venv built
# from requirements.lock (exact versions of every package), then the package
# in editable mode.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all demo test test-fast venv clean

all: test

$(STAMP): requirements.lock setup.py
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (TF 2.15.1 wheels)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# The main job: trains tiny multi-head and talking-heads T5s on the embedded
# corpus on a model-parallel mesh of logical CPU devices (see README).
demo: $(STAMP)
	$(BIN)/mtf_th demo

# The whole suite (what CI runs): about 20 minutes on 2 cores.
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) tests

# The quick loop while developing: every test except those marked slow
# (the full sharding matrices, the real sweep, fine-tuning, stock t5 script).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) .pytest_cache
