#!/usr/bin/env bash
# A private Docker daemon for the kind path, on machines without one of their
# own (ours): `start` launches Debian's dockerd with its own data root, exec
# root and socket (never the system service), `stop` ends it and puts back
# every host setting Docker or kind touched. `run CMD...` does both around CMD.
#
# Docker is started without any host-wide network plumbing: no docker0
# (--bridge=none), no iptables rules or chains (--iptables=false,
# --ip-masq=false), no ip_forward change (--ip-forward=false). Settings it could
# still change (FORWARD policy, ip_forward, bridge-nf-call-*) are recorded at
# start and restored at stop whatever happened; /lib/modules, which kind
# bind-mounts and Docker creates when missing, is removed again if it was made.
#
# While the daemon runs this holds /tmp/patchbay-cluster.lock (the lock every
# cluster-starting test takes), by a holder process started at `start` and
# ended at `stop`; PATCHBAY_CLUSTER_LOCK_HELD=1 says a caller already holds it.
#
# A Docker that already answers on DOCKER_HOST (a user's own) is used as it is:
# `start` and `stop` then do nothing.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
read -r KIND_GATEWAY KIND_BRIDGE < <(cd "$HERE/../.." && source hack/kind/common.sh && echo "$KIND_GATEWAY $KIND_BRIDGE")
CACHE=${K8S_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/patchbay}
DATA_ROOT=${PATCHBAY_DOCKER_DATA:-$CACHE/docker-data}   # images survive a stop
RUN_DIR=${PATCHBAY_DOCKER_RUN:-/run/patchbay-docker}     # exec root, socket, pid
SOCK=$RUN_DIR/docker.sock
LOCK=/tmp/patchbay-cluster.lock
# Host-wide settings Docker may touch, and the ones the kubelets in kind nodes
# (privileged containers) write at start: they are not namespaced.
SYSCTLS=(net/ipv4/ip_forward net/bridge/bridge-nf-call-iptables
  net/bridge/bridge-nf-call-ip6tables net/bridge/bridge-nf-call-arptables
  vm/overcommit_memory kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys
  kernel/keys/root_maxbytes)

log() { echo "dockerd.sh: $*" >&2; }

# What a caller exports to reach the daemon this script manages.
env_line() { echo "export DOCKER_HOST=unix://$SOCK"; }

user_docker() {  # a daemon we did not start already answers
  [ "${DOCKER_HOST:-}" != "unix://$SOCK" ] && ! running && docker info >/dev/null 2>&1
}

running() { [ -f "$RUN_DIR/dockerd.pid" ] && kill -0 "$(cat "$RUN_DIR/dockerd.pid")" 2>/dev/null; }

save_settings() {
  local f=$RUN_DIR/settings
  : >"$f"
  for s in "${SYSCTLS[@]}"; do
    [ -e "/proc/sys/$s" ] && echo "sysctl $s $(cat "/proc/sys/$s")" >>"$f"
  done
  echo "forward-policy $(iptables -S FORWARD | awk '$1 == "-P" {print $3}')" >>"$f"
  [ -e /lib/modules ] || echo "made /lib/modules" >>"$f"
  ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print "link " $2}' >>"$f"
}

restore_sysctls() {
  local f=$RUN_DIR/settings kind key value
  [ -f "$f" ] || return 0
  while read -r kind key value; do
    [ "$kind" = sysctl ] || continue
    [ "$(cat "/proc/sys/$key")" = "$value" ] || { echo "$value" >"/proc/sys/$key"; log "restored $key=$value"; }
  done <"$f"
}

