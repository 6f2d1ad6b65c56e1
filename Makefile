# PetsTraining: the one front door. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Expensive things (Go builds, the wheelhouse, images' base) are cached here and reused.
export PETS_CACHE ?= $(HOME)/.cache/pets-training
CLUSTER ?= local
# Nodes of the local cluster: NODES=3 is 1 control plane + 2 workers (CI's e2e runs on it).
NODES ?= 1
export PETS_NODES := $(NODES)
# NetworkPolicy enforced on every node of the local cluster (tests/cluster/netpol.sh); POLICY=0: not.
POLICY ?= 1
# make chaos: CHAOS=full (8 trainings, 7 minutes of faults) or short (3 trainings); SEED draws the schedule.
CHAOS ?= full
SEED ?= 1
export PETS_NETPOL := $(POLICY)
export PETS_CLUSTER := $(CLUSTER)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

# ---------------------------------------------------------------- environment
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# No pip cache: it would keep another 3 GB copy of torch's wheels (the images take theirs from
	# the wheelhouse in $$PETS_CACHE).
	$(VENV)/bin/pip install --no-cache-dir -e '.[trainer,operator,dev,client]'
	touch $@

.PHONY: install
install: $(VENV)/.installed ## create .venv with the trainer, the operator and the dev tools

# checkov (PyPI), for lint-k8s, in a venv of its own: it pins many packages that must not meet the
# project's. Kept in the cache like helm, so a fresh clone's lint reuses it.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV ?= $(PETS_CACHE)/checkov-venv
HELM := $(PETS_CACHE)/bin/helm

$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION):
	rm -rf "$(CHECKOV_VENV)"
	$(PYTHON) -m venv "$(CHECKOV_VENV)"
	"$(CHECKOV_VENV)/bin/pip" install -q --upgrade pip
	"$(CHECKOV_VENV)/bin/pip" install -q --no-cache-dir checkov==$(CHECKOV_VERSION)
	touch $@

$(HELM):
	tests/cluster/build.sh control-plane

.PHONY: lint
lint: install ## ruff, mypy, and checkov over the chart and the pods we create (lint-k8s)
	$(VENV)/bin/ruff check src operator tests
	$(VENV)/bin/mypy src/pets_contract src/pets_training src/pets_client operator/pets_operator
	$(MAKE) lint-k8s

.PHONY: lint-k8s
lint-k8s: install $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION) $(HELM) ## checkov's Kubernetes checks over the rendered chart, operator and client pods; fails on any not in tests/lint_k8s_skips.yaml
	$(PY) tests/lint_k8s.py --checkov "$(CHECKOV_VENV)/bin/checkov" --helm "$(HELM)"

# ---------------------------------------------------------------- tests
.PHONY: test
# The unit tests two at a time (pytest-xdist): much of their time is a trainer's start-up in a subprocess,
# one core's work (1,486 tests in 629 s on the 2-core CI machine). UNIT_WORKERS=0: one at a time.
UNIT_WORKERS ?= 2
test: install tools ## unit tests, then integration tests against a real API server (brought up and down here)
	$(VENV)/bin/pytest -m unit -n $(UNIT_WORKERS) tests/unit tests/cluster
	$(MAKE) test-integration

.PHONY: test-unit
test-unit: install tools ## unit tests only (no cluster; the chart's tests run the real helm; UNIT_WORKERS)
	$(VENV)/bin/pytest -m unit -n $(UNIT_WORKERS) tests/unit tests/cluster

.PHONY: tools
tools: ## build (once, cached in $PETS_CACHE/bin) helm and the control plane's binaries
	tests/cluster/build.sh control-plane

# ---------------------------------------------------------------- trainer (src/)
.PHONY: train
# `accelerate launch --cpu --num_processes 2` starts one process unless MPI is set up; --multi_gpu uses
# torchrun, and the trainer picks the CPU (gloo) itself when there is no GPU. fp16 becomes bf16 on CPU.
# The recipe with a CPU-sized model and set (about a minute here). `make train TRAIN_ARGS=` runs the full
# defaults (resnet50d, 224 px, 37 classes): a random-init resnet50d memorises rather than learns that set.
# --no-pretrained: offline (the default, the tutorial's pretrained weights, needs the hub or a cache).
TRAIN_ARGS ?= --model resnet18 --image-size 128 --synthetic-classes 8 --synthetic-images-per-class 100 --batch-size 32 \
  --no-pretrained
train: install ## the default local job: 2 processes, synthetic data, CPU (TRAIN_ARGS adds trainer flags)
	rm -rf output/train
	$(VENV)/bin/accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision fp16 \
	  --dynamo_backend no -m pets_training --data synthetic --output-dir output/train $(TRAIN_ARGS)

