# `make run` serves on 127.0.0.1:8000; `make test` runs linters and the whole suite.
# Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint pytest openapi bench clean

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
	$(BIN)/pytest

openapi: $(BIN)/grounding
	$(BIN)/grounding openapi > openapi.yaml

# The benchmark (README, Benchmark): needs wrk (`apt-get install wrk`), and py-spy for its
# profiles (`$(BIN)/pip install py-spy`, or BENCH_ARGS=--no-profile). Takes about 45 minutes.
bench: $(BIN)/grounding
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .grounding .pytest_cache .mypy_cache .ruff_cache
