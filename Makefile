# `make run` serves on 127.0.0.1:8000; `make test` runs linters and the whole suite.
# Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint pytest fuzz openapi bench instructions soak clean

$(BIN)/grounding: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

run: $(BIN)/grounding
	$(BIN)/grounding serve

test: lint pytest

lint: $(BIN)/grounding
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

pytest: $(BIN)/grounding
	$(BIN)/pytest $(PYTEST_ARGS)

# schemathesis over every operation of openapi.yaml against `grounding serve` on a scratch
# embedded database, with a key of each scope (tests/fuzz.py). Takes about three minutes.
fuzz: $(BIN)/grounding
	$(BIN)/python -m tests.fuzz $(FUZZ_ARGS)

openapi: $(BIN)/grounding
	$(BIN)/grounding openapi > openapi.yaml

# The benchmark (README, Benchmark): needs wrk (`apt-get install wrk`), and py-spy for its
# profiles (`$(BIN)/pip install py-spy`, or BENCH_ARGS=--no-profile). Takes about 45 minutes.
bench: $(BIN)/grounding
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# The service's own work per request, in one process (README, Instructions per request);
# INSTRUCTIONS_ARGS=--callgrind counts instructions under valgrind.
instructions: $(BIN)/grounding
	$(BIN)/python -m bench.instructions $(INSTRUCTIONS_ARGS)

# A steady mixed load on a served instance (README, Soak); SOAK_ARGS=--seconds 60 for a short one.
soak: $(BIN)/grounding
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .grounding .pytest_cache .mypy_cache .ruff_cache
