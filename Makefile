# Two user-facing targets: `make demo` and `make test`. Both set everything up from
# nothing: a .venv, torch pinned to the CPU wheel first (an unpinned torch pulls GBs of
# CUDA packages), then this project with its dev extra.
PYTHON ?= python3
# pytest-xdist workers for `make test`: 2, one per core of the 2-core CI box. Measured
# on a clean clone there (session 5, quiet box, one run): 1183 tests in 3 min 51 s with
# 2 workers (6 min 12 s before simulations forked their processes from a preloaded
# fork server, spherecal/simulate/launch.py). Each test file stays on one worker
# (--dist loadfile); integration tests are safe in parallel (ports from 0, dirs from
# tmp_path). `make test TEST_WORKERS=0` runs in one process (better on a box already
# loaded by other work), `TEST_WORKERS=auto` one worker per CPU.
TEST_WORKERS ?= 2
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev,ray]"
	touch $(STAMP)

# The default federation: a coordinator and 10 participants as separate processes on
# loopback, digits, Dirichlet α = 0.1, FFC and CCVR through secure aggregation.
demo: $(STAMP)
	$(BIN)/spherecal simulate --participants 10 --alpha 0.1 --calibration ffc,ccvr \
		--secure --out demo-out

# The HTML audit report is tested in a real headless Chromium (Debian package); install
# it when missing and we can (root, apt-get), otherwise that test skips and says why.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	      || echo "make test: could not install chromium; the HTML report test will skip"; \
	  else echo "make test: no chromium and cannot install it (needs root and apt-get); the HTML report test will skip"; fi; }
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
