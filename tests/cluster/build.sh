#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build (once) and cache everything the test control plane and the local node run:
#   control-plane: etcd (Debian etcd-server), kube-apiserver, kube-controller-manager, helm, kubectl
#   node:          kube-scheduler, kubelet, kube-proxy, CoreDNS, the pause image, containerd/runc/CNI
#   kind:          the kind CLI (only when asked: `build.sh kind`)
# Kubernetes comes from the Go module proxy through the wrapper module in tests/cluster/k8s, helm,
# CoreDNS and kind through `go install`. Binaries land in $PETS_CACHE/bin, each with a stamp file
# holding the version it was built from, so a cached binary is reused until the version changes.
#
#   smoke-image:   the smoke tests' pod image (debootstrapped python3), as an OCI archive
#   kubeflow:      Kubeflow's training-operator (go install) and its image   (addons.sh; only when asked)
#   kueue:         Kueue (go install where the proxy serves it, else $PETS_KUEUE_DIR/kueue.gz) and its image
#   local-path:    rancher's local-path-provisioner (go install) and its one-binary image (storage.sh)
#   netpol:        the NetworkPolicy enforcer kube-network-policies, from its source tarball (netpol-build.sh)
# usage: build.sh [all|control-plane|node|kind|smoke-image|kubeflow|kueue|local-path|s3|mlflow|prometheus|netpol|print-bin]...  (default: all = control-plane node)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KIND_VERSION="${KIND_VERSION:-v0.30.0}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
K8S_VERSION="$(k8s_version)"

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
# One Go build cache for every build here (the node's binaries reuse most of the control plane's
# packages). It grows to about 5 GB, so once every Go binary of the control plane and the node is
# cached, ours is removed: nothing is left that it would speed up. A GOCACHE of the caller's stays.
OWN_GOCACHE="$PETS_CACHE/go-build"
export GOCACHE="${GOCACHE:-$OWN_GOCACHE}"
mkdir -p "$PETS_BIN" "$GOCACHE"

CONTROL_PLANE_PACKAGES=(etcd-server openssl curl)
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack gcc libc6-dev python3)

# Install Debian packages that are missing; touch apt only when something is.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# is_cached NAME VERSION: the binary exists and was built from VERSION.
is_cached() {
  [[ -x "$PETS_BIN/$1" && "$(cat "$PETS_BIN/.$1.version" 2>/dev/null)" == "$2" ]]
}

mark_cached() { printf '%s\n' "$2" >"$PETS_BIN/.$1.version"; }

