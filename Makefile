# Steady: `make demo` sets up and runs the demo study end to end; `make test` sets up, runs the checks
# (`make lint`) and then the suite.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# stamp of `make assets` (scripts/fetch-assets)
ASSETS := app/dashboard/static/.assets.json
# CPU builds for this machine and CI; GPU boxes install their own CUDA builds (docs/deploy.md).
FRAMEWORKS := torch==2.13.0 tensorflow-cpu==2.21.*

.PHONY: setup system-deps assets demo lint test test-fast bench results serve worker clean

setup: $(STAMP) system-deps $(ASSETS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(FRAMEWORKS)
	$(BIN)/pip install --quiet -e ".[server,workloads,dev]"
	touch $@

# Headless Chromium for the browser tests, docker-compose to validate the compose file, nginx to
# test the shipped proxy configuration, and Slurm with munge for the test that runs a real one-node
# Slurm cluster on loopback (Debian packages; nothing is downloaded by the test tools themselves).
system-deps:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	{ command -v slurmctld || test -x /usr/sbin/slurmctld; } >/dev/null || missing="$$missing slurm-wlm"; \
	{ command -v munged || test -x /usr/sbin/munged; } >/dev/null || missing="$$missing munge"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The dashboard's and /docs' browser assets (uPlot, Swagger UI, ReDoc): npm packages at the versions
# package-lock.json pins (integrity-checked by npm ci), copied into app/dashboard/static (git-ignored).
assets: $(ASSETS)
$(ASSETS): package.json package-lock.json scripts/fetch-assets
	@command -v npm >/dev/null || $(MAKE) --no-print-directory system-deps
	$(PYTHON) scripts/fetch-assets

demo: $(STAMP) $(ASSETS)
	$(BIN)/steady demo

# The house rules, configured in pyproject.toml (CONTRIBUTING.md): any finding fails the build.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python scripts/package-tree  # the package as one folder, which mypy and import-linter read
	$(BIN)/mypy
	$(BIN)/python scripts/lint-imports --no-cache
	$(BIN)/python scripts/check-markdown
	$(BIN)/python scripts/check-process-words
	$(BIN)/python scripts/check-figures
	$(BIN)/python scripts/check-vendored

# The suite on TEST_WORKERS parallel processes (pytest-xdist; CONTRIBUTING.md "Tests"), the slow tier included.
# Many tests wait on subprocesses (servers, workers, browsers): two more workers than cores keep both busy
# (measured on the 2-core machine: 4 workers 19 min 31 s, 3 workers 21 min 26 s, the same tree and load).
TEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup
# Bytecode caches are written even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on some CI
# images): otherwise every xdist worker re-rewrites every test module's asserts and every server, CLI and run
# process recompiles Steady's modules (measured: collection about 4 s of CPU per worker, a server 0.3 s).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

# -rfEs: every failure, error and skip with its reason. With CI=true a skip fails the run unless it is one the
# setup cannot provide (tests/skip_policy.py): in CI the real-cluster, proxy and browser tests must run.
test: setup
	@$(MAKE) --no-print-directory lint
	@$(BIN)/python scripts/machine-speed
	@$(PYTEST) -q -rfEs $(PYTEST_PARALLEL) --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here"; exit 1; fi; \
	exit $$rc

test-fast: $(STAMP)
	$(PYTEST) -q -rfEs $(PYTEST_PARALLEL) -m "not slow and not browser"

# Benchmarks write bench/results/*.json. MLflow, the ingestion reference, lives in its own venv.
MLFLOW_VENV := .venv-mlflow
$(MLFLOW_VENV)/.installed:
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet mlflow==3.17.2
	touch $@

bench: setup $(MLFLOW_VENV)/.installed
	mkdir -p bench/results
	$(BIN)/python bench/bands_bench.py
	MLFLOW_PYTHON=$(MLFLOW_VENV)/bin/python $(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/lease_bench.py
	$(BIN)/python bench/usage_check_bench.py
	$(BIN)/python bench/dashboard_bench.py
	$(BIN)/python bench/calibration_bench.py
	$(BIN)/python bench/capacity_bench.py
	$(BIN)/python bench/report_cache_bench.py
	$(BIN)/python bench/baseline_snapshot_bench.py
	$(BIN)/python bench/worker_memory_bench.py
	$(BIN)/python bench/report_bench.py

# Every published table, regenerated into the files the docs show or link to: the calibration tables (in place
# in results/calibration.md and results/*.md), the alerts' rates, the benchmarks (bench/results/*.json, `make bench`)
# and the demos' tables (results/*.txt). Hours on a 2-core machine: each doc names the one command of its table.
CALIBRATE := $(BIN)/steady calibrate
results: bench
	mkdir -p results
	$(CALIBRATE) --sims 400 --planted-sims 200 --json bench/results/calibration-doc.json --power-sims 1000 \
	    --update-doc results/calibration.md
	$(CALIBRATE) --rule out_of_band_run --rule stack_portability:equivalent --rule stack_portability:adaptive:equivalent \
	    --sims 400 --planted-sims 200 --power-sims 400 --update-doc results/calibration.md --doc-block offnormal
	$(CALIBRATE) --rule seed_stability:adaptive:unstable --rule seed_stability:adaptive:stable --sims 400 \
	    --update-doc results/adaptive-seeds-calibration.md --doc-block adaptive-seeds-calibration
	$(CALIBRATE) --rule stack_portability:adaptive:equivalent --rule stack_portability:adaptive:not_equivalent --sims 400 \
	    --update-doc results/adaptive-portability-calibration.md --doc-block adaptive-portability-calibration
	$(CALIBRATE) --rule sources:adaptive:equivalent --rule sources:adaptive:not_equivalent --sims 200 \
	    --update-doc results/sources-adaptive-calibration.md --doc-block sources-adaptive
	$(BIN)/python scripts/alert-calibration
	set -o pipefail; NO_COLOR=1 $(BIN)/steady demo --controls --variants --overlaps --keras | tee results/controls.txt
	set -o pipefail; NO_COLOR=1 $(BIN)/steady demo --controls --resume | tee results/resume-controls.txt
	set -o pipefail; NO_COLOR=1 $(BIN)/steady demo --controls --distributed | tee results/distributed-controls.txt
	set -o pipefail; NO_COLOR=1 $(BIN)/steady demo --controls --fleet | tee results/fleet-controls.txt
	set -o pipefail; $(BIN)/python -m steady.worker.inrun.localize_controls --overhead --clean 50 | tee results/localize-controls.txt
	set -o pipefail; $(BIN)/python -m steady.worker.inrun.localize_controls_keras --clean 10 | tee results/localize-controls-keras.txt
	set -o pipefail; NO_COLOR=1 $(BIN)/steady demo --sources --exit | tee results/sources-demo.txt

serve: $(STAMP) $(ASSETS)
	$(BIN)/steady serve

clean:
	rm -rf $(VENV) $(MLFLOW_VENV) .steady .steady-demo artifacts bench/results node_modules .cache
