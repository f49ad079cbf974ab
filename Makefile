# Two commands on a fresh machine:  `make demo`  (the main job)  and  `make test`.
# Each creates .venv and installs the package with its dependencies if needed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench bench-gpu clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tilegemm demo

# Plain tests (API, CPU, OpenCL on PoCL, PTX/nvJitLink) in one process, then every CUDA
# rung on numba's CUDA simulator in a second one (the simulator must be chosen before
# numba.cuda is first imported).
test: $(STAMP) lint
	$(PY) -m pytest -q -m "not cudasim"
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -q -m cudasim

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not cudasim and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
