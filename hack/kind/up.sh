#!/usr/bin/env bash
# patchbay on kind, for people with Docker (and the kind tier, tests/kind).
#   hack/kind/up.sh      create the cluster, load the images, install the chart,
#                        apply the examples
#   hack/kind/down.sh    remove all of it
# Each worker gets its own simulated host (sysfs tree, NVML mock state,
# hot-plug feed; fabric.simhost) bind-mounted at /var/lib/patchbay-sim, the
# NVML mock library under its driver root, and a process applying the host's
# driver effects (VF creation) on this side: the plugin then sees "GPUs" as on
# the real-node tier. Images and chart values are that tier's own (`make
# images` archives, hack/simulated-values.yaml); the node image is assembled
# offline (hack/kind/node-image.sh). Nothing is pulled.
#
# Docker: one answering on DOCKER_HOST (or its default socket) is used as it
# is; otherwise hack/kind/dockerd.sh starts a private daemon, which down.sh
# stops. The kind network is made here (hack/kind/common.sh says why it is not
# --internal), with a bridge of a fixed name (KIND_BRIDGE), and handed to kind
# by KIND_EXPERIMENTAL_DOCKER_NETWORK.
#
# Needs: root, Go, make, a C compiler (everything else `make` builds or
# installs: Debian's docker.io, kind, kubeadm, helm, the images).
# EXAMPLES="single-gpu mig-1g" applies only those deviceclasses/examples.
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/kind/common.sh

t0=$SECONDS
make -s venv nvml-mock helm-bin kind-bin docker-bin images >&2
# The archives just built, named now: their names hash the sources, which may
# change while up.sh runs.
declare -A ARCHIVE
for image in busybox patchbay; do
  ARCHIVE[$image]=$(python3 hack/images.py path "$image") \
    || { echo "up: no $image archive for the sources as they are now (edited during the build?)" >&2; exit 1; }
done
eval "$(make -s kind-env)"
read -r NODE_ARCHIVE NODE_IMAGE < <(make -s kind-node-image | tail -1)
export NODE_IMAGE ETCD_TAG
echo "up: prerequisites ready in $((SECONDS - t0))s" >&2

docker_up
docker image inspect "$NODE_IMAGE" >/dev/null 2>&1 || docker load -q -i "$NODE_ARCHIVE" >&2

exists=
"$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER" && exists=1

# One simulated host per worker, laid out here and mounted into the node.
[ -n "$exists" ] || rm -rf "$SIM"
mkdir -p "$RUN"
for w in "${WORKERS[@]}"; do
  [ -z "$exists" ] || continue
  dir=$SIM/$CLUSTER-$w
  PYTHONPATH=. .venv/bin/python -m fabric.simhost build --topology "$TOPOLOGY" --dir "$dir" --name "$CLUSTER-$w"
  # the driver root as the real-node tier lays it out (tests/harness/realnode_node.py):
  # the NVML mock, and NVIDIA's tools as the simulated host's stand-ins run by
  # the image's python inside the plugin pods
  mkdir -p "$dir/dev" "$dir/driver/usr/lib/x86_64-linux-gnu" "$dir/driver/usr/bin"
  cp hack/nvml-mock/build/libnvidia-ml.so.1 "$dir/driver/usr/lib/x86_64-linux-gnu/"
  printf '#!/bin/sh\nexec /opt/patchbay/bin/python3 -m fabric.simhost.nvidia_smi --host /var/lib/patchbay-sim "$@"\n' \
    >"$dir/driver/usr/bin/nvidia-smi"
  printf '#!/bin/sh\nexec /opt/patchbay/bin/python3 -m fabric.simhost.mps_control "$@"\n' \
    >"$dir/driver/usr/bin/nvidia-cuda-mps-control"
  chmod 0755 "$dir"/driver/usr/bin/*
  # (the process writes its own pid: down.sh ends exactly it)
  PYTHONPATH=. setsid sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$RUN/effects-$w.pid" \
    .venv/bin/python -m fabric.simhost effects --dir="$dir" </dev/null >"$RUN/effects-$w.log" 2>&1 &
done

docker network inspect "$KIND_NET" >/dev/null 2>&1 \
  || docker network create --subnet "$KIND_SUBNET" --gateway "$KIND_GATEWAY" \
    -o com.docker.network.bridge.name="$KIND_BRIDGE" "$KIND_NET" >/dev/null
export KIND_EXPERIMENTAL_DOCKER_NETWORK=$KIND_NET

SIM="$SIM" CLUSTER="$CLUSTER" envsubst <hack/kind/cluster.yaml.in >"$RUN/cluster.yaml"
t=$SECONDS
if [ -n "$exists" ]; then
  echo "up: cluster $CLUSTER exists; updating it" >&2
else
  "$KIND" create cluster --name "$CLUSTER" --config "$RUN/cluster.yaml" --kubeconfig "$KUBECONFIG" >&2
  echo "up: kind create cluster in $((SECONDS - t))s" >&2
fi
# The kubelets wrote vm.overcommit_memory and kernel.panic* at start (global,
# not namespaced): put the host's values back now.
hack/kind/dockerd.sh restore-sysctls

# CNI: the bridge plugin on each node with its pod CIDR, routes to the others.
kc wait --for=jsonpath='{.spec.podCIDR}' nodes --all --timeout=120s >/dev/null
nodes=$(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.spec.podCIDR}={.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
for n in $nodes; do
  IFS== read -r name cidr _ <<<"$n"
  docker exec -i "$name" sh -c 'cat >/etc/cni/net.d/10-patchbay-bridge.conflist' <<EOF
{"cniVersion": "1.0.0", "name": "patchbay-kind", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  for m in $nodes; do
    IFS== read -r other ocidr oip <<<"$m"
    [ "$other" = "$name" ] || docker exec "$name" ip route replace "$ocidr" via "$oip"
  done
done
kc wait --for=condition=Ready nodes --all --timeout=180s >&2

# The same OCI archives the real-node tier imports with ctr (pause is in the node image).
for image in busybox patchbay; do
  "$KIND" load image-archive --name "$CLUSTER" "${ARCHIVE[$image]}" >&2
done

t=$SECONDS
"$HELM" upgrade --install patchbay helm/patchbay --namespace patchbay --create-namespace \
  --kubeconfig "$KUBECONFIG" -f hack/simulated-values.yaml --wait --timeout 5m >&2
echo "up: chart installed in $((SECONDS - t))s" >&2

# The examples kind runs: all but the fabric ones (they need the fabric service
# and adapters on a GPU-less node; the real-node tier runs those).
for f in ${EXAMPLES:-$(ls deviceclasses/examples/*.yaml | xargs -n1 basename | sed 's/\.yaml$//')}; do
  grep -q -E 'fabric|cxl|nvme' <<<"$f" && [ -z "${EXAMPLES:-}" ] && continue
  kc apply -f "deviceclasses/examples/$f.yaml" >&2
done
echo "up: done in $((SECONDS - t0))s; KUBECONFIG=$KUBECONFIG" >&2
