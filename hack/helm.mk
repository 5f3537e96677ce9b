# The `helm` CLI, built from the upstream Helm Go module by the tool-only
# wrapper module in hack/helm (the pin is the helm.sh/helm/v4 requirement in
# hack/helm/go.mod). Cached outside the work tree like the control plane,
# keyed by that version and a hash of the wrapper's go.sum.

HELM_MOD_DIR := hack/helm
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v4" && $$2 ~ /^v/ {print $$2; exit}' $(HELM_MOD_DIR)/go.mod)
HELM_SUM_HASH := $(shell sha256sum $(HELM_MOD_DIR)/go.sum 2>/dev/null | cut -c1-8)
HELM_BIN_DIR := $(K8S_CACHE_ROOT)/helm-$(HELM_VERSION)-$(HELM_SUM_HASH)/bin
HELM := $(HELM_BIN_DIR)/helm
HELM_CHART := helm/patchbay
# Helm prints its own version from these variables; without it, it says v4.3.
HELM_LDFLAGS := -s -w -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)

helm-bin: ## build (or reuse) the helm CLI in the cache
	@set -e; bin='$(HELM)'; \
	if [ -x "$$bin" ]; then exit 0; fi; \
	test -n "$(HELM_VERSION)" || { echo "helm-bin: no helm.sh/helm/v4 version in $(HELM_MOD_DIR)/go.mod" >&2; exit 1; }; \
	command -v go >/dev/null 2>&1 || { echo "helm-bin: the 'go' command is not on PATH." \
	  "Install Go >= 1.26 (https://go.dev/dl) to build helm $(HELM_VERSION)." >&2; exit 1; }; \
	echo "building helm $(HELM_VERSION) into $$(dirname "$$bin") (cold build: minutes on 2 cores)"; \
	start=$$(date +%s); mkdir -p "$$(dirname "$$bin")"; \
	(cd $(HELM_MOD_DIR) && go build -mod=readonly -p 2 -trimpath -ldflags '$(HELM_LDFLAGS)' \
	  -o "$$bin.tmp.$$$$" helm.sh/helm/v4/cmd/helm); \
	mv -f "$$bin.tmp.$$$$" "$$bin"; \
	echo "helm $(HELM_VERSION) built in $$(( $$(date +%s) - start ))s"

helm-path: ## print the path of the cached helm binary
	@echo '$(HELM)'

helm-lint: helm-bin ## helm lint the chart (strict) with its default values
	'$(HELM)' lint --strict $(HELM_CHART)

# The chart's DeviceClasses are verbatim copies of deviceclasses/*.yaml (the
# single source; a chart cannot read files outside its directory).
# tests/unit/test_chart_values.py fails when they drift.
helm-deviceclasses: ## refresh the chart's DeviceClass copies from deviceclasses/
	rm -f $(HELM_CHART)/deviceclasses/*.yaml
	cp deviceclasses/*.yaml $(HELM_CHART)/deviceclasses/

.PHONY: helm-bin helm-path helm-lint helm-deviceclasses
