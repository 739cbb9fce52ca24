# verl-monitor: `make demo` runs the main job, `make test` runs every test,
# `make test-fast` the unit tests that start no process (no e2e, no `slow`), on 2 workers.
# All of them create .venv and install the package with every extra (`[all]`, via `[test]`).
# A training node needs only the core: `pip install verl-monitor` (exporter, detectors, analyze).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast lint sysdeps bench bench-install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,test]'
	touch $(STAMP)

setup: $(STAMP)

# `make demo SCENARIO=fully_async_demo` (or agent_loop_demo, or any scenario of
# `verl-monitor simulate --list`) plays another run; the default is the demo script.
SCENARIO ?= demo
demo: setup
	$(VENV)/bin/verl-monitor demo --scenario $(SCENARIO)

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

# pytest's default output names each test file as it runs (`tests/test_x.py ....  [ 12%]`),
# so a 30-minute run shows where it is; it still ends with pytest's closing summary line.
# The whole suite on TEST_WORKERS workers (pytest-xdist): most of its time is waiting (real-time
# playback, 15 s scrapes, server start-ups), so four workers share two cores well. Work units
# (a module with shared fixtures, or a lone test) start longest first (tests/scheduling.py,
# tests/durations.json); the run ends with its 20 slowest tests and its total
# (tests/timing_report.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
test: setup sysdeps lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# Unit tests that start no process, on FAST_WORKERS workers: the loop to run after each change.
# Tests marked `slow` (they start the CLI, an exporter, Streamlit's AppTest, promtool,
# Prometheus or wandb's service, wait on purpose, or take a second or more of CPU by design:
# whole recordings and the real-log corpus beyond the placed logs) and tests/e2e run only in
# `make test`.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: pytest then keeps its
# assert-rewritten test modules between runs instead of redoing them in every worker (~10 s of
# CPU each).
FAST_WORKERS ?= 2
test-fast: setup
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -m "not e2e and not slow" -n $(FAST_WORKERS) --dist loadgroup --no-loadscope-reorder

bench: setup
	$(PY) bench/parse.py

# Installed size and package count of each role (fresh venvs; downloads from PyPI).
bench-install: setup
	$(PY) bench/install.py

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
