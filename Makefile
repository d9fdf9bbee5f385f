# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Setup compiles the packages' bytecode on every core (pip compiles on one), but for aws-cdk-lib's and transformers'
# modules (more than half of all the source, of which little is imported here), torch's compiler, and the packages'
# own tests. Those are compiled as they are first imported, and kept for every later process: PYTHONDONTWRITEBYTECODE,
# where set, is not passed on (each of the hundreds of processes the suite and the demo start would compile all it
# imports again). The checkout's modules are compiled before the tests. compileall skips what pip skips too: torch's
# one test module in Python 3.12's syntax.
NOT_COMPILED := '/(aws_cdk|transformers|torch/_inductor|tests?)/|torch/testing/_internal/py312_intrinsics\.py'
SOURCES := app.py bench corpus examples lambdas localrun stacks tests trainer_agent
unexport PYTHONDONTWRITEBYTECODE
# Where `make dist` puts the trainer-agent wheel and sdist (docs/release.md).
DIST ?= dist

.PHONY: setup slurm demo test test-fast lint format synth deploy bench clean dist wheel-check lambda-lock images

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements-dev.txt pyproject.toml lambdas/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements-dev.txt
	$(PY) -m compileall -q -j 0 -x $(NOT_COMPILED) $(VENV)/lib
	$(PY) -m pip install -q --no-deps -e . -e lambdas
	touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

demo: setup
	$(PY) -m localrun

# A real Slurm for the Slurm platform's tests and demo (docs/demo.md): Debian's slurmctld, slurmd and client 22.05,
# munge, and shellcheck for deploy/slurm's scripts. Root (apt); nothing is installed when all are there. The tests
# and the demo start their own daemons in a folder of their own (localrun/slurm_daemons.py): none is left running.
SLURM_PROGRAMS := munged slurmctld slurmd sbatch scontrol shellcheck
slurm:
	@for p in $(SLURM_PROGRAMS); do command -v $$p >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make slurm: install slurmctld, slurmd and slurm-client (22.05), munge and shellcheck (root and apt-get needed to do it here)" >&2; \
	    exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    slurmctld slurmd slurm-client munge shellcheck; \
	fi

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Five workers on two cores: much of the suite's time is spent waiting (the demos, the real Slurm, training
# subprocesses), so two workers leave the cores idle, and four did 10 % of the time (docs/benchmarks.md, "The suite");
# slow tests start first (tests/conftest.py) and an idle worker steals queued tests from a busy one. The 25 slowest
# tests are printed: the slow marker's check.
TEST_WORKERS ?= 5

test: lint slurm
	$(PY) -m compileall -q -j 0 $(SOURCES)
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal --durations=25

test-fast: setup
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow"

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

synth: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH npx cdk synth

# A first deploy in one command (docs/deploy.md): the toolchains, CDK's bootstrap of the credentials' account and region
# (its synth needs no Lambda asset; bootstrapping again changes nothing), then the stack, whose IAM changes CDK shows
# and asks about first.
STACK ?= stallwatch
deploy: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH npx cdk bootstrap -c stallwatch:bundle-dependencies=false
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH npx cdk deploy $(STACK)

bench: setup
	$(PY) bench/agent_overhead.py
	$(PY) bench/flops_accuracy.py

# The trainer-agent wheel and sdist, checked by twine; tests/packaging builds with this very target.
dist:
	rm -rf $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) .
	$(PY) -m twine check --strict $(DIST)/*

# The built files in $(DIST), installed into clean venvs of the oldest and newest declared Python (no torch).
wheel-check: setup
	TRAINER_AGENT_DIST=$(CURDIR)/$(DIST) $(VENV)/bin/pytest -p no:cacheprovider tests/packaging

# lambdas/requirements.lock: every package of the Lambda asset, pinned with hashes for python3.12 arm64.
lambda-lock: setup
	$(PY) -m stacks.lock

# The README's charts, from a corpus trace: the replay's, and the goodput report's of the trace played onto moto.
IMAGE_TRACE := corpus/traces/sm-hang-8host-agent.jsonl
images: setup
	$(VENV)/bin/stallwatch replay $(IMAGE_TRACE) --plot docs/images/replay-sm-hang-8host-agent.png
	$(PY) -m localrun.trace_run $(IMAGE_TRACE) --plot docs/images/report-sm-hang-8host-agent.png

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache .ruff_cache $(DIST) build
