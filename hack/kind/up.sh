#!/usr/bin/env bash
# patchbay on kind, for people with Docker (not part of `make test`; never run
# on our Docker-less machines, so read it before trusting it).
#   hack/kind/up.sh      create the cluster, load the image, install the chart
#   hack/kind/down.sh    delete it
# Each kind node gets its own simulated host (sysfs tree, NVML mock state,
# hot-plug feed) built here from fabric.simhost and bind-mounted at
# /var/lib/patchbay-sim inside the node, plus the NVML mock library under its
# driver root: the plugin then sees "GPUs" exactly as on the real-node tier.
# The images and the chart values are the real-node tier's own (`make images`
# archives, hack/simulated-values.yaml): only who runs the node differs.
# Needs: docker, kind, kubectl, make, a C compiler, root for `make images`
# (debootstrap, buildah); helm comes from `make helm-bin`.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-patchbay}
K8S_VERSION=$(make -s k8s-version)            # the pinned release, e.g. v1.37.2
NODE_IMAGE=${NODE_IMAGE:-kindest/node:$K8S_VERSION}
TOPOLOGY=${TOPOLOGY:-2x-h100-nic}              # python -m fabric.simhost list
SIM=${SIM:-$PWD/run/kind-sim}                  # host side of the simulated hosts
WORKERS=(worker worker2)

make -s venv nvml-mock helm-bin images
HELM=$(make -s helm-path)

# One simulated host per worker, laid out on the host and mounted into the node.
rm -rf "$SIM"
for w in "${WORKERS[@]}"; do
  dir="$SIM/$CLUSTER-$w"
  PYTHONPATH=. .venv/bin/python -m fabric.simhost build --topology "$TOPOLOGY" --dir "$dir" --name "$CLUSTER-$w"
  mkdir -p "$dir/dev" "$dir/driver/usr/lib/x86_64-linux-gnu"
  cp hack/nvml-mock/build/libnvidia-ml.so.1 "$dir/driver/usr/lib/x86_64-linux-gnu/"
done

mkdir -p run
SIM="$SIM" CLUSTER="$CLUSTER" envsubst < hack/kind/cluster.yaml.in > run/kind-cluster.yaml
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config run/kind-cluster.yaml

# The same OCI archives the real-node tier imports with ctr (pause is kind's own).
for name in busybox patchbay; do
  kind load image-archive --name "$CLUSTER" "$(python3 hack/images.py path "$name")"
done

"$HELM" upgrade --install patchbay helm/patchbay --namespace patchbay --create-namespace \
  --kube-context "kind-$CLUSTER" -f hack/simulated-values.yaml --wait

# The example workloads: each file holds its claims and pods.
for f in deviceclasses/examples/*.yaml; do
  kubectl --context "kind-$CLUSTER" apply -f "$f"
done
kubectl --context "kind-$CLUSTER" get resourceslices,resourceclaims,pods -A -o wide
