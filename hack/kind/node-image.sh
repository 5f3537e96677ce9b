#!/usr/bin/env bash
# Assemble a kind node image offline (`kind build node-image` cannot run here:
# it fetches etcd, coredns, pause and kindnetd from a registry). We assemble
# rather than patch kind, so kind itself stays the unmodified v0.33.0 module.
#
# The image is kind's base contract on our own parts:
# - root filesystem: Debian bookworm by debootstrap, with the packages kind's
#   images/base Dockerfile installs (less NFS/iSCSI/fuse, which we never use);
# - kind's images/base files from the kind module (entrypoint, systemd units,
#   kubelet drop-ins), and the same clean-up of systemd units as its Dockerfile;
# - containerd, its shim and ctr from `make containerd-bins`, Debian's runc and
#   CNI plugins (what the real-node tier runs); hack/kind/containerd.toml;
# - kubeadm, kubelet, kubectl of the pinned release (kubeadm built by
#   hack/kind.mk from the same pin);
# - images, imported with `ctr import` (--no-unpack, pinned, as kind does) by a
#   unit at the node's start, before the kubelet: kube-apiserver,
#   kube-controller-manager, kube-scheduler, kube-proxy and etcd (each our
#   binary on the bookworm root, which kube-proxy needs for iptables; one OCI
#   archive, the root layer once), and the pause image of hack/image.
# Not included: coredns (kubeadm's addon/coredns phase is skipped: nothing
# here resolves service names), kindnetd (the kind config disables the default
# CNI; hack/kind/up.sh writes a bridge plugin config with routes) and
# local-path-provisioner (no default-storage manifest: kind then applies only
# its legacy host-path StorageClass object, no pod).
#
# Output: a docker-archive in the cache named by a hash of every input; a warm
# run only hashes. Prints "<archive> <image ref>". Root (debootstrap, mounts).
#
# Environment (set by hack/kind.mk): K8S_CACHE_ROOT K8S_VERSION K8S_BIN_DIR
# KUBEADM CONTAINERD_BIN_DIR KIND_MOD_DIR PAUSE_ARCHIVE ETCD_TAG
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=$K8S_CACHE_ROOT
RELEASE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PKGS=systemd,conntrack,iptables,nftables,iproute2,ethtool,kmod,libseccomp2,pigz,ca-certificates,jq,procps,util-linux,mount,e2fsprogs
CP_BINS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
NODE_BINS=(kubelet kubectl)
CNI_PLUGINS=(bridge host-local loopback portmap ptp)
log() { echo "node-image: $*" >&2; }

# --- the cache key: every input's content
key=$( {
  echo "$RELEASE $PKGS $K8S_VERSION $ETCD_TAG"
  cat "$0" hack/kind/containerd.toml hack/kind/patchbay-images.service
  (cd "$KIND_MOD_DIR/images/base/files" && find . -type f | LC_ALL=C sort | xargs sha256sum)
  sha256sum "$KUBEADM" "$PAUSE_ARCHIVE" /usr/sbin/runc
  for b in "${CP_BINS[@]}" "${NODE_BINS[@]}" etcd; do sha256sum "$K8S_BIN_DIR/$b"; done
  for b in containerd containerd-shim-runc-v2 ctr; do sha256sum "$CONTAINERD_BIN_DIR/$b"; done
  for p in "${CNI_PLUGINS[@]}"; do sha256sum "/usr/lib/cni/$p"; done
} | sed "s#  /.*/#  #" | sha256sum | cut -c1-16)
OUT=$CACHE/kind-node-$K8S_VERSION-$key.tar
REF=localhost/patchbay-kind-node:$K8S_VERSION-$key
if [ -s "$OUT" ]; then echo "$OUT $REF"; exit 0; fi

WORK=$(mktemp -d "$CACHE/kind-node-work.XXXXXX")
cleanup() {
  awk -v w="$WORK" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
  rm -rf "$WORK"
}
trap cleanup EXIT
t_all=$SECONDS

