# kind for people with Docker, and the kind tier (hack/kind, tests/kind):
# kind built from its Go module, kubeadm from the pinned Kubernetes release,
# and a kind node image assembled offline by hack/kind/node-image.sh (kind's
# own `build node-image` needs a registry). Everything is cached outside the
# work tree: kind by version, kubeadm next to the other pinned binaries, the
# node image by a hash of its inputs. Docker itself: hack/docker.mk.

KIND_VERSION := v0.33.0
KIND_LDFLAGS := -s -w
KIND_HASH := $(shell echo 'CGO_ENABLED=0 $(KIND_LDFLAGS)' | sha256sum | cut -c1-8)
KIND_BIN_DIR := $(K8S_CACHE_ROOT)/kind-$(KIND_VERSION)-$(KIND_HASH)/bin
KIND := $(KIND_BIN_DIR)/kind
# kubeadm: same pin, go.sum and ldflags as the rest of K8S_BIN_DIR
KUBEADM := $(K8S_BIN_DIR)/kubeadm
# etcd is built from the go.etcd.io/etcd/server/v3 requirement of hack/k8s;
# its image carries that version (kubeadm is told so in the kind config).
ETCD_TAG := $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" {sub(/^v/, "", $$2); print $$2; exit}' $(K8S_MOD_DIR)/go.mod)
KIND_ENV = K8S_CACHE_ROOT='$(K8S_CACHE_ROOT)' K8S_VERSION='$(K8S_VERSION)' K8S_BIN_DIR='$(K8S_BIN_DIR)' \
	KUBEADM='$(KUBEADM)' CONTAINERD_BIN_DIR='$(CONTAINERD_BIN_DIR)' ETCD_TAG='$(ETCD_TAG)' KIND='$(KIND)' \
	HELM='$(HELM)'

kind-bin: ## build (or reuse) kind from its Go module in the cache
	@set -e; bin='$(KIND)'; [ -x "$$bin" ] && exit 0; $(K8S_NEED_GO); \
	echo "building kind $(KIND_VERSION) into $(KIND_BIN_DIR)"; start=$$(date +%s); mkdir -p '$(KIND_BIN_DIR)'; \
	tmp=$$(mktemp -d); CGO_ENABLED=0 GOBIN=$$tmp GOFLAGS= go install -trimpath -ldflags '$(KIND_LDFLAGS)' sigs.k8s.io/kind@$(KIND_VERSION); \
	mv -f $$tmp/kind "$$bin"; rmdir $$tmp; echo "kind $(KIND_VERSION) built in $$(( $$(date +%s) - start ))s"

kubeadm-bin: ## build (or reuse) kubeadm of the pinned release (for the kind node image)
	@set -e; bin='$(KUBEADM)'; [ -x "$$bin" ] && exit 0; $(K8S_NEED_GO); \
	src='$(K8S_CACHE_ROOT)/kind-kubeadm-src'; rm -rf "$$src"; mkdir -p "$$src/cmd/kubeadm" '$(K8S_BIN_DIR)'; \
	cp $(K8S_MOD_DIR)/go.mod $(K8S_MOD_DIR)/go.sum "$$src/"; cp hack/kind/kubeadm/main.go "$$src/cmd/kubeadm/"; \
	echo "building kubeadm $(K8S_VERSION) into $(K8S_BIN_DIR)"; start=$$(date +%s); \
	(cd "$$src" && go mod edit -module patchbay.dev/hack/kind/kubeadm && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 \
	  && $(K8S_GO_BUILD) -o "$$bin.tmp.$$$$" ./cmd/kubeadm) || { rm -f "$$bin.tmp.$$$$"; exit 1; }; \
	mv -f "$$bin.tmp.$$$$" "$$bin"; rm -rf "$$src"; echo "kubeadm built in $$(( $$(date +%s) - start ))s"

kind-node-image: k8s-control-plane k8s-node-bins kubeadm-bin containerd-bins node-prereqs images ## assemble (or reuse) the kind node image offline; prints "<archive> <ref>"
	@KIND_MOD_DIR=$$(GOFLAGS= go mod download -json sigs.k8s.io/kind@$(KIND_VERSION) | awk -F'"' '$$2 == "Dir" {print $$4}') \
	  PAUSE_ARCHIVE=$$($(IMAGES_PY) path pause) $(KIND_ENV) hack/kind/node-image.sh

kind-env: ## print the variables hack/kind/*.sh read (eval "$(make -s kind-env)")
	@echo "export $(KIND_ENV)"

kind-up: venv nvml-mock helm-bin kind-bin docker-bin kind-node-image ## create the kind cluster with patchbay (hack/kind/up.sh)
	hack/kind/up.sh

kind-down: ## delete the kind cluster and stop the private dockerd (hack/kind/down.sh)
	hack/kind/down.sh

# The kind tier (tests/kind): up.sh, the checks, down.sh, under the cluster
# lock that every cluster-starting test takes (dockerd.sh then does not take it
# again). `make test` runs it last.
KIND_TIER = flock /tmp/patchbay-cluster.lock env PATCHBAY_CLUSTER_LOCK_HELD=1 \
	$(PYTEST) -q -p no:cacheprovider -m kind tests/kind

kind-prereqs: venv nvml-mock helm-bin kind-bin docker-bin kind-node-image

test-kind: kind-prereqs ## the kind tier: the examples in kind nodes, nothing left afterwards (root)
	$(KIND_TIER)

.PHONY: kind-bin kubeadm-bin kind-node-image kind-env kind-up kind-down kind-prereqs test-kind
