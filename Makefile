# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8000
# The inbox stream server (uvicorn: SSE, /inbox/v1/, widget and demo page).
STREAM_PORT ?= 8010
export STREAM_PORT
HIGH_QUEUES := push.high,email.high,sms.high,inapp.high,webhook.high
LOW_QUEUES := push.low,email.low,sms.low,inapp.low,webhook.low
# Everything started from this Makefile is development mode: DEBUG on, the built-in SECRET_KEY, cookies over
# plain HTTP. Without DEVELOPMENT=true the settings refuse to start with no SECRET_KEY (docs/security.md).
DEV := DEVELOPMENT=true DEBUG=true

.PHONY: run test lint format services migrate demo bench clean

# The Python client is installed for its tests (tests/test_client_python.py); its only dependency, httpx, is
# pinned in requirements-dev.txt, and a hashed lock file cannot name a local path, hence --no-deps.
CLIENT_SOURCES := clients/python/pyproject.toml $(wildcard clients/python/src/notifier_client/*)

$(VENV)/.installed: requirements.txt requirements-dev.txt $(CLIENT_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --no-deps ./clients/python
	touch $@

services: $(VENV)/.installed
	@$(DEV) $(PY) manage.py check_services --create-db

migrate: services
	$(DEV) $(PY) manage.py migrate --noinput

demo: migrate
	@$(DEV) $(PY) manage.py collectstatic --noinput -v0
	@$(DEV) $(PY) manage.py bootstrap_demo

## Serve the API on :$(PORT), the inbox streams on :$(STREAM_PORT), the channel, fan-out and event workers, beat and Flower (:5555).
run: demo
	@echo "Development mode ($(DEV)): built-in SECRET_KEY, plain-HTTP cookies. Not for production (docs/operations.md)."
	$(DEV) PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile -p $(PORT)

## Run the test suite against the real PostgreSQL, RabbitMQ and Redis.
test: services
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf var .pytest_cache .ruff_cache
