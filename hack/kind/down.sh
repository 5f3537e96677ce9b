#!/usr/bin/env bash
# Delete the kind cluster made by hack/kind/up.sh (and its simulated hosts).
set -euo pipefail
cd "$(dirname "$0")/../.."
kind delete cluster --name "${CLUSTER:-patchbay}"
rm -rf "${SIM:-$PWD/run/kind-sim}" run/kind-cluster.yaml
