# Two commands on a fresh machine:
#   make run    migrate, then run a reaper and two consumers of the demo app
#               against local PostgreSQL and RabbitMQ (Ctrl-C stops them)
#   make test   create .venv, install jobq with its test extras, run pytest
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: test lint run install bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fast]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check services tests harness bench
	$(VENV)/bin/mypy

run: $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" bash deploy/run-local.sh

bench: $(VENV)/.installed
	$(PY) bench/run.py --all

clean:
	rm -rf $(VENV) .pytest_cache
