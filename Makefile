# zero-lab: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0, the CPU build by default (TORCH=cpu); `make setup TORCH=cuda` installs PyPI's build
# of the same version, which on Linux x86_64 is the CUDA 13 one with its nvidia-* libraries. What each
# downloads: bench/torch_download.json (`python bench/torch_download.py`; README, "Set-up").
TORCH ?= cpu
# Installs hold to the lock; `make lock` installs without it (CONSTRAIN=) to find the newest versions.
CONSTRAIN ?= -c $(LOCK)
TORCH_VERSION := 2.13.0
# PyTorch's own index of CPU-only wheels (torch==2.13.0+cpu); pip asks it only when none of the
# indexes and wheel folders it is set up with already has that wheel.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
ifeq ($(TORCH),cuda)
TORCH_INSTALL = $(BIN)/python -m pip install -q $(CONSTRAIN) "torch==$(TORCH_VERSION)"
else ifneq ($(TORCH),cpu)
TORCH_INSTALL = echo "error: TORCH=$(TORCH) is not cpu or cuda; run make setup TORCH=cpu (the default) or TORCH=cuda" >&2; exit 2
else ifeq ($(shell uname -s),Linux)
TORCH_INSTALL = $(BIN)/python -m pip install -q $(CONSTRAIN) "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	|| $(BIN)/python -m pip install -q $(CONSTRAIN) "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX)
else  # macOS, Windows: PyPI's torch is the CPU build
TORCH_INSTALL = $(BIN)/python -m pip install -q $(CONSTRAIN) "torch==$(TORCH_VERSION)"
endif
# Official DeepSpeed JIT-builds ops into this folder; one per checkout keeps builds out of $HOME.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.torch_extensions

# The lock: every package at the version the suite last passed with (pip's constraints file, read by
# `pip install -c`); `make lock` refreshes it (README, "Set-up").
LOCK := constraints.txt

.PHONY: setup lock test test-fast test-kernels demo bench gpu-wheels gpu-check gpu-check-muon clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard $(LOCK))
	@test -x $(BIN)/python || $(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { echo "error: $(PYTHON) has no \
	venv module (Debian and Ubuntu ship it apart); install it: apt-get install python3-venv" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(TORCH_INSTALL)
	$(BIN)/python -m pip install -q $(CONSTRAIN) -e '.[dev]'
	# Holistic Trace Analysis's trace parser, for the test that it reads `--trace`'s files: the parser
	# needs only pandas and numpy; the rest of its dependencies (jupyterlab, plotly) serve its notebooks
	# (the `trace` extra installs them all)
	$(BIN)/python -m pip install -q --no-deps "holistictraceanalysis==0.5.0"
	touch $@

# Two pytest-xdist workers, each taking whole files (a module's shared launch stays one launch), the
# longest files first (tests/conftest.py): on 2 cores one worker's start-up, sleep or single process
# runs beside the other's work. `pytest -q` alone runs the same tests one after another.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Refresh the lock: a scratch venv takes the newest versions pyproject.toml allows (torch stays at
# TORCH_VERSION), and its `pip freeze` becomes constraints.txt (torch without its +cpu build label,
# which pip's == ignores anyway). Then `make clean test` checks the suite on them; commit both.
lock:
	rm -rf .venv-lock
	$(MAKE) --no-print-directory setup VENV=.venv-lock CONSTRAIN=
	{ echo "# zero-lab's lock: the versions the suite last passed with (make lock writes it; make setup installs it)"; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed -e 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > $(LOCK)
	rm -rf .venv-lock

# The numeric tests (parity, memory-exact, checkpoints, labs) under each of torch's CPU kernel sets
# (ATEN_CPU_CAPABILITY), so a developer on one CPU sees what another CPU computes: tests/tolerances.py.
NUMERIC_TESTS := tests/nano tests/zeropp tests/fsdp2 tests/checkpoint_formats tests/labs
KERNEL_SETS ?= default avx2 native
test-kernels: setup
	@for kernels in $(KERNEL_SETS); do \
	  echo "== ATEN_CPU_CAPABILITY=$$kernels"; \
	  if [ "$$kernels" = native ]; then unset ATEN_CPU_CAPABILITY; else export ATEN_CPU_CAPABILITY=$$kernels; fi; \
	  $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile $(NUMERIC_TESTS) || exit 1; \
	done

# The quick loop while editing: everything but the tests that launch torchrun, spawn gloo ranks or
# run official DeepSpeed (markers slow and official). The README's test command stays `make test`.
test-fast: setup
	$(BIN)/pytest -q -m "not slow and not official"

demo: setup
	$(BIN)/zero-lab compare --gpus 2 --device cpu --stages 1,2,3 --steps 10 --repeat 2 --report reports/cpu-demo.md

bench: setup
	$(BIN)/python bench/memory_vs_official.py

# A machine with one CUDA GPU and a python3 that has torch (no venv, no network): install what it
# lacks from .whl/, then qwen3-0.6b bf16 on one GPU, stages 1-3, both impls (docs/cli.md).
gpu-check:
	$(PYTHON) bench/gpu_check.py

# Muon side by side on the GPU (opt-in: its six runs would not fit gpu-check's budget; docs/muon.md).
gpu-check-muon:
	$(PYTHON) bench/gpu_check.py --only muon

# Here, where pip reaches PyPI: the wheels gpu-check carries (official DeepSpeed's pure-Python
# wheel, pydantic, hjson, ...), at the versions this venv tests with.
gpu-wheels: setup
	$(BIN)/python bench/gpu_check.py --build-wheels

clean:
	rm -rf $(VENV) .venv-lock .torch_extensions .pytest_cache