.PHONY: bench
BENCH_ARGS ?= --steps 3 --repeats 2
bench: install ## tutorial loop vs our trainer on the same JPEGs: images/s and the speedup (BENCH_ARGS)
	$(PY) -m pets_training.bench $(BENCH_ARGS)

.PHONY: bench-startup
BENCH_STARTUP_ARGS ?=
bench-startup: install ## process start -> first step on a Pets-sized folder: without a store, building it, with it fresh, split by part -> bench-output/bench-startup.{json,png} (BENCH_STARTUP_ARGS)
	$(PY) -m pets_training.bench_startup $(BENCH_STARTUP_ARGS)

.PHONY: bench-preempt
BENCH_PREEMPT_ARGS ?=
bench-preempt: install ## seconds lost per preemption: epoch-only checkpoints vs step checkpoints (killed, SIGTERM), and each save's stall -> output/bench-preempt.json (BENCH_PREEMPT_ARGS)
	$(PY) -m pets_training.bench_preempt $(BENCH_PREEMPT_ARGS)

# ---------------------------------------------------------------- control plane and cluster (tests/cluster)
.PHONY: test-integration
# No pods run on the test control plane, so the Job controller is off and the tests drive Job status.
test-integration: install ## integration tests against etcd + kube-apiserver + controller-manager
	KCM_CONTROLLERS='*,-job' tests/cluster/run-with-control-plane.sh $(VENV)/bin/pytest -m integration tests/integration

.PHONY: cluster-up
cluster-up: ## a cluster to run on: CLUSTER=local (default, offline) or CLUSTER=kind; NODES=3 for 1 control plane + 2 workers; POLICY=0 without NetworkPolicy enforcement; KUBEFLOW=1 KUEUE=1 add the real training-operator / Kueue; S3=1 an S3 server (http://s3.pets-s3.svc:7070, docs/cluster.md); MLFLOW=1 an MLflow tracking server (http://mlflow.pets-mlflow.svc:5000); PROMETHEUS=1 a Prometheus server scraping the chart's release (http://prometheus.pets-prometheus.svc:9090)
	PETS_ADDONS="$(if $(filter 1,$(KUBEFLOW)),kubeflow) $(if $(filter 1,$(KUEUE)),kueue) $(if $(filter 1,$(S3)),s3) $(if $(filter 1,$(MLFLOW)),mlflow) $(if $(filter 1,$(PROMETHEUS)),prometheus)" tests/cluster/cluster.sh up $(CLUSTER)

.PHONY: cluster-down
cluster-down: ## stop the cluster and remove what it left behind
	tests/cluster/cluster.sh down $(CLUSTER)

# ---------------------------------------------------------------- images (image/)
.PHONY: images
images: ## build the trainer and operator images (starts a Docker engine here if needed)
	image/build.sh all

.PHONY: base-image
base-image: ## build the offline Debian bookworm base image
	image/build.sh base

# CLEAN=0 keeps the engine's images and build cache (CI: its 90 minutes cannot afford the trainer's
# 190 s rebuild on the 2-core machine; `make rehearse-cold` builds everything from nothing).
CLEAN ?= 1
.PHONY: test-images
test-images: install ## build both images from a clean engine (offline base; CLEAN=0: as cached) and test them with docker
	if [ "$(CLEAN)" != 0 ]; then image/build.sh clean; fi
	image/build.sh all
	$(VENV)/bin/pytest -m e2e tests/e2e/test_images.py tests/e2e/test_images_extract.py

# ---------------------------------------------------------------- end to end
.PHONY: e2e
e2e: install ## on the running cluster: images, helm install, train, faults
	tests/e2e/run.sh $(CLUSTER)

.PHONY: chaos
chaos: install ## on the running cluster (NODES=3): 8 trainings while the operator, API server, etcd, a pod and a node fail (CHAOS=short: 3 trainings; SEED=N) -> output/chaos.json
	PETS_CHAOS_MODE=$(CHAOS) PETS_CHAOS_SEED=$(SEED) tests/e2e/chaos.sh $(CLUSTER)

.PHONY: test-upgrade
test-upgrade: install ## on the running cluster: the previous release (CHANGELOG.md) with trainings in every state, upgraded to this tree, then rolled back
	tests/e2e/upgrade.sh $(CLUSTER)

.PHONY: demo
demo: ## from a fresh machine: cluster, images, chart, train petstraining.yaml to Succeeded
	tests/e2e/demo.sh $(CLUSTER)

.PHONY: rehearse-cold
rehearse-cold: ## the Quick start in a throw-away clone, state root and empty cache root: each phase's time, peak disk
	tests/rehearse-cold.sh

