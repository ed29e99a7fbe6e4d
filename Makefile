# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8000
FLOWER_PORT ?= 5555
# The inbox stream server (uvicorn: SSE, /inbox/v1/, widget and demo page).
STREAM_PORT ?= 8010
export STREAM_PORT
# Everything started from this Makefile is development mode: DEBUG on, the built-in SECRET_KEY, cookies over
# plain HTTP. Without DEVELOPMENT=true the settings refuse to start with no SECRET_KEY (docs/security.md).
DEV := DEVELOPMENT=true DEBUG=true

# Lock files: requirements.txt (runtime, what the image installs) and requirements-dev.txt (everything for
# tests, lint, benchmarks and `make run`), compiled with hashes from requirements.in / requirements-dev.in.
# Add a dependency to the .in file, then run `make lock`; never edit the .txt files by hand.
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links

.PHONY: run test typecheck lint format services migrate demo bench clean lock

# The Python client is installed for its tests (tests/test_client_python.py); its only dependency, httpx, is
# in the development lock, and a hashed lock file cannot name a local path, hence a second install, --no-deps.
CLIENT_SOURCES := clients/python/pyproject.toml $(wildcard clients/python/src/notifier_client/*)

$(VENV)/.installed: requirements.txt requirements-dev.txt $(CLIENT_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --no-deps ./clients/python
	touch $@

## Recompile both lock files from the .in files (keeps existing pins unless a requirement changed).
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "$$(grep -o '^pip-tools==[^ ]*' requirements-dev.in)"
	$(PIP_COMPILE) --output-file=requirements.txt requirements.in
	$(PIP_COMPILE) --output-file=requirements-dev.txt requirements-dev.in

services: $(VENV)/.installed
	@$(DEV) $(PY) manage.py check_services --create-db

migrate: services
	$(DEV) $(PY) manage.py migrate --noinput

demo: migrate
	@$(DEV) $(PY) manage.py collectstatic --noinput -v0
	@$(DEV) $(PY) manage.py bootstrap_demo

## Serve the API on :$(PORT), the inbox streams on :$(STREAM_PORT), the channel, fan-out and event workers,
## beat and Flower (:$(FLOWER_PORT)). Flower is optional: if it cannot start (its port is taken), the rest keeps running.
run: demo
	@echo "Development mode ($(DEV)): built-in SECRET_KEY, plain-HTTP cookies. Not for production (docs/operations.md)."
	$(DEV) PORT=$(PORT) FLOWER_PORT=$(FLOWER_PORT) $(VENV)/bin/honcho start -f Procfile -p $(PORT)

## Run the test suite against the real PostgreSQL, RabbitMQ and Redis, after the lint, the import contract and the
## OpenAPI schema, which must generate without a single warning (docs/api.md, "The schema and how views are written").
test: services
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) scripts/import_graph.py
	DEVELOPMENT=true $(VENV)/bin/mypy .
	$(DEV) $(PY) manage.py spectacular --validate --fail-on-warn --file var/openapi.yml
	$(VENV)/bin/pytest

## Check the type annotations of the whole project (configuration and baseline: pyproject.toml, docs/decisions.md).
typecheck: $(VENV)/.installed
	DEVELOPMENT=true $(VENV)/bin/mypy .

## Ruff, then the import contract: layers and forbidden imports (pyproject.toml), and no import circles.
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) scripts/import_graph.py

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf var .pytest_cache .ruff_cache .mypy_cache
