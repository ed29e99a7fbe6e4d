# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8000
FLOWER_PORT ?= 5555
# The inbox stream server (uvicorn: SSE, /inbox/v1/, widget and demo page).
STREAM_PORT ?= 8010
export STREAM_PORT
# Its processes, each holding a share of the open streams: two on a box shared with the API, the workers and
# PostgreSQL keep a topic's message to 10,000 streams under 2 s when the box is busy (docs/decisions/0073-*.md).
STREAM_WORKERS ?= 2
# Everything started from this Makefile is development mode: the built-in SECRET_KEY, cookies over plain HTTP,
# the inbox demo page. Without DEVELOPMENT=true the settings refuse to start with no SECRET_KEY (docs/security.md).
# DEBUG stays off unless asked for (`make run DEBUG=true`): its query log and debug cursor cost every request
# (docs/decisions.md, "The accept at the floor").
DEBUG ?= false
DEV := DEVELOPMENT=true DEBUG=$(DEBUG)
# `make run FLOWER=1` adds Flower (and with it the task events every worker then sends, a price per task);
# `make run CELERY_TASK_LOGS=true` the two INFO lines per task of Celery's workers; `make run DELIVERY_SENT_LOGS=true`
# the send workers' audit line per delivery sent (other outcomes are logged either way); the API's access lines of
# requests answered below 400 at most one a second (`make run REQUEST_SUCCESS_LOG_SECONDS=0` for each; 4xx and 5xx
# are logged each either way).
FLOWER ?=
CELERY_TASK_LOGS ?= false
DELIVERY_SENT_LOGS ?= false
REQUEST_SUCCESS_LOG_SECONDS ?= 1
# Python caches each module's bytecode in __pycache__ (ignored by git) on first import. An environment that turns that
# off (PYTHONDONTWRITEBYTECODE=1) made every process `make run` and `make test` start compile Django, Celery and the
# project from source each time: 4.7 to 6.7 s of CPU to import the API and a worker, against 1.4 s from the cache.
unexport PYTHONDONTWRITEBYTECODE
RUN_PROCESSES := web worker_high worker_low worker_fanout worker_maintenance worker_events stream beat $(if $(FLOWER),flower)

# Lock files: requirements.txt (runtime, what the image installs), requirements-dev.txt (everything for
# tests, lint, benchmarks and `make run`) and requirements-bootstrap.txt (the installer), compiled with hashes
# from the .in files of the same names.
# Add a dependency to the .in file, then run `make lock`; never edit the .txt files by hand.
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links

.PHONY: run test test-fast typecheck lint format services migrate demo bench clean lock client-dist client-ts client-ts-types

