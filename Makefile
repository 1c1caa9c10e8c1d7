# klalm: `make train` and `make test` are the two commands a newcomer needs; both run `make install` first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.klalm-installed
# CPU machines (no nvidia-smi) get the CPU build of torch; GPU machines keep whatever torch they have.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
# pytest worker processes (pytest-xdist; 0: none): 7.4 minutes with 2 on a 2-core machine (2026-12-05, README)
TEST_WORKERS ?= 2

.PHONY: install train test test-full lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(if $(HAS_GPU),,$(BIN)/pip install -q "$(TORCH_CPU)")
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

train: install
	$(BIN)/klalm-train experiment=offline

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# --dist loadfile: a file's tests share one worker (the two-process DDP tests use one fixed port)
test-full: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "slow or not slow"

lint: install
	$(BIN)/ruff check src kernels scripts tests
	$(BIN)/ruff format --check src kernels scripts tests

bench: install
	$(BIN)/python kernels/bench_scan.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
