# Two commands on a fresh machine:  `make demo`  (the main job)  and  `make test`.
# Each creates .venv and installs the package with its dependencies if needed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench bench-gpu bench-gpu-system readme clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The quick benchmark (about a minute on a 2-core CPU): every rung of every usable backend
# (the CUDA simulator excluded), verified, timed, beside the vendor BLAS; ladder table last.
demo: $(STAMP)
	$(VENV)/bin/tilegemm demo

# the optimisation note's full tables on this machine's backends (sizes 8..4096; slow rungs are skipped
# at sizes their smaller runs predict to take too long).
bench: $(STAMP)
	$(VENV)/bin/tilegemm bench --full

# On a machine with an NVIDIA GPU: the standard results file, as-is. Installs CuPy for the
# cuBLAS reference (CUPY=cupy-cuda12x for a CUDA 12 driver), then writes
# benchmarks/results/<device>-<date>.{json,md,png}: ladder vs cuBLAS at 1024^3 and 4096^3,
# sizes x block sizes 8..4096, outputs-per-thread sweep, first call vs steady.
CUPY ?= cupy-cuda13x
bench-gpu: $(STAMP)
	$(PY) -c "import cupy" 2>/dev/null || $(PY) -m pip install -q "$(CUPY)" || \
	  echo "warning: no CuPy; install it or PyTorch for the cuBLAS reference column"
	$(VENV)/bin/tilegemm bench --full --backend cuda --save benchmarks/results

# The same on a machine that already has numba-cuda and CuPy/PyTorch in its system Python
# and no network (e.g. a lent GPU box): no virtual environment, the source tree as is.
bench-gpu-system:
	PYTHONPATH=src python3 -m tilegemm.cli bench --full --backend cuda --save benchmarks/results

# Plain tests (API, CPU, OpenCL on PoCL, PTX/nvJitLink) in one process, then every CUDA
# rung on numba's CUDA simulator in a second one (the simulator must be chosen before
# numba.cuda is first imported).
# The plain run spreads over the machine's cores (pytest-xdist, TEST_JOBS=auto): most of its
# time goes to compiling kernels, one test at a time per core, and a third worker on two
# cores found nothing idle to use. The simulator's run takes one worker more than the
# machine has cores (SIM_TEST_JOBS): its kernels' threads hand the interpreter to each
# other at every barrier, and with one worker per core a fifth of the machine sat idle
# (2 vCPUs: 223 s with two workers, 189 s with three).
# Each run ends with its slowest tests (the whole suite should stay within about ten
# minutes on two cores).
TEST_JOBS ?= auto
SIM_TEST_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
test: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not cudasim" --durations=20
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -q -n $(SIM_TEST_JOBS) --dist worksteal -m cudasim --durations=20

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not cudasim and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools benchmarks

# Regenerate the README's generated tables (the ladder, from the registry).
readme: $(STAMP)
	$(PY) tools/update_readme.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
