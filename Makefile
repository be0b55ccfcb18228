# The two commands a newcomer needs: `make demo` and `make test`. Each sets up everything it
# uses in a project-local virtualenv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint services bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

## Replay the shipped Alibaba trace through the default policy and the baselines; write
## report/report.{json,md,html} and print the summary.
demo: $(STAMP)
	$(BIN)/gpu-autoscaler report --out report

## Lint, type-check and run the whole test suite (installs Slurm, Redis and Prometheus first:
## the tests run against real ones).
test: lint services
	$(BIN)/pytest -n 2 -q

services:
	./scripts/install-test-services.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Benchmarks print figures; they are not part of `make test`.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) report .pytest_cache .mypy_cache .ruff_cache .hypothesis
