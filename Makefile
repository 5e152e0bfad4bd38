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

demo: setup
	$(BIN)/splavu demo

# The dask cluster tests run in an interpreter of their own: inside one long session their dask
# `evaluate` run has hung twice on a fresh clone (never when the module ran alone; cause not found).
test: setup
	$(BIN)/python -m pytest --ignore=tests/test_cluster.py
	$(BIN)/python -m pytest tests/test_cluster.py

ablations: setup
	$(BIN)/splavu ablations

baselines: setup
	$(BIN)/splavu baselines --masks rendered

bench: setup
	$(BIN)/python benchmarks/extract.py
	$(BIN)/python benchmarks/train_aam.py --store store
	$(BIN)/python benchmarks/publish.py

clean:
	rm -rf store data .dagster_home
