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

.PHONY: run test lint format services migrate demo bench clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $@

services: $(VENV)/.installed
	@$(PY) manage.py check_services --create-db

migrate: services
	$(PY) manage.py migrate --noinput

demo: migrate
	@$(PY) manage.py collectstatic --noinput -v0
	@$(PY) manage.py bootstrap_demo

## Serve the API on :$(PORT), the inbox streams on :$(STREAM_PORT), the channel, fan-out and event workers, beat and Flower (:5555).
run: demo
	PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile -p $(PORT)

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
