# zero-lab: the two commands of the README are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch by default; for CUDA install your torch into the venv first
# (e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124").
TORCH_SPEC ?= torch==2.13.0
# Official DeepSpeed JIT-builds ops into this folder; one per checkout keeps builds out of $HOME.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.torch_extensions

.PHONY: setup test test-fast demo bench gpu-wheels gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# Two pytest-xdist workers, each taking whole files (a module's shared launch stays one launch), the
# longest files first (tests/conftest.py): on 2 cores one worker's start-up, sleep or single process
# runs beside the other's work. `pytest -q` alone runs the same tests one after another.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

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

# Here, where pip reaches PyPI: the wheels gpu-check carries (official DeepSpeed's pure-Python
# wheel, pydantic, hjson, ...), at the versions this venv tests with.
gpu-wheels: setup
	$(BIN)/python bench/gpu_check.py --build-wheels

clean:
	rm -rf $(VENV) .torch_extensions .pytest_cache
