# gpucloud developer entry points. `make help` lists them.
#
# Environment setup is incremental: the virtual environment is reinstalled
# only when the lock file (or pyproject.toml) changes, and `npm ci` runs only
# when node_modules/ is missing or package-lock.json changes. Each install
# records what it installed in a stamp file, so a second `make run` starts
# straight away.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core and one more, since much of the suite waits on Docker,
# browsers and subprocesses rather than computing. TEST_WORKERS=0 runs it in this process (a debugger, -x).
# Whole files go to one worker (--dist loadfile): their module fixtures are set up once. At most 8: each
# worker has a database, a Redis database (of 14: tests/conftest.py) and browsers of its own.
TEST_WORKERS ?= $(shell n=$$(( $$(nproc) + 1 )); echo $$(( n > 8 ? 8 : n )))
# `make run PORT=8080 HOST=0.0.0.0 DEMO=1`: where the console listens (default GPUCLOUD_PORT, else 8000, on
# GPUCLOUD_HOST, else 127.0.0.1), and DEMO=1 adds the simulated demo fleet (`gpucloud up --demo`).
PORT ?=
HOST ?=
DEMO ?=
UP_ARGS = $(strip $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST)) $(if $(filter-out 0,$(DEMO)),--demo))

PY_STAMP := $(VENV)/.gpucloud-installed
NPM_STAMP := node_modules/.gpucloud-installed
PIP := $(VENV)/bin/python -m pip --disable-pip-version-check
# pip's own output, a few hundred lines, condensed into a few lines of progress (tools/install_progress.py).
PIP_PROGRESS := $(VENV)/bin/python tools/install_progress.py

# Production-like settings for `make deploy-check`; the secret is generated on
# each run and never written anywhere.
DEPLOY_ENV := DEBUG=0 \
	ALLOWED_HOSTS=gpucloud.example.com \
	NOTEBOOK_ORIGIN=https://nb-{id}.apps.example.net \
	REDIS_URL=redis://127.0.0.1:6379/0 \
	DATABASE_URL=postgres://gpucloud:gpucloud@127.0.0.1:5432/gpucloud

.PHONY: help run test lint deploy-check env env-dev node-env assets

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

run: env assets ## serve the console on http://127.0.0.1:8000 (PORT=, HOST=, DEMO=1; embedded mode, data in ./data)
	@echo "Starting the console: gpucloud up $(UP_ARGS)"
	@exec $(VENV)/bin/gpucloud up $(UP_ARGS)

# Distributed settings (REDIS_URL set) require a SECRET_KEY; a test run gets a
# throwaway one unless the caller brings their own.
test: env-dev assets ## run the test suite (PYTEST_ARGS=... to pass arguments to pytest)
	SECRET_KEY="$${SECRET_KEY:-$$($(VENV)/bin/python -c 'import secrets; print(secrets.token_urlsafe(48))')}" \
	$(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

lint: env-dev ## ruff, formatting, mypy, import contracts, tenant scoping (tools/scoping_allowlist.toml), dead code
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python tools/check_scoping.py
	$(VENV)/bin/vulture

deploy-check: env-dev ## Django's deployment checks under production-like settings
	SECRET_KEY="$$($(VENV)/bin/python -c 'import secrets; print(secrets.token_urlsafe(48))')" \
	$(DEPLOY_ENV) $(VENV)/bin/python manage.py check --deploy --fail-level WARNING

# --- environment ------------------------------------------------------------

# $(call python_env,LOCK): make .venv hold exactly LOCK plus gpucloud itself
# (editable), unless the stamp says it already does.
define python_env
	@test -x $(VENV)/bin/python || { echo "Creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@want="$(1) $$(cat $(1) pyproject.toml client/pyproject.toml | sha256sum | cut -d' ' -f1)"; \
	if [[ "$$(cat $(PY_STAMP) 2>/dev/null)" != "$$want" ]]; then \
		total=$$(grep -c '^[a-z0-9]' $(1)); \
		echo "Installing $(1) into $(VENV): $$total Python packages (a minute or two the first time)"; \
		rm -f $(PY_STAMP); \
		$(PIP) install --progress-bar off -r $(1) | $(PIP_PROGRESS) --total $$total; \
		echo "  installing gpucloud itself (editable)"; \
		$(PIP) install --quiet --no-deps -e .; \
		if [[ "$(1)" == requirements-dev.lock ]]; then \
			echo "  installing the command-line client (editable; its dependencies are in the lock)"; \
			$(PIP) install --quiet --no-deps -e client; \
		fi; \
		echo "$$want" > $(PY_STAMP); \
	fi
endef

env: ## virtual environment with the runtime dependencies
	$(call python_env,requirements.lock)

env-dev: ## virtual environment with the runtime and development dependencies
	$(call python_env,requirements-dev.lock)

# Install scripts are skipped: none of the packages needs one, and
# swagger-ui-dist's (scarf) would phone home.
node-env:
	@want="$$(sha256sum package-lock.json | cut -d' ' -f1)"; \
	if [[ "$$(cat $(NPM_STAMP) 2>/dev/null)" != "$$want" ]]; then \
		echo "Installing the browser packages of package-lock.json into node_modules (npm ci)"; \
		npm ci --ignore-scripts --no-audit --no-fund --loglevel=notice; \
		echo "$$want" > $(NPM_STAMP); \
	fi

assets: node-env ## copy the browser dependencies into frontend/static/vendor/
	@node frontend/build_assets.mjs
