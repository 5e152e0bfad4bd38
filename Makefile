# Two commands: `make demo` and `make test`. Both set up .venv from pinned requirements first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export OMP_NUM_THREADS ?= 2

.PHONY: demo test setup ablations bench clean

$(STAMP): requirements.txt pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	mkdir -p $(DAGSTER_HOME) && cp -n dagster.yaml $(DAGSTER_HOME)/dagster.yaml || true
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/splavu demo

test: $(STAMP)
	$(BIN)/python -m pytest

ablations: $(STAMP)
	$(BIN)/splavu ablations

bench: $(STAMP)
	$(BIN)/python benchmarks/extract.py

clean:
	rm -rf store .dagster_home
