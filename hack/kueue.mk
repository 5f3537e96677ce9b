# Kueue's manager (cmd/kueue), built from its upstream Go module by the wrapper
# module in hack/kueue, plus the manifests the e2e tier installs from the same
# module zip: its CRDs (config/components/crd/bases, with the conversion-webhook
# patches of config/components/crd/patches), its webhook configurations
# (config/components/webhook/manifests.yaml) and the manager's RBAC
# (config/components/rbac/role.yaml, manager_secrets_role.yaml). The pinned release lives only in
# hack/kueue/go.mod (the sigs.k8s.io/kueue requirement); everything here derives
# from it. All of it is cached outside the work tree, keyed by that version and a
# hash of the wrapper's go.sum and the build recipe, like the control plane.

KUEUE_MOD_DIR := hack/kueue
KUEUE_MOD := sigs.k8s.io/kueue
KUEUE_VERSION := $(shell awk '$$1 == "$(KUEUE_MOD)" && $$2 ~ /^v/ {print $$2; exit}' $(KUEUE_MOD_DIR)/go.mod)
KUEUE_LDFLAGS := -s -w -X $(KUEUE_MOD)/pkg/version.GitVersion=$(KUEUE_VERSION)
KUEUE_SUM_HASH := $(shell { cat $(KUEUE_MOD_DIR)/go.sum; echo '$(KUEUE_LDFLAGS)'; } 2>/dev/null | sha256sum | cut -c1-8)
KUEUE_DIR := $(K8S_CACHE_ROOT)/kueue-$(KUEUE_VERSION)-$(KUEUE_SUM_HASH)

# Complete when the binary and both manifest folders are there; a missing part
# is (re)made from the module, each written to a temporary name and moved.
kueue-bin: ## build (or reuse) Kueue's manager and copy its CRDs, webhooks and RBAC into the cache
	@set -e; dir='$(KUEUE_DIR)'; \
	test -n "$(KUEUE_VERSION)" || { echo "kueue-bin: no $(KUEUE_MOD) version in $(KUEUE_MOD_DIR)/go.mod" >&2; exit 1; }; \
	if [ -x "$$dir/bin/kueue" ] && [ -s "$$dir/webhook/manifests.yaml" ] && [ -s "$$dir/rbac/role.yaml" ] \
	   && ls "$$dir"/crd/*.yaml >/dev/null 2>&1; then exit 0; fi; \
	$(K8S_NEED_GO); mkdir -p "$$dir/bin" "$$dir/webhook" "$$dir/rbac"; \
	src=$$(cd $(KUEUE_MOD_DIR) && go mod download -json $(KUEUE_MOD) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	test -d "$$src/config/components/crd/bases" || { echo "kueue-bin: no CRDs in the module dir '$$src'" >&2; exit 1; }; \
	rm -rf "$$dir/crd.tmp.$$$$"; mkdir -p "$$dir/crd.tmp.$$$$/patches"; \
	cp "$$src"/config/components/crd/bases/*.yaml "$$dir/crd.tmp.$$$$/"; \
	cp "$$src"/config/components/crd/patches/webhook_in_*.yaml "$$dir/crd.tmp.$$$$/patches/"; \
	rm -rf "$$dir/crd"; mv "$$dir/crd.tmp.$$$$" "$$dir/crd"; \
	cp "$$src/config/components/webhook/manifests.yaml" "$$dir/webhook/.tmp.$$$$"; \
	mv -f "$$dir/webhook/.tmp.$$$$" "$$dir/webhook/manifests.yaml"; \
	for f in manager_secrets_role role; do \
	  cp "$$src/config/components/rbac/$$f.yaml" "$$dir/rbac/.tmp.$$$$"; mv -f "$$dir/rbac/.tmp.$$$$" "$$dir/rbac/$$f.yaml"; \
	done; \
	if [ ! -x "$$dir/bin/kueue" ]; then \
	  echo "building kueue $(KUEUE_VERSION) into $$dir (cold: 10-20 min on 2 cores)"; start=$$(date +%s); \
	  (cd $(KUEUE_MOD_DIR) && go build -mod=readonly -p 2 -trimpath -ldflags "$(KUEUE_LDFLAGS)" \
	    -o "$$dir/bin/kueue.tmp.$$$$" $(KUEUE_MOD)/cmd/kueue) || { rm -f "$$dir/bin/kueue.tmp.$$$$"; exit 1; }; \
	  mv -f "$$dir/bin/kueue.tmp.$$$$" "$$dir/bin/kueue"; \
	  echo "kueue $(KUEUE_VERSION) built in $$(( $$(date +%s) - start ))s"; \
	fi

kueue-dir: ## print the directory holding the cached Kueue build (bin/, crd/, webhook/, rbac/)
	@echo '$(KUEUE_DIR)'

kueue-version: ## print the pinned Kueue release
	@echo '$(KUEUE_VERSION)'

.PHONY: kueue-bin kueue-dir kueue-version
