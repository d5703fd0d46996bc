# trimq — every set-up step lives here, so a fresh clone needs only `make test` / `make run`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck imports unit run bench clean help

help:
	@echo "make run    start the broker with embedded defaults (data in ./data)"
	@echo "make test   create .venv, install, run ruff, mypy --strict, import-linter, pytest"
	@echo "make bench  run the benchmarks in benchmarks/"

# The venv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,analytics]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck imports unit

run: $(STAMP)
	$(BIN)/python -m broker --data-dir ./data

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_protocol
	$(BIN)/python -m benchmarks.bench_store

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .interop
