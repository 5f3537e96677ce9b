#!/usr/bin/env bash
# Remove what hack/kind/up.sh made: the kind cluster, its network, the
# simulated hosts and their effect processes, and the private dockerd if up.sh
# started it (hack/kind/dockerd.sh stop restores the host settings).
set -euo pipefail
cd "$(dirname "$0")/../.."
source hack/kind/common.sh
eval "$(make -s kind-env)"

for w in "${WORKERS[@]}"; do
  if [ -f "$RUN/effects-$w.pid" ]; then
    kill "$(cat "$RUN/effects-$w.pid")" 2>/dev/null || true
    rm -f "$RUN/effects-$w.pid"
  fi
done
docker_env
if docker info >/dev/null 2>&1; then
  [ -x "$KIND" ] && "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" >&2
  docker network rm "$KIND_NET" >/dev/null 2>&1 || true
fi
if [ -f "$RUN/private-dockerd" ]; then
  hack/kind/dockerd.sh stop
  rm -f "$RUN/private-dockerd"
fi
rm -rf "$SIM" "$RUN/cluster.yaml"
