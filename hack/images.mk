# Container images of the real-node tier (tests/harness/realnode), built without a
# registry or a daemon by tests/harness/images.py: the pause (sandbox) image, the
# busybox workload image and the patchbay image (hack/image/Dockerfile built by
# buildah on a debootstrapped Debian base). Each is an OCI archive cached
# outside the work tree, named by a hash of its inputs, that
# `ctr -n k8s.io images import` and `kind load image-archive` read. A warm run
# only hashes the inputs. See docs/images.md.

K8S_CACHE_ROOT ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/patchbay
IMAGES_DIR := $(K8S_CACHE_ROOT)/images
# The system python3 suffices (stdlib only); no virtual environment needed.
IMAGES_PY := K8S_CACHE_ROOT='$(K8S_CACHE_ROOT)' python3 hack/images.py

images: node-prereqs ## build (or reuse) the pause, busybox and patchbay OCI archives in the cache
	@$(IMAGES_PY) build

images-dir: ## print the directory holding the cached image archives
	@echo '$(IMAGES_DIR)'

.PHONY: images images-dir
