# The two commands: `make demo` runs a local job, `make test` runs the whole suite.
# Both set up everything they need on a fresh Debian/Ubuntu machine.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= dev,docs,tensorflow,jax,fast,exporter,torch
PYTEST_ARGS ?=
# `make test` runs the suite in this many pytest workers (pytest-xdist), each
# test file on one worker (--dist loadfile: a file's servers and clusters are
# its own). Most tests wait on sleeps, timeouts and other processes, so two
# workers on 2 cores take about 12 minutes instead of 22; TEST_WORKERS=0 runs
# it in one process.
TEST_WORKERS ?= 2

.PHONY: all demo test test-unit test-core test-compose docker-engine soak model lint docs docs-serve dist venv redis-server prometheus valgrind bench bench-quick clean

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

# The demo installs only what it runs (the package, TensorFlow on the CPU, and
# fakeredis for a machine without redis-server): about 600 MB, not the 2.5 GB of
# every extra that `make test` needs.
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the demo's dependencies into $(VENV): stepbarrier, TensorFlow (CPU) and fakeredis, about 600 MB (1 to 3 minutes; once)"
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e ".[demo]"
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m examples.demo $(DEMO_ARGS)

# tests/repository/test_docs_site.py loads the docs site in a headless browser (mermaid
# diagrams render client-side): Debian's chromium, installed when missing and
# we may (root), else say how.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else \
		echo "chromium is missing: install it (Debian/Ubuntu: sudo apt-get install chromium)" >&2; \
		exit 1; \
	fi

test: venv redis-server prometheus chromium
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit tests alone: no server, no process, no network (tests/unit/conftest.py
# refuses them); seconds.
test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-core: venv redis-server prometheus
	$(PY) -m pytest -m "not tensorflow and not reliability" $(PYTEST_ARGS)

# docker-compose.yml and docker-compose.cluster.yml run for real (tests/compose_run/,
# which `make test` does not collect): the job, the host's status, watch and
# /metrics, Redis killed, a worker cut off the network, the chief paused and
# killed. No registry needs to be reachable: python:3.11-slim and redis:7.2 are
# LOCAL STAND-INS built from debootstrap (ops/compose-standins/build.sh) unless
# those tags exist already, and kept for the next run. tests/compose_run/run.sh
# starts dockerd when none runs and stops it at the end. Needs root, or a user
# in the docker group with a running engine (and the images built once by root).
test-compose: venv docker-engine
	tests/compose_run/run.sh $(PY) $(PYTEST_ARGS)

# The Docker engine and CLI (Debian's docker.io) and debootstrap: installed when
# missing and we may (root), else say how.
docker-engine:
	@if command -v docker >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 \
		&& { command -v dockerd >/dev/null 2>&1 || docker info >/dev/null 2>&1; }; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing docker.io and debootstrap (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null; \
	elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then :; \
	else \
		echo "a Docker engine is missing: install and start one (Debian/Ubuntu: sudo apt-get install docker.io debootstrap), and run as root or in the docker group" >&2; \
		exit 1; \
	fi

# A long run of the stateful fault test (tests/reliability/test_protocol_stateful.py):
# new random examples for SOAK_SECONDS (20 minutes by default; e.g. make soak
# SOAK_SECONDS=3600), the whole run stopped by `timeout` 15 minutes after that at
# the latest. A failure prints its minimal example and a @reproduce_failure blob.
SOAK_SECONDS ?= 1200
soak: venv redis-server
	STEPBARRIER_SOAK_SECONDS=$(SOAK_SECONDS) timeout $$(( $(SOAK_SECONDS) + 900 )) \
		$(PY) -m pytest tests/reliability/test_protocol_stateful.py $(PYTEST_ARGS)

# The protocol model (tests/model/protocol_model.py) at large scope: every state of
# the bounded scopes `make test` explores, and of larger ones (three generations of a
# run beside another run, more faults), each scope's state count and time printed;
# some minutes on two cores. Add --fixes --limits for every counterexample:
# $(PY) -m tests.model.explore --large --fixes --limits
model: venv
	$(PY) -m tests.model.explore --large

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check stepbarrier bench
	$(VENV)/bin/mypy stepbarrier bench
	$(VENV)/bin/lint-imports --no-cache

# The documentation site: --strict turns a broken link, a missing page or an
# unresolved API reference into a failure. Open site/index.html in a browser
# (the site works from disk), or serve it: make docs-serve.
docs: venv
	$(VENV)/bin/mkdocs build --strict --site-dir site

# The site at http://$(DOCS_ADDR)/, built in memory and rebuilt (the open page
# reloaded) whenever docs/, mkdocs.yml or a docstring changes; Ctrl-C stops it.
# Only this machine reaches the default address; e.g. DOCS_ADDR=127.0.0.1:8001
# when 8000 is taken.
DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: venv
	$(VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

# The sdist and wheel as PyPI would get them, checked by twine.
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

# The instruction counts (bench/instructions.py) run the measured process under
# Callgrind: valgrind, installed when missing and we may (root), else say how.
valgrind:
	@if command -v valgrind >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing valgrind (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; \
	else \
		echo "valgrind is missing: install it (Debian/Ubuntu: sudo apt-get install valgrind)" >&2; \
		exit 1; \
	fi

bench: venv redis-server valgrind
	$(PY) -m bench

bench-quick: venv redis-server valgrind
	$(PY) -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist site *.egg-info
