#!/usr/bin/env bash
# patchbay on kind, for people with Docker (not part of `make test`; never run
# on our Docker-less machines, so read it before trusting it).
#   hack/kind/up.sh      create the cluster, load the image, install the chart
#   hack/kind/down.sh    delete it
# Each kind node gets its own simulated host (sysfs tree, NVML mock state,
# hot-plug feed) built here from fabric.simhost and bind-mounted at
# /var/lib/patchbay-sim inside the node, plus the NVML mock library: the
# plugin then sees "GPUs" exactly as in `make demo`. Needs: docker, kind,
# kubectl, make, a C compiler; helm comes from `make helm-bin`.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-patchbay}
K8S_VERSION=$(make -s k8s-version)            # the pinned release, e.g. v1.37.2
NODE_IMAGE=${NODE_IMAGE:-kindest/node:$K8S_VERSION}
IMAGE=${IMAGE:-patchbay:dev}
TOPOLOGY=${TOPOLOGY:-2x-h100-nic}              # python -m fabric.simhost list
SIM=${SIM:-$PWD/run/kind-sim}                  # host side of the simulated hosts
WORKERS=(worker worker2)

make -s venv nvml-mock helm-bin
HELM=$(make -s helm-path)

# One simulated host per worker, laid out on the host and mounted into the node.
rm -rf "$SIM"
for w in "${WORKERS[@]}"; do
  dir="$SIM/$CLUSTER-$w"
  PYTHONPATH=. .venv/bin/python -m fabric.simhost build --topology "$TOPOLOGY" --dir "$dir" --name "$CLUSTER-$w"
  mkdir -p "$dir/dev" "$dir/lib"
  cp hack/nvml-mock/build/libnvidia-ml.so.1 "$dir/lib/"
done

mkdir -p run
SIM="$SIM" CLUSTER="$CLUSTER" envsubst < hack/kind/cluster.yaml.in > run/kind-cluster.yaml
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config run/kind-cluster.yaml

docker build -f hack/image/Dockerfile -t "$IMAGE" .
kind load docker-image --name "$CLUSTER" "$IMAGE"

"$HELM" upgrade --install patchbay helm/patchbay --namespace patchbay --create-namespace \
  --kube-context "kind-$CLUSTER" -f hack/kind/values.yaml \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --wait

# The example workloads: each file holds its claims and pods.
for f in deviceclasses/examples/*.yaml; do
  kubectl --context "kind-$CLUSTER" apply -f "$f"
done
kubectl --context "kind-$CLUSTER" get resourceslices,resourceclaims,pods -A -o wide