# The Python client is installed for its tests (tests/project/test_client_python.py); its only dependency, httpx, is
# in the development lock, and a hashed lock file cannot name a local path, hence a second install, --no-deps.
CLIENT_SOURCES := clients/python/pyproject.toml $(wildcard clients/python/src/notifier_client/*)

# The TypeScript client (clients/typescript): Node.js 20+ and npm, its devDependencies (the compiler and the type
# generator; it has no runtime dependency) installed from package-lock.json, again whenever the lock changes.
TS_CLIENT := clients/typescript
TS_TOOLCHAIN := $(TS_CLIENT)/node_modules/.package-lock.json
NEED_NPM := command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
	echo "node and npm are missing: the TypeScript client ($(TS_CLIENT)) needs Node.js 20 or later and npm (Debian: apt-get install nodejs npm)"; exit 1; }

# pip installs only the installer, uv (requirements-bootstrap.txt), which installs the rest from the same hashed lock
# files: 10 s on a clean clone where pip took 85 s (most of it unpacking and byte-compiling; imports compile what
# they use).
$(VENV)/.installed: requirements-bootstrap.txt requirements.txt requirements-dev.txt $(CLIENT_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --require-hashes -r requirements-bootstrap.txt
	$(VENV)/bin/uv pip install --quiet --python $(PY) --require-hashes -r requirements-dev.txt
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps ./clients/python
	touch $@

## Recompile both lock files from the .in files (keeps existing pins unless a requirement changed).
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "$$(grep -o '^pip-tools==[^ ]*' requirements-dev.in)"
	$(PIP_COMPILE) --output-file=requirements-bootstrap.txt requirements-bootstrap.in
	$(PIP_COMPILE) --output-file=requirements.txt requirements.in
	$(PIP_COMPILE) --output-file=requirements-dev.txt requirements-dev.in

services: $(VENV)/.installed
	@$(DEV) $(PY) manage.py check_services --create-db

migrate: services
	$(DEV) $(PY) manage.py migrate --noinput

demo: migrate
	@$(DEV) $(PY) manage.py collectstatic --noinput -v0
	@$(DEV) INBOX_DEMO_ENABLED=true $(PY) manage.py bootstrap_demo

## Serve the API on :$(PORT), the inbox streams on :$(STREAM_PORT), the channel, fan-out and event workers and
## beat; Flower (:$(FLOWER_PORT)) with FLOWER=1. Flower is optional: if it cannot start (its port is taken), the
## rest keeps running.
run: demo
	@echo "Development mode ($(DEV)): built-in SECRET_KEY, plain-HTTP cookies, the inbox demo page. Not for production (docs/operations.md)."
	@echo "Fast by default: DEBUG=$(DEBUG) (make run DEBUG=true for tracebacks and the query log), Celery task log lines $(if $(filter true,$(CELERY_TASK_LOGS)),on,off) (CELERY_TASK_LOGS=true), a line per delivery sent $(if $(filter true,$(DELIVERY_SENT_LOGS)),on,off) (DELIVERY_SENT_LOGS=true), access lines of requests that succeeded $(if $(filter 0,$(REQUEST_SUCCESS_LOG_SECONDS)),each,at most one per $(REQUEST_SUCCESS_LOG_SECONDS) s (REQUEST_SUCCESS_LOG_SECONDS=0 for each)), Flower and task events $(if $(FLOWER),on,off) (FLOWER=1)."
	$(DEV) INBOX_DEMO_ENABLED=true CELERY_TASK_LOGS=$(CELERY_TASK_LOGS) DELIVERY_SENT_LOGS=$(DELIVERY_SENT_LOGS) REQUEST_SUCCESS_LOG_SECONDS=$(REQUEST_SUCCESS_LOG_SECONDS) PORT=$(PORT) FLOWER_PORT=$(FLOWER_PORT) STREAM_WORKERS=$(STREAM_WORKERS) \
		$(VENV)/bin/honcho start -f Procfile -p $(PORT) $(RUN_PROCESSES)

# The suite runs in two phases (docs/development.md, "How the suite runs"): every test not marked `serial` on
# TEST_WORKERS pytest-xdist workers, each in a namespace of its own, then the `serial` ones (they stop the broker,
# measure, or build clusters) one at a time with nothing else running. Most of the suite waits on real workers and
# servers, so on a 2-core machine TEST_WORKERS=3 finishes soonest (measured: docs/development.md).
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
TEST_STARTED := $(shell date +%s)

## Run the test suite against the real PostgreSQL, RabbitMQ and Redis, and beside its parallel phase the lint, the
## import contract, the types and the OpenAPI schema, which must generate without a single warning (docs/api.md, "The
## schema and how views are written"); their output follows the phase's. The TypeScript client's tests compile it
## themselves with its pinned toolchain, installed first from its lock file. The last line is the wall time of the
## whole target.
test: services $(TS_TOOLCHAIN)
	@mkdir -p var; \
	( set -e; $(MAKE) --no-print-directory lint typecheck; \
	  DEVELOPMENT=true DEBUG=true $(PY) manage.py spectacular --validate --fail-on-warn --file var/openapi.yml \
	) > var/test-checks.log 2>&1 & checking=$$!; \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not serial" --durations=40 $(PYTEST_ARGS); parallel=$$?; \
	wait $$checking; checks=$$?; cat var/test-checks.log; \
	$(VENV)/bin/pytest -m serial --durations=10 $(PYTEST_ARGS); serial=$$?; \
	[ $$serial -eq 5 ] && serial=0; \
	echo "make test: $$(( $$(date +%s) - $(TEST_STARTED) )) s wall time (pytest on $(TEST_WORKERS) workers with the lint, types and schema beside it, then the serial tests; exit codes $$parallel, $$checks and $$serial)"; \
	[ $$parallel -eq 0 ] && [ $$checks -eq 0 ] && [ $$serial -eq 0 ]

## The pure tests alone (marker `pure`: no PostgreSQL, RabbitMQ or Redis), in seconds. They run with all three
## pointed at a closed port, so a test that reaches one fails here instead of passing by luck.
test-fast: $(VENV)/.installed
	REDIS_URL=redis://127.0.0.1:9/0 NOTIFIER_TEST_AMQP=127.0.0.1:9 DATABASE_URL=postgres://nobody@127.0.0.1:9/none \
		$(VENV)/bin/pytest -m pure -q $(PYTEST_ARGS)

## Build the Python client's release artifacts (wheel and sdist) into dist/ and check them as PyPI would. The tests
## do the same in a temporary directory (tests/project/test_client_python.py), with `mypy --strict` on the package.
client-dist: $(VENV)/.installed
	rm -rf dist/notifier_client-*
	$(PY) -m build --no-isolation --outdir dist clients/python
	$(PY) -m twine check --strict dist/notifier_client-*

$(TS_TOOLCHAIN): $(TS_CLIENT)/package-lock.json $(TS_CLIENT)/package.json
	@$(NEED_NPM)
	cd $(TS_CLIENT) && npm ci --no-audit --no-fund
	touch $@

## Build the TypeScript client (tsc into clients/typescript/dist/) and its npm package into dist/ (npm pack).
client-ts: $(TS_TOOLCHAIN)
	mkdir -p dist
	rm -f dist/notifier-client-*.tgz
	cd $(TS_CLIENT) && npm pack --pack-destination ../../dist

## Regenerate the TypeScript client's types (clients/typescript/src/schema.ts) from the API's OpenAPI schema; commit
## the result (a test fails while it differs from what the schema generates).
client-ts-types: $(VENV)/.installed $(TS_TOOLCHAIN)
	DEVELOPMENT=true DEBUG=true $(PY) manage.py spectacular --file var/openapi.yml
	cd $(TS_CLIENT) && npm run generate

## Check the type annotations of the whole project (pyproject.toml; docs/decisions/0067-checked-types.md).
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
