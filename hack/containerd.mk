# containerd 2.x for the real-node tier (tests/harness/realnode): the daemon, its runc
# shim and ctr, built from the upstream Go module by the tool-only wrapper
# module in hack/containerd (the pin is the containerd/v2 requirement in its
# go.mod). Cached outside the work tree like the control plane, keyed by that
# version and a hash of the wrapper's go.sum and the build recipe.
#
# The rest of a node comes from Debian, installed by `make node-prereqs` when
# missing: runc (1.1.5 works with our cgroup v1 hosts), the CNI plugins
# (bridge, host-local, loopback), iptables and conntrack for kube-proxy,
# buildah (builds the plugin image from hack/image/Dockerfile without a
# daemon), debootstrap (the image's Debian base), busybox-static (the
# workload image) and a static libc for the pause image.

CONTAINERD_MOD_DIR := hack/containerd
CONTAINERD_VERSION := $(shell awk '$$1 == "github.com/containerd/containerd/v2" && $$2 ~ /^v/ {print $$2; exit}' $(CONTAINERD_MOD_DIR)/go.mod)
CONTAINERD_BINS := containerd containerd-shim-runc-v2 ctr
CONTAINERD_LDFLAGS := -s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)
CONTAINERD_TAGS := no_btrfs
CONTAINERD_HASH := $(shell { cat $(CONTAINERD_MOD_DIR)/go.sum; echo '$(CONTAINERD_LDFLAGS) $(CONTAINERD_TAGS)'; } 2>/dev/null | sha256sum | cut -c1-8)
CONTAINERD_BIN_DIR := $(K8S_CACHE_ROOT)/containerd-$(CONTAINERD_VERSION)-$(CONTAINERD_HASH)/bin
NODE_DEBIAN_PKGS := runc containernetworking-plugins iptables conntrack buildah debootstrap busybox-static gcc libc6-dev
# a file that proves each package is installed (same order as above); gcc and
# libc6-dev build the static pause binary
NODE_DEBIAN_PROBES := /usr/sbin/runc /usr/lib/cni/bridge /usr/sbin/iptables /usr/sbin/conntrack /usr/bin/buildah /usr/sbin/debootstrap /bin/busybox /usr/bin/gcc /usr/lib/x86_64-linux-gnu/libc.a

containerd-bins: ## build (or reuse) containerd, its runc shim and ctr in the cache
	@set -e; dir='$(CONTAINERD_BIN_DIR)'; missing=; \
	for b in $(CONTAINERD_BINS); do [ -x "$$dir/$$b" ] || missing="$$missing $$b"; done; \
	if [ -z "$$missing" ]; then echo "containerd $(CONTAINERD_VERSION) cached in $$dir"; exit 0; fi; \
	$(K8S_NEED_GO); mkdir -p "$$dir"; all=$$(date +%s); \
	echo "building containerd $(CONTAINERD_VERSION) ($$missing) into $$dir (cold: about 2 minutes on 2 cores)"; \
	for b in $$missing; do \
	  start=$$(date +%s); \
	  (cd $(CONTAINERD_MOD_DIR) && CGO_ENABLED=0 go build -mod=readonly -p 2 -trimpath -tags '$(CONTAINERD_TAGS)' \
	     -ldflags '$(CONTAINERD_LDFLAGS)' -o "$$dir/$$b.tmp.$$$$" github.com/containerd/containerd/v2/cmd/$$b) \
	     || { rm -f "$$dir/$$b.tmp.$$$$"; exit 1; }; \
	  mv -f "$$dir/$$b.tmp.$$$$" "$$dir/$$b"; echo "  $$b built in $$(( $$(date +%s) - start ))s"; \
	done; \
	echo "containerd $(CONTAINERD_VERSION) built in $$(( $$(date +%s) - all ))s"

containerd-bin-dir: ## print the directory holding the cached containerd binaries
	@echo '$(CONTAINERD_BIN_DIR)'

node-prereqs: ## install the Debian packages a real node needs when missing (root)
	@set -e; pkgs='$(NODE_DEBIAN_PKGS)'; probes='$(NODE_DEBIAN_PROBES)'; missing=; \
	set -- $$probes; for p in $$pkgs; do [ -e "$$1" ] || missing="$$missing $$p"; shift; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "node-prereqs: missing Debian packages:$$missing (install them as root with apt-get)" >&2; exit 1; fi; \
	echo "installing$$missing"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null \
	  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }

.PHONY: containerd-bins containerd-bin-dir node-prereqs
