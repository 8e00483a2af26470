# specpair front door. `make` (or `make help`) lists the targets.
SHELL := bash -o pipefail -e
.DEFAULT_GOAL := help
.SHELLFLAGS := -o pipefail -ec

VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	scripts/bootstrap.sh $(VENV) dev,deploy

.PHONY: venv
venv: $(VENV)/.installed ## Create the virtual environment with every pinned dependency.

.PHONY: test
test: venv ## Run the whole test suite (quick-size gates included).
	$(PY) -m pytest

.PHONY: test-gpu
test-gpu: venv ## Run the GPU suites (pytest -m gpu) on a CUDA machine with vLLM 0.32.0 (CUDA).
	$(PY) -m pytest -m gpu

.PHONY: lint
lint: venv ## Lint with ruff.
	$(VENV)/bin/ruff check src tests bench

.PHONY: bench
bench: venv ## Print the benchmark tables (speed targets live here, not in tests).
	$(PY) -m bench

.PHONY: fuzz
fuzz: venv ## Long mutation fuzz of the wire decoder (FUZZ_ITERATIONS, default 2M; fresh seed).
	cd tests/wire && $(abspath $(PY)) wire_fuzz.py --iterations $${FUZZ_ITERATIONS:-2000000}

##@ Gates

.PHONY: gates
gates: venv ## Run the gates at full size (pytest -m gate).
	SPECPAIR_GATE_SIZE=full $(PY) -m pytest -m gate
