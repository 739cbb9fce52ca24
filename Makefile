# verl-monitor: `make demo` runs the main job, `make test` runs every test.
# Both create .venv and install the package into it first.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint sysdeps bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/verl-monitor demo

# System packages the tests use: a real Prometheus, Alertmanager (and amtool), Chromium.
sysdeps:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	   || ! command -v prometheus-alertmanager >/dev/null || ! command -v amtool >/dev/null \
	   || ! command -v chromium >/dev/null; then \
	  echo "installing system packages: prometheus prometheus-alertmanager chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    prometheus prometheus-alertmanager chromium >/dev/null; \
	fi

lint: setup
	$(VENV)/bin/ruff check .

test: setup sysdeps lint
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/parse.py

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
