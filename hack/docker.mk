# Docker for the kind path (hack/kind): Debian's docker.io, installed when
# missing, and a private daemon that hack/kind/dockerd.sh starts and stops
# (its own data root in the cache, exec root and socket under
# /run/patchbay-docker, no host-wide network plumbing; every host setting put
# back at stop). A Docker that already answers on DOCKER_HOST is used instead.

DOCKER_DEBIAN_PKGS := docker.io
DOCKERD_SH := K8S_CACHE_ROOT='$(K8S_CACHE_ROOT)' hack/kind/dockerd.sh

docker-bin: ## install Debian's docker.io when dockerd is missing (root)
	@set -e; command -v dockerd >/dev/null && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "docker-bin: dockerd missing; install $(DOCKER_DEBIAN_PKGS) as root" >&2; exit 1; fi; \
	start=$$(date +%s); echo "installing $(DOCKER_DEBIAN_PKGS)"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DOCKER_DEBIAN_PKGS) >/dev/null \
	  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DOCKER_DEBIAN_PKGS) >/dev/null; }; \
	echo "$(DOCKER_DEBIAN_PKGS) installed in $$(( $$(date +%s) - start ))s"

docker-start: docker-bin ## start the private dockerd (holds the cluster lock until docker-stop); prints DOCKER_HOST
	@$(DOCKERD_SH) start

docker-stop: ## stop the private dockerd and restore the host settings it changed
	@$(DOCKERD_SH) stop

.PHONY: docker-bin docker-start docker-stop
