# The two commands a newcomer needs: `make demo` and `make test`. Each sets up everything it
# uses in a project-local virtualenv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TOOLS := .venv-tools
CHECKOV_VERSION := 3.3.30

.PHONY: demo test lint services tools bench fuzz clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,report]'
	touch $(STAMP)

## Replay the shipped Alibaba trace through the default policy and the baselines; write
## report/report.{json,md,html} and print the summary.
demo: $(STAMP)
	$(BIN)/gpu-autoscaler report --out report

## Lint, type-check and run the whole test suite (installs Slurm, Redis, Prometheus, PostgreSQL
## and podman first, and checkov in its own virtualenv: the tests run against real ones).
test: lint services tools
	$(BIN)/pytest -n 2 -q

services:
	./scripts/install-test-services.sh

## checkov (tests/test_terraform.py) in its own virtualenv: its pins clash with the project's.
tools: $(TOOLS)/bin/checkov

$(TOOLS)/bin/checkov: tools-constraints.txt
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet -c tools-constraints.txt checkov==$(CHECKOV_VERSION)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Benchmarks print figures; they are not part of `make test`.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

## The long fuzz run for before a release (~30 min): every input boundary, 10x the inputs that
## found issue 15's bugs; prints the table of tracebacks, hangs and silent wrong answers.
fuzz: $(STAMP) services
	FUZZ_PROFILE=fuzz $(BIN)/pytest -n 2 -q tests/fuzz
	$(BIN)/python bench/fuzz_table.py --inputs 20000

clean:
	rm -rf $(VENV) $(TOOLS) report .pytest_cache .mypy_cache .ruff_cache .hypothesis
