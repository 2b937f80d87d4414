# The two commands: `make demo` runs a local job, `make test` runs the whole suite.
# Both set up everything they need on a fresh Debian/Ubuntu machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= dev,docs,tensorflow,jax,fast,exporter
PYTEST_ARGS ?=

.PHONY: all demo test test-core soak lint docs dist venv redis-server prometheus bench bench-quick clean

all: lint test

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $(STAMP)

venv: $(STAMP)

# The tests start their own redis-server processes on free ports; they only
# need the binary. Install it when missing and we may (root), else say how.
redis-server:
	@if command -v redis-server >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing redis-server (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	else \
		echo "redis-server is missing: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis)" >&2; \
		exit 1; \
	fi

# The Prometheus tests start their own server on a free port and run promtool:
# Debian's package has both. Without recommends (no node exporter); where
# systemd runs, the package also starts a service on :9090 that no test uses.
prometheus:
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing prometheus and promtool (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	else \
		echo "prometheus and promtool are missing: install them (Debian/Ubuntu: sudo apt-get install prometheus; macOS: brew install prometheus)" >&2; \
		exit 1; \
	fi

demo: venv
	$(VENV)/bin/stepbarrier demo $(DEMO_ARGS)

test: venv redis-server prometheus
	$(PY) -m pytest $(PYTEST_ARGS)

test-core: venv redis-server prometheus
	$(PY) -m pytest -m "not tensorflow and not reliability" $(PYTEST_ARGS)

# A long run of the stateful fault test (tests/reliability/test_protocol_stateful.py):
# new random examples for SOAK_SECONDS (20 minutes by default; e.g. make soak
# SOAK_SECONDS=3600), the whole run stopped by `timeout` 15 minutes after that at
# the latest. A failure prints its minimal example and a @reproduce_failure blob.
SOAK_SECONDS ?= 1200
soak: venv redis-server
	STEPBARRIER_SOAK_SECONDS=$(SOAK_SECONDS) timeout $$(( $(SOAK_SECONDS) + 900 )) \
		$(PY) -m pytest tests/reliability/test_protocol_stateful.py $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check stepbarrier
	$(VENV)/bin/mypy stepbarrier
	$(VENV)/bin/lint-imports --no-cache

# The documentation site: --strict turns a broken link, a missing page or an
# unresolved API reference into a failure.
docs: venv
	$(VENV)/bin/mkdocs build --strict --site-dir site

# The sdist and wheel as PyPI would get them, checked by twine.
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

bench: venv redis-server
	$(PY) bench/run_all.py

bench-quick: venv redis-server
	$(PY) bench/run_all.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist site *.egg-info
