# Names shared by hack/kind/up.sh and down.sh (sourced, after `cd` to the repo).
CLUSTER=${CLUSTER:-patchbay}
TOPOLOGY=${TOPOLOGY:-2x-h100-nic}              # python -m fabric.simhost list
RUN=${KIND_RUN:-$PWD/run/kind}                 # config, pids, logs
SIM=${SIM:-$RUN/sim}                           # host side of the simulated hosts
WORKERS=(worker worker2)
# The kind network: made by up.sh with a bridge name we know (the tier's guard
# and the clean-up find it by that name). Not --internal: Docker publishes no
# port on an internal network, and kind needs the apiserver's published. It is
# as closed: the private dockerd adds no NAT (--iptables=false) and leaves
# ip_forward off, and its DNS forwarder is pointed at the bridge's own address
# (KIND_GATEWAY, where nothing answers) instead of the host's resolvers.
KIND_NET=${KIND_NET:-patchbay-kind}
KIND_BRIDGE=${KIND_BRIDGE:-pb-kind0}
KIND_SUBNET=${KIND_SUBNET:-172.31.250.0/24}
KIND_GATEWAY=${KIND_GATEWAY:-172.31.250.1}
KIND_POD_CIDR=10.244.0.0/16                    # kind's default podSubnet
export KUBECONFIG=${KUBECONFIG:-$HOME/.kube/config}

kc() { "$K8S_BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

# Docker: a user's own daemon when one answers, else our private one (marked in
# $RUN so that down.sh stops exactly what up.sh started).
docker_up() {
  mkdir -p "$RUN"
  if [ -f "$RUN/private-dockerd" ] || ! docker info >/dev/null 2>&1; then
    eval "$(hack/kind/dockerd.sh start)"
    touch "$RUN/private-dockerd"
  fi
}
docker_env() {
  if [ -f "$RUN/private-dockerd" ]; then eval "$(hack/kind/dockerd.sh env)"; fi
}
