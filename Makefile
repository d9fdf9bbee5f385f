# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1

.PHONY: setup demo test lint format synth bench clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements-dev.txt pyproject.toml lambdas/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e . -e lambdas
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

demo: setup
	$(PY) -m localrun

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(VENV)/bin/pytest -n 2

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

synth: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH npx cdk synth

bench: setup
	$(PY) bench/agent_overhead.py
	$(PY) bench/flops_accuracy.py

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache .ruff_cache