.PHONY: bench-e2e
BENCH_E2E_ARGS ?=
bench-e2e: install ## time from kubectl apply to pods Running and to the first step (median of 5; BENCH_E2E_ARGS)
	tests/e2e/bench.sh $(CLUSTER) $(BENCH_E2E_ARGS)

.PHONY: bench-upload
BENCH_UPLOAD_ARGS ?=
bench-upload: install ## kubectl pets upload of a Pets-sized folder (7,390 JPEGs, 500x375) beside kubectl cp into the same claim: s, files/s, MB/s, ratio -> output/bench-upload.json (BENCH_UPLOAD_ARGS)
	tests/e2e/bench_upload.sh $(CLUSTER) $(BENCH_UPLOAD_ARGS)

.PHONY: bench-operator
BENCH_OPERATOR_ARGS ?=
bench-operator: install ## operator memory (at rest, with 100 PetsTrainings) and create->Job latency p50/p99 (BENCH_OPERATOR_ARGS)
	KCM_CONTROLLERS='*,-job' tests/cluster/run-with-control-plane.sh $(PY) tests/integration/bench_operator.py \
	  $(BENCH_OPERATOR_ARGS)

.PHONY: release
# The version's one source is pets_contract.__version__ (Chart.yaml and CHANGELOG.md follow it, and
# tests/unit/test_version.py says where they do not); a release tag names a clean, committed tree.
release: install $(HELM) ## VERSION=x.y.z: check the version everywhere, build the images tagged with it, package the chart into dist/, tag git vX.Y.Z
	@[[ -n "$(VERSION)" ]] || { echo "usage: make release VERSION=x.y.z"; exit 2; }
	@have=$$(image/build.sh version); [[ $$have == "$(VERSION)" ]] || { echo "pets_contract.__version__ is" \
	  "$$have, not $(VERSION): set it, Chart.yaml and a CHANGELOG.md section first"; exit 2; }
	@git diff --quiet HEAD || { echo "the tree has uncommitted changes: commit them, then release"; exit 2; }
	$(VENV)/bin/pytest -q -m unit tests/unit/test_version.py
	image/build.sh all
	mkdir -p dist && $(HELM) package charts/pets-training -d dist
	git rev-parse -q --verify "refs/tags/v$(VERSION)" >/dev/null || git tag -a "v$(VERSION)" -m "PetsTraining $(VERSION)"
	@echo "released $(VERSION): images pets-training/{trainer,operator}:$(VERSION), dist/pets-training-$(VERSION).tgz, tag v$(VERSION)"

.PHONY: clean
clean: ## remove build and test outputs (not the cache)
	rm -rf output bench-output dist .pytest_cache .mypy_cache .ruff_cache

.PHONY: bench-scale
bench-scale: install ## COUNT trainings (default 1000) on 50 kwok nodes vs a raw client: latency, status lag, idle requests, RSS -> bench-output/scale.json
	PY=$(abspath $(PY)) tests/scale/run.sh --count $(or $(COUNT),1000) $(SCALE_ARGS)

.PHONY: bench-scrape
bench-scrape: install ## one progress-scrape pass over 1000 local endpoints, then 950 + 50 slow/hostile: pass time, slot hold, loop lag, RSS -> output/bench-scrape.json (BENCH_SCRAPE_ARGS)
	$(PY) tests/scale/bench_scrape.py $(BENCH_SCRAPE_ARGS)

# Every bench that needs no cluster, in a short mode, its results under output/bench-smoke/ (the full
# runs' results stay where they are): a documented bench cannot break unseen. CI runs it, and
# `make bench-e2e BENCH_E2E_ARGS="--runs 1"` on its e2e cluster. Not bench, bench-preempt and bench-startup:
# the unit tests run them end to end on a tinier model and check what they print (tests/unit/trainer/
# test_bench.py, test_bench_preempt.py, test_bench_startup.py), and running them here too cost CI 134 s.
SMOKE := output/bench-smoke
.PHONY: bench-smoke
bench-smoke: install tools ## every bench above but bench, bench-preempt, bench-startup (run by the unit tests) and bench-e2e in a short mode, as CI runs them -> output/bench-smoke/
	mkdir -p $(SMOKE)
	$(MAKE) bench-operator BENCH_OPERATOR_ARGS="--count 5 --settle 2 --out $(abspath $(SMOKE))/operator.json"
	$(MAKE) bench-scale COUNT=5 SCALE_ARGS="--nodes 3 --idle 5 --settle 5 --quiet 3 --out $(abspath $(SMOKE))/scale.json"
	$(MAKE) bench-scrape BENCH_SCRAPE_ARGS="--count 40 --hostile 4 --repeats 1 --out $(SMOKE)/scrape.json"
