# trimq — every set-up step lives here, so a fresh clone needs only `make test` / `make run`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Latency events the analytics job reads (benchmarks/seed_experiment.py writes them here by
# default) and where its Parquet tables, report.md and plots go.
EVENTS ?= data/seed-events
ANALYTICS_OUT ?= reports/analytics

.PHONY: test lint typecheck imports unit run bench demo analyze clean help

help:
	@echo "make run    start the broker with embedded defaults (data in ./data)"
	@echo "make test   create .venv, install, run ruff, mypy --strict, import-linter, pytest"
	@echo "make bench  run the benchmarks in benchmarks/"
	@echo "make demo   etcd + name server + two master/replica broker groups + demo clients as local processes (a failover midway), then analytics"
	@echo "make analyze  PySpark job over EVENTS=$(EVENTS) -> $(ANALYTICS_OUT)/report.md"

# The venv is rebuilt whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,analytics]'
	touch $(STAMP)

# Debian's docker-compose validates docker/compose.yaml in the tests (no engine needed).
COMPOSE := $(VENV)/.compose
$(COMPOSE):
	command -v docker-compose >/dev/null 2>&1 \
	  || DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1 \
	  || (apt-get update -q >/dev/null 2>&1 \
	      && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1) \
	  || echo "docker-compose could not be installed: the compose test will be skipped"
	touch $@

# Debian's etcd (3.4) for the HA failover tests, which start their own 3-member cluster on
# loopback and stop it by pid. policy-rc.d answers 101 during the install so the packaged
# service never starts (one is written only if none exists, and removed again). Without
# etcd the tests skip with the reason; they never fail for it.
ETCD := $(VENV)/.etcd
$(ETCD):
	command -v etcd >/dev/null 2>&1 || { \
	  own=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
	    && chmod 755 /usr/sbin/policy-rc.d && own=1; }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server etcd-client >/dev/null 2>&1 \
	  || (apt-get update -q >/dev/null 2>&1 \
	      && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server etcd-client >/dev/null 2>&1) \
	  || echo "etcd could not be installed: the HA failover tests will be skipped"; \
	  [ -z "$$own" ] || rm -f /usr/sbin/policy-rc.d; }
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP) $(COMPOSE) $(ETCD)
	$(BIN)/pytest -q

test: lint typecheck imports unit

run: $(STAMP)
	$(BIN)/python -m broker --data-dir ./data

demo: $(STAMP) $(ETCD)
	$(BIN)/python -m scripts.demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_protocol
	$(BIN)/python -m benchmarks.bench_store

# Run benchmarks/seed_experiment.py first (it fills $(EVENTS)); the job prints the report path.
analyze: $(STAMP)
	$(BIN)/python -m analytics --input $(EVENTS) --output $(ANALYTICS_OUT)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .interop