restore_settings() {
  local f=$RUN_DIR/settings kind key value
  [ -f "$f" ] || return 0
  restore_sysctls
  while read -r kind key value; do
    case $kind in
      forward-policy) [ "$(iptables -S FORWARD | awk '$1 == "-P" {print $3}')" = "$key" ] \
        || { iptables -P FORWARD "$key"; log "restored FORWARD policy $key"; } ;;
      made) [ -d "$key" ] && rmdir "$key" 2>/dev/null && log "removed $key (made by docker for kind)" ;;
    esac
  done <"$f"
  # Links of Docker's kinds (bridges, veths) that appeared while it ran go.
  local now
  now=$(ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E "^(veth|br-|docker0$|$KIND_BRIDGE$)" || true)
  for l in $now; do
    grep -qx "link $l" "$f" || { ip link delete "$l" 2>/dev/null && log "removed link $l"; } || true
  done
  # Chains Docker makes when its iptables support is on (it is off: none expected).
  for t in filter nat; do
    for c in $(iptables -t "$t" -S | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$t" -F "$c"; log "flushed chain $t/$c"
    done
    iptables -t "$t" -S | awk '$1 == "-A" && $0 ~ /DOCKER/' | sed 's/^-A/-D/' | while read -r rule; do
      eval "iptables -t $t $rule"
    done
    for c in $(iptables -t "$t" -S | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}'); do
      iptables -t "$t" -X "$c"; log "removed chain $t/$c"
    done
  done
  rm -f "$f"
}

unmount_under() {  # mounts the daemon or its containers left behind, deepest first
  awk -v a="$DATA_ROOT" -v b="$RUN_DIR" '$5 ~ "^" a || $5 ~ "^" b {print $5}' /proc/self/mountinfo \
    | sort -r | while read -r m; do umount -l "$m" 2>/dev/null && log "unmounted $m"; done
}

start() {
  if user_docker; then log "using the Docker at $DOCKER_HOST"; return 0; fi
  if running; then return 0; fi
  command -v dockerd >/dev/null || { log "dockerd missing: run 'make docker-bin'"; exit 1; }
  mkdir -p "$RUN_DIR" "$DATA_ROOT"
  if [ -z "${PATCHBAY_CLUSTER_LOCK_HELD:-}" ]; then
    # the holder lives as long as the daemon; `stop` ends it by its pid
    rm -f "$RUN_DIR/locked"
    # (-o: only flock itself holds the lock; setsid: `stop` ends its whole group)
    setsid flock -o "$LOCK" sh -c 'touch "$1"; exec tail -f /dev/null' sh "$RUN_DIR/locked" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$RUN_DIR/lock.pid"
    [ -e "$RUN_DIR/locked" ] || log "waiting for $LOCK (another cluster run holds it)"
    until [ -e "$RUN_DIR/locked" ]; do
      kill -0 "$(cat "$RUN_DIR/lock.pid")" 2>/dev/null || { log "lock holder died"; exit 1; }
      sleep 1
    done
  fi
  save_settings
  local t0=$SECONDS
  setsid dockerd --data-root "$DATA_ROOT" --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/dockerd.pid" \
    -H "unix://$SOCK" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    --oom-score-adjust=0 --storage-driver=overlay2 --log-level=warn \
    --add-runtime "bounded=$HERE/runc-bounded" --default-runtime=bounded \
    --dns "$KIND_GATEWAY" \
    </dev/null >"$RUN_DIR/dockerd.log" 2>&1 &
  until DOCKER_HOST=unix://$SOCK docker version >/dev/null 2>&1; do
    if ! kill -0 $! 2>/dev/null; then log "dockerd exited:"; tail -20 "$RUN_DIR/dockerd.log" >&2; stop; exit 1; fi
    sleep 0.2
  done
  log "dockerd up in $((SECONDS - t0))s (DOCKER_HOST=unix://$SOCK, data in $DATA_ROOT)"
}

stop() {
  if user_docker; then return 0; fi
  if running; then
    local pid
    pid=$(cat "$RUN_DIR/dockerd.pid")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    log "dockerd stopped"
  fi
  unmount_under
  restore_settings
  if [ -f "$RUN_DIR/lock.pid" ]; then
    kill -- "-$(cat "$RUN_DIR/lock.pid")" 2>/dev/null || true
    rm -f "$RUN_DIR/lock.pid"
  fi
  rm -rf "$RUN_DIR/exec" "$SOCK" "$RUN_DIR/dockerd.pid" "$RUN_DIR/locked"
}

case ${1:-} in
  start) start; env_line ;;
  stop) stop ;;
  env) env_line ;;
  restore-sysctls) restore_sysctls ;;
  data-root) echo "$DATA_ROOT" ;;
  run)
    shift
    start >/dev/null
    trap stop EXIT
    DOCKER_HOST=unix://$SOCK "$@"
    ;;
  *) echo "usage: $0 start|stop|env|restore-sysctls|data-root|run CMD..." >&2; exit 2 ;;
esac