# go_progress NAME build|install ARGS...: nice'd, with a line every 100 packages (`-v` names each).
go_progress() {
  local name="$1" sub="$2"; shift 2
  nice -n 15 go "$sub" -v "$@" 2>&1 | awk -v n="$name" '
    /^(go: |#|.*\.go:[0-9]+)/ { print; next }
    { c++; if (c % 100 == 0) printf "  [%s] %d packages compiled\n", n, c; fflush() }'
  return "${PIPESTATUS[0]}"
}

build_k8s() {
  local name="$1" major minor ldflags t0
  is_cached "$name" "$K8S_VERSION" && { log "$name $K8S_VERSION: cached"; return 0; }
  t0=$SECONDS
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  log "$name $K8S_VERSION: building (nice -n 15; a cold build takes minutes)"
  (cd "$HERE/k8s" && go_progress "$name" build -trimpath -ldflags "$ldflags" \
      -o "$PETS_BIN/.$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$PETS_BIN/.$name.tmp" "$PETS_BIN/$name"
  mark_cached "$name" "$K8S_VERSION"
  log "$name $K8S_VERSION: built in $((SECONDS - t0)) s"
}

# pets-cri (k8s/cmd/pets-cri): stop and remove pod sandboxes through the CRI on cluster down.
build_pets_cri() {
  local key
  key="$K8S_VERSION $(sha256sum "$HERE/k8s/cmd/pets-cri/main.go" | cut -c1-12)"
  is_cached pets-cri "$key" && { log "pets-cri: cached"; return 0; }
  (cd "$HERE/k8s" && nice -n 15 go build -trimpath -ldflags "-s -w" -o "$PETS_BIN/pets-cri" ./cmd/pets-cri)
  mark_cached pets-cri "$key"
  log "pets-cri: built"
}

# go_install NAME MODULE/PKG VERSION [EXTRA_LDFLAGS]
go_install() {
  local name="$1" pkg="$2" version="$3" extra="${4:-}" t0 gobin
  is_cached "$name" "$version" && { log "$name $version: cached"; return 0; }
  t0=$SECONDS
  gobin="$(mktemp -d "$PETS_CACHE/gobin.XXXXXX")"
  log "$name $version: building (go install $pkg@$version)"
  GOBIN="$gobin" go_progress "$name" install -trimpath -ldflags "-s -w $extra" "$pkg@$version"
  mv "$gobin/$name" "$PETS_BIN/$name"
  rmdir "$gobin"
  mark_cached "$name" "$version"
  log "$name $version: built in $((SECONDS - t0)) s"
}

link_etcd() {
  # Debian's etcd 3.4 serves kube-apiserver 1.33 fine for a single-member test store.
  local etcd
  etcd="$(dpkg-query -L etcd-server | grep -m1 '/bin/etcd$' || true)"
  [[ -x "$etcd" ]] || die "etcd not found in the etcd-server package (dpkg-query -L etcd-server)"
  ln -sfn "$etcd" "$PETS_BIN/etcd"
  log "etcd: $("$etcd" --version | head -1)"
}

# oci_image NAME ARCHIVE KEY ROOTFS_FN [oci_archive.py args...]: (re)make ARCHIVE when KEY changes;
# ROOTFS_FN fills the directory given to it.
oci_image() {
  local name="$1" out="$2" key="$3" fill="$4" work
  shift 4
  key="$key $(sha256sum "$HERE/oci_archive.py" | cut -c1-12)"
  if [[ -f "$out" && "$(cat "$out.version" 2>/dev/null)" == "$key" ]]; then
    log "image $name: cached"; return 0
  fi
  work="$(mktemp -d "$PETS_CACHE/image.XXXXXX")"
  mkdir -p "$work/rootfs" "$(dirname "$out")"
  "$fill" "$work/rootfs"
  python3 "$HERE/oci_archive.py" --rootfs "$work/rootfs" --name "$name" --output "$out.tmp" "$@"
  mv "$out.tmp" "$out"
  echo "$key" >"$out.version"
  rm -rf "$work"
  log "image $name: $out"
}

# The sandbox ("pause") image: upstream's pause.c from the k8s module, linked statically.
fill_pause() {
  local src
  src="$(k8s_module_dir)/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "pause.c not found at $src"
  gcc -Os -Wall -Werror -static -DVERSION="$K8S_VERSION-pets" -o "$1/pause" "$src"
  strip "$1/pause"
}

build_pause() {
  oci_image "$PAUSE_IMAGE" "$PETS_CACHE/images/pause.tar" "$K8S_VERSION" fill_pause \
    --entrypoint /pause --user 65535:65535
}

fill_coredns() {
  install -D -m 0755 "$PETS_BIN/coredns" "$1/coredns"
  mkdir -p "$1/etc" "$1/tmp"
}

# CoreDNS runs as a pod (Deployment in kube-system) from this one-binary image.
build_coredns_image() {
  oci_image "$COREDNS_IMAGE" "$PETS_CACHE/images/coredns.tar" "$COREDNS_VERSION" fill_coredns \
    --entrypoint /coredns
}

fill_smoke() {
  log "debootstrap bookworm minbase + python3 into $1 (about a minute)"
  debootstrap --variant=minbase --include=python3,ca-certificates bookworm "$1" \
    ${PETS_DEBIAN_MIRROR:+"$PETS_DEBIAN_MIRROR"} | awk 'NR % 40 == 0 { print "  [debootstrap] " $0; fflush() }'
  [[ -x "$1/usr/bin/python3" ]] || die "debootstrap finished without $1/usr/bin/python3"
  rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*
}

# The smoke tests' image: Debian bookworm minbase with python3 (no registry to pull one from).
build_smoke_image() {
  apt_install debootstrap
  oci_image "$SMOKE_IMAGE" "$PETS_CACHE/images/smoke.tar" "bookworm-minbase-python3" fill_smoke \
    --entrypoint /usr/bin/python3 --user 65534:65534 --workdir /tmp
}

fill_local_path() {
  install -D -m 0755 "$PETS_BIN/local-path-provisioner" "$1/usr/bin/local-path-provisioner"
  mkdir -p "$1/etc/config" "$1/tmp"
}

# rancher's local-path-provisioner (the shared StorageClass of storage.sh): the static binary alone,
# at upstream's path, so upstream's `command: [local-path-provisioner, ...]` would also work.
build_local_path() {
  go_install local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION" \
    "-X main.VERSION=$LOCAL_PATH_VERSION"
  oci_image "localhost/pets-training/local-path-provisioner:$LOCAL_PATH_VERSION" \
    "$PETS_CACHE/images/local-path-provisioner.tar" "$LOCAL_PATH_VERSION" fill_local_path \
    --entrypoint /usr/bin/local-path-provisioner
}

# shellcheck source=addons-build.sh
source "$HERE/addons-build.sh"
# shellcheck source=netpol-build.sh
source "$HERE/netpol-build.sh"

build_control_plane() {
  apt_install "${CONTROL_PLANE_PACKAGES[@]}"
  link_etcd
  build_k8s kube-apiserver
  build_k8s kube-controller-manager
  go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
  # kubectl at the server's version, so the scripts and tests need no kubectl of the host's.
  build_k8s kubectl
}

build_node() {
  apt_install "${NODE_PACKAGES[@]}"
  build_k8s kube-scheduler
  build_k8s kubelet
  build_k8s kube-proxy
  go_install coredns github.com/coredns/coredns "$COREDNS_VERSION"
  build_pets_cri
  build_pause
  build_coredns_image
}

go_binaries_all_cached() {
  local name
  for name in kube-apiserver kube-controller-manager kubectl kube-scheduler kubelet kube-proxy; do
    is_cached "$name" "$K8S_VERSION" || return 1
  done
  is_cached helm "$HELM_VERSION" && is_cached coredns "$COREDNS_VERSION"
}

main() {
  local targets=("$@") t t0=$SECONDS
  [[ ${#targets[@]} -gt 0 ]] || targets=(all)
  # One build at a time per cache: a second build.sh waits, then finds everything cached.
  exec 9>"$PETS_CACHE/.build.lock"
  if ! flock -n 9; then
    log "another build.sh is running on $PETS_CACHE; waiting for it"
    flock 9
  fi
  for t in "${targets[@]}"; do
    case "$t" in
      all) build_control_plane; build_node ;;
      control-plane) build_control_plane ;;
      node) build_node ;;
      kind) go_install kind sigs.k8s.io/kind "$KIND_VERSION" ;;
      smoke-image) build_smoke_image ;;
      kubeflow) build_kubeflow ;;
      kueue) build_kueue ;;
      local-path) build_local_path ;;
      s3) build_s3 ;;
      mlflow) build_mlflow ;;
      prometheus) build_prometheus ;;
      netpol) build_netpol ;;
      print-bin) echo "$PETS_BIN" ;;
      *) die "unknown build target '$t' (expected all, control-plane, node, kind, smoke-image, kubeflow, kueue, local-path, s3, mlflow, prometheus, netpol or print-bin)" ;;
    esac
  done
  if [[ $GOCACHE == "$OWN_GOCACHE" && -d $GOCACHE ]] && go_binaries_all_cached; then
    local mb
    mb=$(du -sm "$GOCACHE" | cut -f1)
    ((mb < 2)) || log "removing the Go build cache ($mb MB)"
    rm -rf "$GOCACHE"
  fi
  log "build ${targets[*]}: done in $((SECONDS - t0)) s; binaries in $PETS_BIN"
}

main "$@"