# --- 1. the Debian root filesystem (cached on its own: it changes least)
ROOTFS_TAR=$CACHE/kind-rootfs-$RELEASE-$(echo "$RELEASE $PKGS $MIRROR" | sha256sum | cut -c1-12).tar
if [ ! -s "$ROOTFS_TAR" ]; then
  t=$SECONDS
  log "debootstrap $RELEASE (minutes, cold)"
  debootstrap --variant=minbase --include="$PKGS" "$RELEASE" "$WORK/deb" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
  rm -rf "$WORK/deb/var/cache/apt/archives"/*.deb "$WORK/deb/var/lib/apt/lists"/*
  tar -C "$WORK/deb" --numeric-owner --xattrs -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  rm -rf "$WORK/deb"
  log "rootfs in $((SECONDS - t))s"
fi

# --- 2. the node's root: kind's base contract on the Debian root
t=$SECONDS
R=$WORK/root
mkdir -p "$R"
tar -C "$R" --numeric-owner --xattrs -xf "$ROOTFS_TAR"
F=$KIND_MOD_DIR/images/base/files
install -m 0755 "$F"/usr/local/bin/* "$R/usr/local/bin/"
mkdir -p "$R/kind/bin" "$R/LICENSES" "$R/etc/containerd" "$R/etc/systemd/system/kubelet.service.d" \
  "$R/etc/kubernetes/manifests" "$R/opt/cni/bin" "$R/etc/cni/net.d"
install -m 0644 "$F/kind/README.txt" "$R/kind/"
install -m 0755 "$F"/kind/bin/* "$R/kind/bin/"
install -m 0644 "$F"/LICENSES/* "$R/LICENSES/"
install -m 0644 "$F/etc/crictl.yaml" "$R/etc/"
install -m 0644 "$F"/etc/default/* "$R/etc/default/"
install -m 0644 "$F"/etc/sysctl.d/* "$R/etc/sysctl.d/"
find "$F/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 -t "$R/etc/systemd/system/" {} +
install -m 0644 "$F"/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"
install -m 0644 hack/kind/containerd.toml "$R/etc/containerd/config.toml"
# No CAP_SYS_RESOURCE here: containerd may not lower its own oom_score_adj.
sed -i '/^OOMScoreAdjust=/d' "$R/etc/systemd/system/containerd.service"
# kind's Dockerfile clean-up of systemd units, then its enable/mask step
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$R/sbin/init"
systemctl --root="$R" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
systemctl --root="$R" mask systemd-binfmt.service >/dev/null 2>&1
# binaries
install -m 0755 "$CONTAINERD_BIN_DIR"/{containerd,containerd-shim-runc-v2,ctr} "$R/usr/local/bin/"
install -m 0755 /usr/sbin/runc "$R/usr/local/sbin/runc"
for p in "${CNI_PLUGINS[@]}"; do install -m 0755 "/usr/lib/cni/$p" "$R/opt/cni/bin/"; done
install -m 0755 "$KUBEADM" "$R/usr/bin/kubeadm"
for b in "${NODE_BINS[@]}"; do install -m 0755 "$K8S_BIN_DIR/$b" "$R/usr/bin/$b"; done
echo "$K8S_VERSION" >"$R/kind/version"
"$CONTAINERD_BIN_DIR/ctr" oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' >"$R/etc/containerd/cri-base.json"
log "node root in $((SECONDS - t))s"

# --- 3. the control-plane images: our binaries on the bookworm root (buildah,
# private vfs storage in the work dir: nothing mounted on the host)
t=$SECONDS
BH=(buildah --root "$WORK/bh/root" --runroot "$WORK/bh/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR" "$WORK/images"
c=$("${BH[@]}" from --quiet scratch)
"${BH[@]}" add --quiet "$c" "$ROOTFS_TAR" / >/dev/null
"${BH[@]}" commit --quiet "$c" cp-base >/dev/null
"${BH[@]}" rm "$c" >/dev/null
image() {  # <name:tag> <binary path>: into one OCI layout (the shared base layer once)
  local c
  c=$("${BH[@]}" from --quiet cp-base)
  "${BH[@]}" copy --quiet --chmod 0755 "$c" "$2" "/usr/local/bin/$(basename "$2")" >/dev/null
  "${BH[@]}" commit --quiet "$c" "oci:$WORK/layout:registry.k8s.io/$1" >/dev/null
  "${BH[@]}" rm "$c" >/dev/null
}
for b in "${CP_BINS[@]}"; do image "$b:$K8S_VERSION" "$K8S_BIN_DIR/$b"; done
image "etcd:$ETCD_TAG" "$K8S_BIN_DIR/etcd"
# containerd names an imported image by this annotation
jq '.manifests[] |= (.annotations["io.containerd.image.name"] = .annotations["org.opencontainers.image.ref.name"])' \
  "$WORK/layout/index.json" >"$WORK/index.json" && mv "$WORK/index.json" "$WORK/layout/index.json"
mkdir -p "$R/kind/images"
tar -C "$WORK/layout" -cf "$R/kind/images/control-plane.oci.tar" .
cp "$PAUSE_ARCHIVE" "$R/kind/images/pause.oci.tar"
rm -rf "$WORK/layout"
log "control-plane images in $((SECONDS - t))s"

# --- 4. `ctr import` at the node's first start (patchbay-images.service,
# ordered before the kubelet): importing here would need a containerd on this
# host, i.e. the cluster lock, for a content copy.
install -m 0644 hack/kind/patchbay-images.service "$R/etc/systemd/system/"
printf '[Unit]\nWants=patchbay-images.service\nAfter=patchbay-images.service\n' \
  >"$R/etc/systemd/system/kubelet.service.d/20-patchbay-images.conf"
systemctl --root="$R" enable patchbay-images.service >/dev/null 2>&1

# --- 5. the node image (kind's metadata: env, stop signal, entrypoint)
t=$SECONDS
tar -C "$R" --numeric-owner --xattrs -cf "$WORK/root.tar" .
rm -rf "$R"
c=$("${BH[@]}" from --quiet scratch)
"${BH[@]}" add --quiet "$c" "$WORK/root.tar" / >/dev/null
rm -f "$WORK/root.tar"
"${BH[@]}" config --env container=docker --stop-signal 'SIGRTMIN+3' \
  --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' "$c"
"${BH[@]}" commit --quiet "$c" "docker-archive:$OUT.tmp:$REF" >/dev/null
mv "$OUT.tmp" "$OUT"
log "node image in $((SECONDS - t))s (all: $((SECONDS - t_all))s)"
# one node image per pin: older builds go
find "$CACHE" -maxdepth 1 -name "kind-node-$K8S_VERSION-*.tar" ! -name "$(basename "$OUT")" -delete
echo "$OUT $REF"
