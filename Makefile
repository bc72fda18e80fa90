# Two commands on a fresh machine:
#   make run    migrate, then a reaper, two consumers of the demo app (restarted if
#               a demo crash job kills them) and a demo producer
#               against local PostgreSQL and RabbitMQ (Ctrl-C stops them)
#   make test   create .venv, install jobq with its test extras, run pytest
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: help test lint run install bench docs docs-serve clean

help:  ## what each target does
	@echo "make install  create .venv with jobq and what it needs to run (no test tools)"
	@echo "make test     also install the test extras, then run the suite"
	@echo "make lint     ruff and mypy --strict (CI runs it before the tests)"
	@echo "make run      migrate, then a reaper and two consumers of the demo app"
	@echo "make docs     regenerate the reference pages and build the site (site/) with --strict"
	@echo "make bench    every benchmark (bench/run.py --all, ~25 min)"
	@echo "make clean    remove .venv"
	@echo "Needs Python >= 3.11, PostgreSQL and RabbitMQ on 127.0.0.1 (README)."

# `make install` (and `make run`) install jobq to run it; `make test` and
# `make lint` add the test and lint tools, the examples' frameworks and the
# browser driver on top (~490 MB against ~60 MB).
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv --clear $(VENV)  # a half-built .venv from a failed install is redone
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[fast]'
	rm -f $(VENV)/.installed $(VENV)/.docs
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[test,fast]'
	touch $@

install: $(VENV)/.runtime

# Three workers on two cores (every test has its own database, namespace and
# logins; most of a scenario's time is waiting on leases and processes: 9m44s
# on two workers, 7m17s on three, same machine, 2026-12-04), then, alone, the
# tests that restart the shared servers (exit 5: none selected).
test: $(VENV)/.installed
	$(PY) -m pytest -n 3 --dist loadfile -m "not exclusive" $(PYTEST_ARGS)
	$(PY) -m pytest -m exclusive $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check services tests harness bench examples docs/generate.py schema/dump.py
	$(VENV)/bin/mypy

run: $(VENV)/.runtime
	PATH="$(abspath $(VENV))/bin:$$PATH" exec bash deploy/run-local.sh

# The site's builder only (the docs extra), not the test toolchain.
$(VENV)/.docs: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[docs,fast]'
	touch $@

docs: $(VENV)/.docs
	$(PY) docs/generate.py
	$(VENV)/bin/mkdocs build --strict --quiet

# Search needs a server (a browser runs it in a worker, which file:// forbids).
docs-serve: docs
	$(PY) -m http.server --directory site --bind 127.0.0.1 8000

bench: $(VENV)/.installed
	$(PY) bench/run.py --all

clean:
	rm -rf $(VENV) .pytest_cache site
