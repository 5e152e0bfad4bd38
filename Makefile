# Two commands: `make demo` and `make test`. Both set up .venv from the lock (requirements.lock) first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export OMP_NUM_THREADS ?= 2

# torch's build: TORCH=cpu (default) or TORCH=cuda. Each has a lock of the whole set with hashes, written by `make lock`:
# requirements.lock (torch's CPU build) and requirements-cuda.lock (PyPI's CUDA build and the NVIDIA libraries it loads).
TORCH ?= cpu
LOCK_cpu := requirements.lock
LOCK_cuda := requirements-cuda.lock
LOCK := $(LOCK_$(TORCH))
ifeq ($(LOCK),)
$(error TORCH=$(TORCH): use TORCH=cpu or TORCH=cuda)
endif
STAMP := $(VENV)/.installed-$(TORCH)

.PHONY: demo test setup ui lock ablations baselines bench clean

# Exactly the lock: every package at its locked version and hash with --no-deps (the lock is the whole resolved set),
# pip itself first (its entry in the lock). The project goes in editable, built by the locked setuptools (no build
# isolation: nothing outside the lock is fetched). A .venv set up for the other torch build is started afresh.
# tests/test_install.py fails when the running environment differs from the lock.
$(STAMP): $(LOCK) pyproject.toml
	if [ -e $(VENV)/.installed-$(filter-out $(TORCH),cpu cuda) ]; then rm -rf $(VENV); fi
	test -d $(VENV) || $(PY) -m venv $(VENV)
	sed -n '/^pip==/,/[^\\]$$/p' $(LOCK) > $(VENV)/pip.lock
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r $(VENV)/pip.lock
	$(BIN)/pip install -q --require-hashes --no-deps -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed*
	touch $@

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

setup: $(STAMP) $(DAGSTER_HOME)/dagster.yaml

# The Dagster UI on http://127.0.0.1:3000 (UI_ARGS: e.g. `-p 3001`). `dagster dev` starts the webserver AND the daemon:
# a webserver alone leaves a run launched from the Launchpad waiting in the run queue (dagster.yaml's
# QueuedRunCoordinator) and never runs sensors or schedules. DAGSTER_HOME is the project's (exported above), so the
# runs of `splavu` commands show too. Stop it with Ctrl-C.
UI_ARGS ?=
ui: setup
	$(BIN)/dagster dev -w workspace.yaml $(UI_ARGS)

# Rewrites both locks from requirements.txt and requirements-dagster.txt, for CPython 3.11 on x86_64 Linux, with uv
# (installed in .lock-tools/, not in .venv). It keeps every locked version the inputs still allow; LOCK_ARGS=--upgrade
# takes the newest they allow instead. Then `make setup` and commit both locks with the inputs. The integrations' pin
# of dagster gives way to requirements.txt's (requirements-dagster.txt says why), and bokeh, which dagster-dask asks
# for only for dask's dashboard, is left out (never installed here; the cluster tests pass without it). uv reads no
# pip configuration: TORCH_CPU_WHEELS is where it finds torch's CPU build (this machine's folder of wheels, or a
# find-links page such as https://download.pytorch.org/whl/cpu/torch/).
UV_VERSION := 0.13.8
TORCH_CPU_WHEELS ?= /opt/wheels
LOCK_TOOLS := .lock-tools
LOCK_ARGS ?=
UV_COMPILE = $(LOCK_TOOLS)/bin/uv pip compile requirements.txt requirements-dagster.txt --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --generate-hashes --excludes $(LOCK_TOOLS)/excludes.txt \
	-q --custom-compile-command 'make lock' $(LOCK_ARGS)
lock:
	test -d $(LOCK_TOOLS) || $(PY) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install -q uv==$(UV_VERSION)
	echo bokeh > $(LOCK_TOOLS)/excludes.txt
	grep '^dagster==' requirements.txt > $(LOCK_TOOLS)/overrides-cuda.txt
	sed -n 's/^torch==\([^ ]*\).*/torch==\1+cpu/p' requirements.txt | cat $(LOCK_TOOLS)/overrides-cuda.txt - \
		> $(LOCK_TOOLS)/overrides-cpu.txt
	$(UV_COMPILE) --overrides $(LOCK_TOOLS)/overrides-cpu.txt --find-links $(TORCH_CPU_WHEELS) -o $(LOCK_cpu)
	$(UV_COMPILE) --overrides $(LOCK_TOOLS)/overrides-cuda.txt -o $(LOCK_cuda)

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
