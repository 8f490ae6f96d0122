# User-facing targets: `make demo`, `make test` and `make test-long` (CI runs both test
# targets). Both set everything up from
# nothing: a .venv, torch pinned to the CPU wheel first (an unpinned torch pulls GBs of
# CUDA packages), then this project with its dev extra.
PYTHON ?= python3
# pytest-xdist workers for `make test`: 2, one per core of the 2-core CI box. Measured
# on a clean clone there (d6185ff, 2026-11-25, quiet box, one run): 1183 tests in 3 min 51 s with
# 2 workers (6 min 12 s before simulations forked their processes from a preloaded
# fork server, spherecal/simulate/launch.py). The tests keep both cores busy (one
# federation test alone uses about one core: 62 CPU-s in ~56 s), so more workers than
# cores only add contention. Each test file stays on one worker (--dist loadfile);
# integration tests are safe in parallel (ports from 0, dirs from tmp_path).
# The files are queued longest first (tests/conftest.py, from the measured seconds
# in tests/durations.json; --no-loadscope-reorder keeps xdist from re-sorting them by
# their number of tests): a two-minute file no longer starts last while the other
# worker idles. `make test TEST_WORKERS=0` runs in one process (better on a box already
# loaded by other work), `TEST_WORKERS=auto` one worker per CPU. CI (.ci/run) uses 2 as
# well: 3 were faster for both tiers (2026-11-26, same clone, quiet, one run each: 538 s
# with 2 workers, 82% of the two cores busy; 477 s with 3, 91%) but starved the Ray
# engine test's local cluster (setup 114 s against a 180 s actor start timeout).
TEST_WORKERS ?= 2
# Which tests `make test` runs: `everyday` (the default: all but those marked `long`),
# or `all` (both tiers in one pytest session; CI, .ci/run: one session has one idle
# tail and one collection, two sessions have two).
TEST_TIERS ?= everyday
TIER_MARK_everyday := -m "not long"
TIER_MARK_all :=
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-long tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# One pip run: torch pinned to the CPU wheel (an unpinned torch pulls GBs of CUDA
# packages) and this project with its extras, resolved once. First the venv's pip is
# replaced by a pinned newer one: the venv's own (23.2.1, bundled with Python 3.11)
# spends ~100 CPU-s resolving, almost all of it matching the index's 150,000 file
# links against the platform's wheel tags; 26.3 resolves the same 107 packages (same
# versions) in ~17 s. Without that version on the index the install goes on with the
# venv's pip, only slower. The .pyc files must be written once here: where
# PYTHONDONTWRITEBYTECODE is set (the CI box sets it) nothing else ever writes them,
# and every worker and every participant process would compile torch from source at
# each import (a clean-clone CI run without them: 149 s to collect). pip compiles them
# one file at a time (~55 CPU-s for 14,000 files, one core while the other idles), so
# pip installs with --no-compile and compileall writes them on every core. Its status
# is not checked: one file of torch's own tests is Python 3.12 syntax and compiles
# nowhere (pip skips it the same way).
# setup.py builds the optional native masking kernel (crypto/_maskkernel.c, issue #24)
# and the canonical encoding's hot paths (crypto/_fastcodec.c) in place during the
# editable install; a changed kernel reinstalls. Without a compiler
# or the OpenSSL headers the install goes on and the numpy path runs (same bytes).
$(STAMP): $(BIN)/python pyproject.toml setup.py crypto/_maskkernel.c crypto/_aesctr.c \
        crypto/_aesctr.h crypto/_aesctr_body.h crypto/_fastcodec.c
	$(BIN)/python -m pip install --disable-pip-version-check -q pip==26.3 \
		|| echo "make: pip 26.3 not found; installing with the venv's own pip (slower)"
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-compile torch==2.13.0 \
		-e ".[dev,ray]"
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
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
# `make test TEST_TIERS=all`, both tiers in one session, so nothing is skipped there.
# Split so that the everyday loop stays short.
# --durations=15: every run names its slowest tests, where the time budget goes.
# mypy runs beside the tests, its report printed after them: alone it is about a
# minute of one core on a clean clone (no cache) while the other core idles; beside
# the tests it shares both. Either failing fails `make test`.
# SPHERECAL_TEST_TIMELINE=<dir> records which file ran on which worker, when;
# `python bench/ci_timeline.py <dir>` summarises it (tests/schedule.py).
test: $(STAMP) tools
	@case "$(TEST_TIERS)" in everyday|all) ;; \
	  *) echo "make test: TEST_TIERS is everyday or all, not '$(TEST_TIERS)'"; exit 2;; esac
	$(BIN)/ruff check .
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & typing=$$!; \
	$(BIN)/python -m pytest $(XDIST) $(TIER_MARK_$(TEST_TIERS)) --durations=15; tests=$$?; \
	wait $$typing; typed=$$?; echo "mypy (ran beside the tests):"; cat $(VENV)/mypy.log; \
	test $$tests = 0 && test $$typed = 0

test-long: $(STAMP) tools
	$(BIN)/python -m pytest $(XDIST) -m long --durations=15
