# User-facing targets: `make demo`, `make test` and `make test-long` (CI runs both test
# targets). Both set everything up from
# nothing: a .venv, torch pinned to the CPU wheel first (an unpinned torch pulls GBs of
# CUDA packages), then this project with its dev extra.
PYTHON ?= python3
# pytest-xdist workers for `make test`: 2, one per core of the 2-core CI box. Measured
# on a clean clone there (d6185ff, 2026-11-25, quiet box, one run): 1183 tests in 3 min 51 s with
# 2 workers (6 min 12 s before simulations forked their processes from a preloaded
# fork server, spherecal/simulate/launch.py). Each test file stays on one worker
# (--dist loadfile); integration tests are safe in parallel (ports from 0, dirs from
# tmp_path). `make test TEST_WORKERS=0` runs in one process (better on a box already
# loaded by other work), `TEST_WORKERS=auto` one worker per CPU.
TEST_WORKERS ?= 2
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-long tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# setup.py builds the optional native masking kernel (crypto/_maskkernel.c, issue #24)
# in place during the editable install; a changed kernel reinstalls. Without a compiler
# or the OpenSSL headers the install goes on and the numpy path runs (same bytes).
$(STAMP): $(BIN)/python pyproject.toml setup.py crypto/_maskkernel.c crypto/_aesctr.c \
        crypto/_aesctr.h crypto/_aesctr_body.h
	$(BIN)/python -m pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev,ray]"
	touch $(STAMP)

# The default federation: a coordinator and 10 participants as separate processes on
# loopback, digits, Dirichlet α = 0.1, FFC and CCVR through secure aggregation.
demo: $(STAMP)
	$(BIN)/spherecal simulate --participants 10 --alpha 0.1 --calibration ffc,ccvr \
		--secure --out demo-out

# Tools from outside Python check us independently (Debian packages): headless
# Chromium renders the HTML audit report; Go's standard library (golang-go) loads
# every certificate `spherecal certs` issues and does mutual TLS with a coordinator;
# promtool (prometheus) checks the metrics; curl and jq as an operator uses them
# (tests/interop/). Installed when missing and we can (root, apt-get; about 35 s for
# golang-go and prometheus on the CI box), otherwise those tests skip and say why.
TEST_TOOLS := chromium:chromium go:golang-go promtool:prometheus curl:curl jq:jq
tools:
	@missing=""; for pair in $(TEST_TOOLS); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "make test: could not install$$missing; the tests needing them will skip"; \
	  else echo "make test: missing$$missing and cannot install (needs root and apt-get); the tests needing them will skip"; fi; fi

# `make test`: ruff, mypy and every test except those marked `long` (whole federations
# run end to end in real processes, tens of seconds each: chaos and crash runs,
# the wheel install, acceptance runs). `make test-long` runs exactly those; CI runs
# both, so nothing is skipped there. Split so that the everyday loop stays short.
# --durations=15: every run names its slowest tests, where the time budget goes.
test: $(STAMP) tools
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not long" --durations=15

test-long: $(STAMP) tools
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m long --durations=15
