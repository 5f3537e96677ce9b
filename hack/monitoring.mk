# What the chart's monitoring part is validated with (tests/e2e/test_monitoring_chart.py):
#
# - promtool, to check the rendered PrometheusRule. Debian's `prometheus`
#   package ships it, but installing that package pulls in 37 packages (96 MB
#   installed, the Prometheus and node-exporter daemons started as services).
#   So we download the .deb (19 MB, no root needed once apt's lists are
#   there) and extract promtool alone into the cache, keyed by the package
#   version. Building it from its Go module would pull in every
#   service-discovery plugin of Prometheus.
# - the prometheus-operator CRDs (PodMonitor, ServiceMonitor, PrometheusRule),
#   installed into the e2e cluster so the apiserver validates our objects. The
#   Go module proxy serves the operator's module; its zip holds
#   example/prometheus-operator-crd/*.yaml. The version is pinned here only.
#
# Both live in the cache outside the tree, never in the repository.

PROMETHEUS_OPERATOR_VERSION := v0.85.0
PROMETHEUS_OPERATOR_MOD := github.com/prometheus-operator/prometheus-operator
PROMETHEUS_CRDS := podmonitors servicemonitors prometheusrules
PROMETHEUS_CRD_DIR := $(K8S_CACHE_ROOT)/prometheus-operator-crds-$(PROMETHEUS_OPERATOR_VERSION)
PROMTOOL_CACHE := $(K8S_CACHE_ROOT)/promtool

prometheus-crds: ## fetch (or reuse) the prometheus-operator CRDs into the cache
	@set -e; dir='$(PROMETHEUS_CRD_DIR)'; missing=; \
	for c in $(PROMETHEUS_CRDS); do [ -s "$$dir/monitoring.coreos.com_$$c.yaml" ] || missing=1; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	$(K8S_NEED_GO); \
	json=$$(GOFLAGS=-mod=mod go mod download -json $(PROMETHEUS_OPERATOR_MOD)@$(PROMETHEUS_OPERATOR_VERSION)); \
	src=$$(printf '%s' "$$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	test -d "$$src/example/prometheus-operator-crd" || { echo "prometheus-crds: no CRDs in $$src: $$json" >&2; exit 1; }; \
	mkdir -p "$$dir"; \
	for c in $(PROMETHEUS_CRDS); do \
	  cp "$$src/example/prometheus-operator-crd/monitoring.coreos.com_$$c.yaml" "$$dir/.tmp.$$c.$$$$"; \
	  mv -f "$$dir/.tmp.$$c.$$$$" "$$dir/monitoring.coreos.com_$$c.yaml"; \
	done; \
	echo "prometheus-operator $(PROMETHEUS_OPERATOR_VERSION) CRDs in $$dir"

prometheus-crds-dir: ## print the directory holding the cached prometheus-operator CRDs
	@echo '$(PROMETHEUS_CRD_DIR)'

promtool: ## extract (or reuse) promtool from Debian's prometheus package into the cache
	@set -e; cache='$(PROMTOOL_CACHE)'; \
	if [ -x "$$cache/current/promtool" ]; then exit 0; fi; \
	command -v apt-get >/dev/null || { echo "promtool: needs apt-get (Debian) to fetch the prometheus package" >&2; exit 1; }; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	( cd "$$tmp" && apt-get download -q prometheus >/dev/null 2>&1 ) || { \
	  [ "$$(id -u)" = 0 ] || { echo "promtool: apt-get download prometheus failed (run apt-get update as root)" >&2; exit 1; }; \
	  apt-get update -q >/dev/null && ( cd "$$tmp" && apt-get download -q prometheus >/dev/null ); }; \
	deb=$$(ls "$$tmp"/prometheus_*.deb); ver=$$(dpkg-deb -f "$$deb" Version); \
	dpkg-deb -x "$$deb" "$$tmp/x"; mkdir -p "$$cache/$$ver"; \
	cp "$$tmp/x/usr/bin/promtool" "$$cache/$$ver/promtool.tmp" && mv -f "$$cache/$$ver/promtool.tmp" "$$cache/$$ver/promtool"; \
	ln -sfn "$$ver" "$$cache/current"; \
	echo "promtool $$ver (Debian's prometheus package) in $$cache/$$ver"

promtool-path: ## print the path of the cached promtool
	@echo '$(PROMTOOL_CACHE)/current/promtool'

.PHONY: prometheus-crds prometheus-crds-dir promtool promtool-path
