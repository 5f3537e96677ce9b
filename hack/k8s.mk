# Local Kubernetes control plane binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager) and the node agent, built from upstream Go modules by
# the wrapper module in hack/k8s. The pinned release lives only in
# hack/k8s/go.mod (the k8s.io/kubernetes requirement); everything here derives
# from it. Binaries are cached outside the work tree, keyed by that version and
# a hash of the wrapper's go.sum, so a machine builds them once.

K8S_MOD_DIR := hack/k8s
K8S_VERSION := $(shell awk '{for (i = 1; i < NF; i++) if ($$i == "k8s.io/kubernetes" && $$(i+1) ~ /^v/) {print $$(i+1); exit}}' $(K8S_MOD_DIR)/go.mod)
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
# Every Kubernetes binary reports the pinned release (without these it says
# v0.0.0-master+$$Format:%H$$, which `kubectl version` cannot parse).
K8S_VERSION_PKGS := k8s.io/component-base/version k8s.io/client-go/pkg/version
K8S_LDFLAGS := -s -w $(foreach p,$(K8S_VERSION_PKGS),-X $(p).gitVersion=$(K8S_VERSION) \
	-X $(p).gitMajor=1 -X $(p).gitMinor=$(K8S_MINOR) -X $(p).gitTreeState=clean)
# The cache key covers the module graph and the build recipe (ldflags).
K8S_SUM_HASH := $(shell { cat $(K8S_MOD_DIR)/go.sum; echo '$(K8S_LDFLAGS)'; } 2>/dev/null | sha256sum | cut -c1-8)
K8S_CACHE_ROOT ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/patchbay
K8S_BIN_DIR := $(K8S_CACHE_ROOT)/k8s-$(K8S_VERSION)-$(K8S_SUM_HASH)/bin
K8S_CP_BINS := etcd kube-apiserver kube-scheduler kube-controller-manager
# What a real node runs (tests/harness/realnode): the kubelet, kube-proxy, and kubectl
# for people and tests.
K8S_NODE_BINS := kubelet kube-proxy kubectl
K8S_GO_BUILD := go build -mod=readonly -p 2 -trimpath -ldflags "$(K8S_LDFLAGS)"

# Go is only needed when something must be built: a complete cache works without it.
K8S_NEED_GO = command -v go >/dev/null 2>&1 || { \
	  echo "k8s-bins: the 'go' command is not on PATH. Install Go >= 1.26 (https://go.dev/dl)" \
	       "to build the local control plane ($(K8S_VERSION))." >&2; exit 1; }

k8s-go-check:
	@$(K8S_NEED_GO)
	@test -n "$(K8S_VERSION)" || { echo "k8s-bins: no k8s.io/kubernetes version in $(K8S_MOD_DIR)/go.mod" >&2; exit 1; }

# Binaries are built once per (version, go.sum, recipe) and one at a time:
# a binary already in the cache is never rebuilt, and an interrupted build
# leaves only a temporary file, never a half-written binary.
# $(call k8s_build,<what>,<binaries>)
define k8s_build
	@set -e; dir='$(K8S_BIN_DIR)'; missing=; \
	for b in $(2); do [ -x "$$dir/$$b" ] || missing="$$missing $$b"; done; \
	if [ -z "$$missing" ]; then echo "k8s $(K8S_VERSION) $(1) cached in $$dir"; exit 0; fi; \
	$(K8S_NEED_GO); mkdir -p "$$dir"; \
	echo "building k8s $(K8S_VERSION) $(1) ($$missing) into $$dir (cold: minutes each on 2 cores)"; \
	all=$$(date +%s); \
	for b in $$missing; do \
	  start=$$(date +%s); \
	  (cd $(K8S_MOD_DIR) && $(K8S_GO_BUILD) -o "$$dir/$$b.tmp.$$$$" ./cmd/$$b) || { rm -f "$$dir/$$b.tmp.$$$$"; exit 1; }; \
	  mv -f "$$dir/$$b.tmp.$$$$" "$$dir/$$b"; echo "  $$b built in $$(( $$(date +%s) - start ))s"; \
	done; \
	echo "k8s $(K8S_VERSION) $(1) built in $$(( $$(date +%s) - all ))s"
endef

k8s-bins: k8s-control-plane k8s-node-agent ## build (or reuse) etcd + kube-* + node-agent in the cache

k8s-control-plane:
	$(call k8s_build,control plane,$(K8S_CP_BINS))

k8s-node-bins: ## build (or reuse) kubelet, kube-proxy and kubectl in the cache
	$(call k8s_build,node binaries,$(K8S_NODE_BINS))

# The node agent changes more often than the pin: rebuilt whenever a hash of its
# sources (and go.sum) differs from the one recorded next to the binary.
k8s-node-agent: ## build (or reuse) the node agent in the cache
	@set -e; dir='$(K8S_BIN_DIR)'; \
	[ -d $(K8S_MOD_DIR)/cmd/node-agent ] || exit 0; \
	src=$$(find $(K8S_MOD_DIR)/cmd/node-agent -name '*.go' | sort | xargs cat $(K8S_MOD_DIR)/go.sum | sha256sum | cut -c1-16); \
	if [ -x "$$dir/node-agent" ] && [ "$$(cat "$$dir/node-agent.src" 2>/dev/null)" = "$$src" ]; then exit 0; fi; \
	$(K8S_NEED_GO); \
	mkdir -p "$$dir"; start=$$(date +%s); \
	(cd $(K8S_MOD_DIR) && $(K8S_GO_BUILD) -o "$$dir/node-agent.tmp" ./cmd/node-agent); \
	mv -f "$$dir/node-agent.tmp" "$$dir/node-agent"; echo "$$src" > "$$dir/node-agent.src"; \
	echo "node-agent built in $$(( $$(date +%s) - start ))s"

k8s-bin-dir: ## print the directory holding the cached control-plane binaries
	@echo '$(K8S_BIN_DIR)'

k8s-version: ## print the pinned Kubernetes release
	@echo '$(K8S_VERSION)'

k8s-clean: ## remove every cached control-plane build of this user
	rm -rf '$(K8S_CACHE_ROOT)'/k8s-v*

# Re-pin: rewrites the k8s.io/kubernetes requirement and every staging replace
# (vX.Y.Z -> v0.Y.Z) in one go, then tidies. Usage: make k8s-pin K8S_PIN=v1.37.3
k8s-pin: k8s-go-check
	@test -n "$(K8S_PIN)" || { echo "usage: make k8s-pin K8S_PIN=v1.Y.Z" >&2; exit 1; }
	@set -e; cd $(K8S_MOD_DIR); staging=v0$${K8S_PIN#v1}; \
	go mod edit -require=k8s.io/kubernetes@$(K8S_PIN); \
	for m in $$(awk '$$2 == "=>" && $$1 ~ /^k8s.io\// {print $$1}' go.mod); do \
	  go mod edit -replace=$$m=$$m@$$staging; done; \
	go mod tidy

.PHONY: k8s-go-check k8s-bins k8s-control-plane k8s-node-bins k8s-node-agent k8s-bin-dir k8s-version k8s-clean k8s-pin
