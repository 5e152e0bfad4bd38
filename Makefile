# Two commands: `make demo` and `make test`. Both set up .venv from pinned requirements first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export OMP_NUM_THREADS ?= 2

.PHONY: demo test setup ablations baselines bench clean

$(STAMP): requirements.txt requirements-dagster.txt pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -r requirements-dagster.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

setup: $(STAMP) $(DAGSTER_HOME)/dagster.yaml

# The install's wall time goes to the report's cost section with the demo's own stages. DEMO_ARGS: e.g. --full
# (adds the Bias-F/M and gait sets, left out by default: see `splavu demo --help`).
# Three lines, not one: make runs a line holding $(MAKE) even under `make -n`, which would start the demo.
DEMO_ARGS ?=
demo:
	@mkdir -p $(DAGSTER_HOME) && date +%s > $(DAGSTER_HOME)/.demo_t0
	$(MAKE) --no-print-directory setup
	SPLAVU_INSTALL_SECONDS=$$(( $$(date +%s) - $$(cat $(DAGSTER_HOME)/.demo_t0) )) $(BIN)/splavu demo $(DEMO_ARGS)

# Bounded twice: a test past pyproject's `timeout` prints every thread's stack and ends its process;
# `timeout` ends a pytest process that outlives its bound anyway. One pytest run on every core (pytest-xdist;
# --dist loadfile keeps a module's fixtures in one worker). The dask cluster module joins it: its Dagster runs already
# have processes of their own (tests/cluster_run.py), so it no longer waits for the main suite to finish first.
# The suite took 6.5-11.5 min on a 2-core VM (quiet and slow hours); the bound keeps more than twice that.
TEST_BOUND_S ?= 1500
TEST_WORKERS ?= auto
test: setup
	timeout -k 30 $(TEST_BOUND_S) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

ablations: setup
	$(BIN)/splavu ablations

baselines: setup
	$(BIN)/splavu synth --out data/synth --quiet  # the person masks `make demo` skips (videos are kept)
	$(BIN)/splavu baselines --masks rendered

bench: setup
	$(BIN)/python benchmarks/extract.py
	$(BIN)/python benchmarks/train_aam.py --store store
	$(BIN)/python benchmarks/publish.py

clean:
	rm -rf store data .dagster_home
