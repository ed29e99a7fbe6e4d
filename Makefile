# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8000
FLOWER_PORT ?= 5555

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

## Serve the API on :$(PORT) with the channel workers, the fan-out worker, beat and Flower (:$(FLOWER_PORT)).
## Flower is optional: if it cannot start (its port is taken), the rest keeps running.
run: demo
	PORT=$(PORT) FLOWER_PORT=$(FLOWER_PORT) $(VENV)/bin/honcho start -f Procfile -p $(PORT)

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
