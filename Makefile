# patchbay: the two commands a newcomer needs are `make demo` and `make test`.
# Everything they need (virtual environment, Python packages, the NVML mock,
# the control-plane binaries) is installed by the targets themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
export GOFLAGS ?= -mod=mod

.DEFAULT_GOAL := help

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN {FS=":.*?## "}; {printf "  %-20s %s\n", $$1, $$2}'

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp ## create the virtual environment with all Python packages

include hack/k8s.mk
include hack/nvml-mock.mk
include hack/helm.mk
include hack/containerd.mk
include hack/images.mk
include hack/monitoring.mk
include hack/kueue.mk
include hack/docker.mk
include hack/kind.mk

lint: venv proto-check ## ruff, format check, mypy strict, import-linter, module size, no test-module imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) hack/module_size.py
	$(PY) hack/sleep_lint.py
	$(PY) hack/test_imports_lint.py

fmt: venv ## format the code
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

proto: venv ## regenerate the protobuf stubs under plugin/proto
	$(PY) hack/protogen.py

proto-check: venv ## fail if regenerating the stubs changes anything
	$(PY) hack/protogen.py --check

test-unit: venv go-helpers ## the fast tier (seconds): pure functions and the in-memory NVML fake
	$(PYTEST) -q tests/unit

# The Go helpers some unit tests compare against (tests/harness/gotool.py),
# built before the tier: a cold build (module downloads, minutes on a busy
# 2-core machine) inside a test ran into its 300 s timeout.
go-helpers: venv
	PYTHONPATH=. $(PY) -m tests.harness.gotool dra-cel metadata-go

test-contract: venv nvml-mock ## NVML contract: the same scenarios on the fake and on pynvml + C mock
	$(PYTEST) -q tests/contract

test-integration: venv nvml-mock k8s-bins ## real plugin process, real sockets, pynvml + C mock, real apiserver
	$(PYTEST) -q -m integration tests/integration

test-e2e: venv nvml-mock k8s-bins helm-bin promtool prometheus-crds kueue-bin ## real control plane + node agents + plugin processes
	$(PYTEST) -q -n $(CLUSTER_WORKERS) --dist loadfile -m cluster tests/e2e

node-bins: k8s-bins k8s-node-bins containerd-bins node-prereqs nvml-mock helm-bin ## everything a real node needs (kubelet, kube-proxy, kubectl, containerd, runc, CNI)

test-node: venv node-bins images ## real nodes (kubelet + containerd in namespaces), the chart installed with helm (root)
	$(PYTEST) -q -p no:cacheprovider -m node tests/node

test-gated: venv node-bins images ## a real node on a control plane of its own with 1.37's off-by-default beta gates (PodGroup claims) on (root)
	$(PYTEST) -q -p no:cacheprovider -m node tests/gated

# The cluster tiers (contract, integration, e2e) run in CLUSTER_WORKERS
# pytest-xdist workers, each with a control plane of its own; --dist loadfile
# keeps a module (and its module-scoped environment) on one worker. Why 3:
# one worker kept the 2 cores 21 % busy over the tier (1373 s), 3 kept them
# 49 % busy (537 s), which leaves room for the background builds below
# (docs/figures.md; each run's summary prints its own figure). The real-node tier runs its own session (on the node
# bridge), the gated tier (tests/gated: off-by-default gates) another, the
# kind tier (tests/kind, hack/kind.mk) last, on a private dockerd.
#
# What only those later tiers need (node binaries, images, kind) is built
# meanwhile, at the lowest CPU and IO priority, while lint, the unit tier and
# the cluster tiers run (log: build/later-tiers.log). What both sides need
# (SHARED_PREREQS) is built first, so no target is ever built by two makes
# at once; promtool is among them because it may run apt-get update, which
# the background's apt-get install must not meet.
CLUSTER_WORKERS ?= 3
SHARED_PREREQS := venv nvml-mock k8s-bins helm-bin promtool
CLUSTER_PREREQS := prometheus-crds kueue-bin
LATER_PREREQS := node-bins images kind-prereqs
LATER_LOG := build/later-tiers.log
PYTEST_CLUSTER := $(PYTEST) -q -p no:cacheprovider -n $(CLUSTER_WORKERS) --dist loadfile

test: $(SHARED_PREREQS) ## every tier (what CI runs)
	@set -e; mkdir -p build; start=$$(date +%s); \
	setsid -w nice -n 19 ionice -c 3 $(MAKE) --no-print-directory $(LATER_PREREQS) > $(LATER_LOG) 2>&1 & later=$$!; \
	trap 'kill -- -$$later 2>/dev/null || true' EXIT; \
	echo "building $(LATER_PREREQS) in the background (log: $(LATER_LOG))"; \
	$(MAKE) --no-print-directory lint $(CLUSTER_PREREQS) go-helpers; \
	$(PYTEST) -q tests/unit; \
	$(PYTEST_CLUSTER) tests/contract tests/integration tests/e2e; \
	echo "waiting for $(LATER_PREREQS) ($$(( $$(date +%s) - start )) s into the tiers)"; \
	if ! wait $$later; then tail -n 60 $(LATER_LOG); echo "make test: building $(LATER_PREREQS) failed (log: $(LATER_LOG))" >&2; exit 1; fi; \
	trap - EXIT; echo "$(LATER_PREREQS) ready $$(( $$(date +%s) - start )) s into the tiers"; \
	$(PYTEST) -q -p no:cacheprovider -m node tests/node; \
	$(PYTEST) -q -p no:cacheprovider -m node tests/gated; \
	$(KIND_TIER)

# REFERENCE_PLUGIN=<dra-example-kubeletplugin binary> adds the reference
# driver's columns to the plugin figures (tests/bench/reference.py).
# PLUGIN_BENCH_SAMPLES=<dir> keeps each plugin run's latencies there, for
# `python -m tests.bench.pooled <dir>` (p99 pooled over runs, issue 36).
# BENCH=<name> runs one benchmark (tests/bench/__main__.py lists them), e.g.
# BENCH=soak (not in the default set; SOAK_SECONDS, default 600; SOAK_HEAP=1
# adds heap summaries, driver/heapsummary.py), BENCH=burst, or BENCH=scale (not
# in the default set; SCALE_SIZES, default 100,500 nodes; docs/scale.md).
bench: venv nvml-mock k8s-bins ## benchmarks: print figures, assert nothing (REFERENCE_PLUGIN=<path>: side by side; BENCH=<name>: one)
	REFERENCE_PLUGIN="$(REFERENCE_PLUGIN)" PYTHONPATH=. $(PY) -m tests.bench $(BENCH)

clean: ## remove build outputs in the tree (not the binary cache)
	rm -rf build .pytest_cache .mypy_cache .ruff_cache hack/nvml-mock/build run

.PHONY: help venv lint fmt proto proto-check go-helpers test-unit test-contract test-integration test-e2e test-node test-gated node-bins test bench clean

demo: venv node-bins images ## real nodes (kubelet + containerd), the chart installed with helm, example pods; shows what each container saw (root)
	$(PY) hack/demo.py up

demo-down: venv ## stop everything `make demo` started
	$(PY) hack/demo.py down

.PHONY: demo demo-down
