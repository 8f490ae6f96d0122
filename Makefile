# Two user-facing targets: `make demo` and `make test`. Both set everything up from
# nothing: a .venv, torch pinned to the CPU wheel first (an unpinned torch pulls GBs of
# CUDA packages), then this project with its dev extra.
PYTHON ?= python3
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

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
