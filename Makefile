# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test lint twins docs install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,embedded,sqlalchemy]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/pgdurable demo

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check pgdurable tests benchmarks examples tools
	$(VENV)/bin/mypy --strict pgdurable tools/async_to_sync.py
	$(PY) tools/async_to_sync.py --check

twins: install  # regenerate the sync twins from their async source (docs/architecture.md)
	$(PY) tools/async_to_sync.py

docs: install  # the documentation site, into ./site (open site/index.html; no network needed)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) dist build site .pgdurable
