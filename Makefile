# Lethe: `make run` starts the console, `make test` runs every test. Both set up what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := run

VENV := .venv
PY := $(VENV)/bin/python
# Each stamp names the exact lock (and pyproject.toml, for the editable install) it installed.
RUNTIME_STAMP := $(VENV)/.runtime-$(shell cat pyproject.toml requirements/runtime.txt 2>/dev/null | sha1sum | cut -c1-12)
TEST_STAMP := $(VENV)/.test-$(shell cat requirements/test.txt 2>/dev/null | sha1sum | cut -c1-12)
PIP_INSTALL = $(1)/bin/python -m pip install --quiet --disable-pip-version-check
LOCK_VENV := .venv-lock
PG_URL ?= postgres://postgres@127.0.0.1:5432/lethe
HOST ?= 127.0.0.1
PORT ?= 8000
# `make run` logs readable lines; deployments keep the default, JSON (see docs/deploy.md).
LOG_FORMAT ?= text

# Python 3.12+: the pyenv-selected 3.12 (see .python-version), else any python3.12/3.13 on PATH.
PYTHON ?= $(shell for c in python3.12 python3.13 $$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null) python3; do \
	if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then command -v $$c; break; fi; done)

.PHONY: setup setup-runtime lock system-packages browser run test test-sqlite test-postgres test-e2e lint bench-seed soak messages

## setup: the shared, idempotent install step (venv from the locks, runtime and test tools;
## gettext; a secret key for local runs).
setup: $(RUNTIME_STAMP) $(TEST_STAMP) system-packages var/secret-key

# A random key kept for this checkout (mode 0600); settings read it when SECRET_KEY is unset.
var/secret-key:
	@mkdir -p -m 700 var
	@(umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@.tmp && mv $@.tmp $@)

## setup-runtime: the runtime lock only (what `make run` needs; no test tools).
## (No gettext: the compiled catalogs are committed; `make run` and `make messages` need it.)
setup-runtime: $(RUNTIME_STAMP) var/secret-key

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is required (pyenv install 3.12)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Exactly the locked files: every pin checked against its SHA-256, nothing resolved here.
$(RUNTIME_STAMP): pyproject.toml requirements/runtime.txt | $(VENV)/bin/python
	@$(PY) requirements/locks.py check >/dev/null
	$(call PIP_INSTALL,$(VENV)) --require-hashes --no-deps -r requirements/runtime.txt
	$(call PIP_INSTALL,$(VENV)) --no-deps -e .
	@rm -f $(VENV)/.runtime-* $(VENV)/.installed-*
	@touch $@

$(TEST_STAMP): requirements/test.txt $(RUNTIME_STAMP)
	$(call PIP_INSTALL,$(VENV)) --require-hashes --no-deps -r requirements/test.txt
	@rm -f $(VENV)/.test-*
	@touch $@

## lock: recompile requirements/*.txt from pyproject.toml; run it after changing dependencies or
## merging a branch that did, and commit requirements/. Pins move only where they must;
## `make lock UPGRADE=1` moves every pin to the newest allowed version.
lock:
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is required (pyenv install 3.12)"; exit 1; }
	@test -x $(LOCK_VENV)/bin/python || $(PYTHON) -m venv $(LOCK_VENV)
	$(call PIP_INSTALL,$(LOCK_VENV)) --require-hashes --no-deps -r requirements/tools.txt
	$(LOCK_VENV)/bin/python requirements/locks.py compile --uv $(LOCK_VENV)/bin/uv $(if $(UPGRADE),--upgrade)

system-packages:
	@command -v msgfmt >/dev/null 2>&1 || { echo "Installing gettext"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gettext >/dev/null; }

browser:
	@test -x /usr/bin/chromium || { echo "Installing chromium"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

## run: migrate, compile translations, collect static files, seed demo data once, serve with the job cluster.
run: setup-runtime system-packages
	@mkdir -p -m 700 var
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py compilemessages -v0 --ignore=.venv
	$(PY) manage.py collectstatic --noinput -v0
	$(PY) manage.py seed_demo --if-empty
	@echo "Lethe is at http://$(HOST):$(PORT)/  (Ctrl-C stops the web server and the job cluster)"
	LOG_FORMAT=$(LOG_FORMAT) $(PY) manage.py serve $(HOST):$(PORT)

## test: lint, then the whole suite on SQLite, the same suite on PostgreSQL and the browser
## tests, the three side by side (each prints its output when it ends; any failure fails).
test: setup browser lint
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-sqlite test-postgres test-e2e

lint:
	$(PY) requirements/locks.py check
	$(VENV)/bin/ruff check .
	$(PY) manage.py makemigrations --check --dry-run -v0
	$(PY) manage.py retention_table --check

test-sqlite:
	@echo "== Test suite on SQLite"
	env -u DATABASE_URL $(PY) -m pytest -q --durations=10

test-postgres:
	@echo "== Test suite on PostgreSQL"
	@if $(PY) -c "import psycopg,sys; psycopg.connect('$(PG_URL)'.rsplit('/',1)[0] + '/postgres', connect_timeout=3).close()" 2>/dev/null; then \
		DATABASE_URL=$(PG_URL) $(PY) -m pytest -q --durations=10; \
	elif [ "$$CI" = "true" ]; then \
		echo "PostgreSQL is unreachable at $(PG_URL); under CI that is a failure."; exit 1; \
	else \
		echo "!! PostgreSQL is unreachable at $(PG_URL): SKIPPED the PostgreSQL run (this is not a pass)."; \
	fi

test-e2e:
	@echo "== Browser tests in Chromium"
	env -u DATABASE_URL $(PY) -m pytest -q --durations=10 e2e

## bench-seed: how long seeding 100,000 items takes, in a scratch database (prints the figure).
BENCH_ITEMS ?= 100000
bench-seed: setup
	rm -rf var/bench && mkdir -p var/bench
	env -u DATABASE_URL -u ENGINE_HOME LETHE_VAR_DIR=var/bench SECRET_KEY_FILE=var/secret-key $(PY) manage.py migrate -v0
	env -u DATABASE_URL -u ENGINE_HOME LETHE_VAR_DIR=var/bench SECRET_KEY_FILE=var/secret-key $(PY) manage.py bench_seed --items $(BENCH_ITEMS)

## soak: two web servers and two job clusters on one PostgreSQL database (SOAK_URL, dropped and
## recreated) and one engine folder, SOAK_CLIENTS API clients for SOAK_SECONDS, one cluster
## killed and restarted; prints JSON figures, exits 1 on lost or duplicated work (docs/deploy.md).
SOAK_SECONDS ?= 180
SOAK_CLIENTS ?= 4
SOAK_URL ?= $(PG_URL)_soak
soak: setup-runtime
	@DATABASE_URL=$(SOAK_URL) ENGINE_HOME=$(CURDIR)/var/soak-engine LOG_FORMAT=json \
		$(PY) manage.py soak --seconds $(SOAK_SECONDS) --clients $(SOAK_CLIENTS)

## messages: refresh the catalogs after changing copy, then translate locale/es and run again.
messages: setup
	$(PY) manage.py makemessages -l en -l es --no-obsolete --add-location file --ignore=.venv --ignore=staticfiles
	$(PY) manage.py compilemessages --ignore=.venv
