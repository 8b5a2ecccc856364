# Two entry points: `make run` (serve the default model with demo traffic) and `make test`.
# TORCH pins the CPU build for CI and this machine; GPU users: make run TORCH=torch
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# expert-parallel ranks for `make run`: 2 where there are >= 2 cores, so all-to-all time is measured, not zero
EP ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 1)
BIN := $(VENV)/bin

.PHONY: setup run test bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

run: setup
	$(BIN)/governor serve --demo-traffic --ep $(EP)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/governor bench spec
