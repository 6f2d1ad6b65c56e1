#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR disable=SC2317 # functions called through pack, ex, traps
# kind on this project: can kind run here, and a kind node image built offline.
#
#   kind.sh preflight    decide in seconds whether kind can run here: docker is there and answers,
#                        and a privileged container starts (kind's node containers are privileged).
#                        Exit 0 if so; else print the runtime's own error and what to use instead.
#   kind.sh node-image   build localhost/pets-training/kind-node:<k8s version> offline, following
#                        kind v0.30.0's node-image recipe (images/base + pkg/build/nodeimage), and
#                        cache it as $PETS_CACHE/images/kind-node-<k8s version>.tar (docker save);
#                        skipped when its inputs are unchanged (a stamp, like build.sh's).
#   kind.sh check [--kubeadm-init|--two-nodes]
#                        start the node image WITHOUT --privileged (what this sandbox allows) and
#                        check what can be checked: systemd boots, containerd runs, every image
#                        `kubeadm config images list` names is in containerd, kubelet/kubeadm run;
#                        with --kubeadm-init also kubeadm init, the CNI and the storage manifests
#                        and a pod (PVC, DNS, Service); --two-nodes: that plus a worker joining
#                        and a pod on one node reaching a pod on the other.
#   kind.sh image        print the node image's name if it is built (docker has it, or its cached
#                        archive is loaded now); exit 1 without output if not. For cluster.sh:
#                        PETS_KIND_IMAGE="${PETS_KIND_IMAGE:-$(kind.sh image 2>/dev/null || true)}"
#
# Environment: PETS_CACHE, PETS_KIND_NODE_IMAGE (the name to build, default below),
# PETS_KIND_CHECK_KEEP=1 (check leaves its container for a look inside),
# PETS_DEBIAN_MIRROR (debootstrap's mirror), KIND_VERSION (the kind module whose recipe is read).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"
LOG_TAG=kind

KIND_VERSION="${KIND_VERSION:-v0.30.0}"
K8S_VERSION="$(k8s_version)"
NODE_IMAGE="${PETS_KIND_NODE_IMAGE:-localhost/pets-training/kind-node:$K8S_VERSION}"
NODE_DIR="$PETS_CACHE/kind-node"           # our binaries, module copy, Go build cache, work dirs
NODE_BIN="$NODE_DIR/bin"
ARCHIVE="$PETS_CACHE/images/kind-node-$K8S_VERSION.tar"
FILES="$HERE/kind-node"                   # our own parts of the node image
# The etcd kubeadm v1.33 runs (constants.DefaultEtcdVersion 3.5.24-0), built from kind-node/etcd.
ETCD_VERSION="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' "$FILES/etcd/go.mod")"
NODE_RECIPE=2 # bump when cmd_node_image changes what goes into the image: the cached one is rebuilt
LPP_VERSION=v0.0.30                       # rancher local-path-provisioner (kind's default storage)
TOOLS_IMAGE="localhost/pets-training/kind-tools:bookworm"   # busybox: CNI agent + storage helper
LPP_IMAGE="localhost/pets-training/local-path-provisioner:$LPP_VERSION"
CHECK_NAME=pets-kind-check
# The node's Debian packages: kind's images/base/Dockerfile list (less nfs-common and open-iscsi,
# network block/file storage kind's tests use) plus what kind builds from source there and
# Debian packages: containerd, runc, CNI plugins; busybox-static for the busybox image.
NODE_PACKAGES=(systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod
  libseccomp2 pigz fuse-overlayfs bash ca-certificates curl jq procps
  containerd runc containernetworking-plugins busybox-static)
# What the image never needs at run time (like kind's clean-install).
TRIM='var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old usr/share/doc/* usr/share/man/*
  usr/share/info/* usr/share/locale/* usr/share/lintian var/log/* tmp/* var/tmp/*'

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0

kind_module_dir() {
  local dir
  dir="$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION"
  if [[ ! -d $dir ]]; then
    log "go mod download sigs.k8s.io/kind@$KIND_VERSION (its node-image recipe)"
    dir="$(cd "${TMPDIR:-/tmp}" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  fi
  [[ -f $dir/images/base/files/usr/local/bin/entrypoint ]] || die "no kind node-image recipe under $dir/images/base"
  echo "$dir"
}

# ------------------------------------------------------------------------------------ preflight
# A local image to try a privileged container with: the node image, the project's offline base,
# else a one-binary image made on the spot from this machine's `true` (nothing is pulled).
preflight_image() {
  local img
  for img in "$NODE_IMAGE" pets-training/base:bookworm; do
    docker image inspect "$img" >/dev/null 2>&1 && { echo "$img"; return; }
  done
  img=localhost/pets-training/kind-preflight:true
  if ! docker image inspect "$img" >/dev/null 2>&1; then
    local d f
    d="$(mktemp -d)"
    mkdir -p "$d/bin"
    cp "$(type -P true)" "$d/bin/true"
    for f in $(ldd "$(type -P true)" | grep -o '/[^ ]*'); do
      mkdir -p "$d$(dirname "$f")"; cp -L "$f" "$d$f"
    done
    tar -C "$d" -c . | docker import - "$img" >/dev/null
    rm -rf "$d"
  fi
  echo "$img"
}

cmd_preflight() {
  local instead="use the multi-node local cluster instead: make cluster-up NODES=3" out img cap
  if ! command -v docker >/dev/null 2>&1; then
    log "kind cannot run here: no docker command (kind's nodes are Docker containers)"
    log "$instead"; exit 2
  fi
  if ! out="$(timeout 20 docker info 2>&1 >/dev/null)"; then
    log "kind cannot run here: the Docker engine does not answer: ${out:-docker info timed out}"
    log "start it (systemctl start docker, or tests'/image/build.sh engine as root on Debian), or $instead"
    exit 3
  fi
  img="$(preflight_image)"
  if ! out="$(timeout 60 docker run --rm --privileged --name "pets-kind-preflight-$$" --entrypoint true "$img" 2>&1)"; then
    docker rm -f "pets-kind-preflight-$$" >/dev/null 2>&1 || true
    log "kind cannot run here: kind's node containers are privileged, and a privileged container does not start:"
    log "  \$ docker run --rm --privileged --entrypoint true $img"
    printf '%s\n' "$out" | sed '/^\s*$/d; s/^/  /' >&2
    # The usual cause in sandboxes: capabilities missing from the bounding set (runc applies them all).
    cap="$(awk '/^CapBnd/ { print $2 }' /proc/self/status)"
    if (( (16#$cap >> 24 & 1) == 0 )); then
      log "  cause: this environment's capability bounding set ($cap) lacks CAP_SYS_RESOURCE, which --privileged grants"
    fi
    log "$instead"
    exit 4
  fi
  log "ok: Docker $(docker version --format '{{.Server.Version}}' 2>/dev/null) answers and privileged containers start: kind can run here"
}

# ------------------------------------------------------------------------------------ binaries
is_cached() { [[ -x "$2/$1" && "$(cat "$2/.$1.version" 2>/dev/null)" == "$3" ]]; }

go_progress() {
  local name="$1" sub="$2"; shift 2
  nice -n 19 go "$sub" -v "$@" 2>&1 | awk -v n="$name" '
    /^(go: |#|.*\.go:[0-9]+)/ { print; next }
    { c++; if (c % 100 == 0) printf "  [%s] %d packages compiled\n", n, c; fflush() }' >&2
  return "${PIPESTATUS[0]}"
}

# The k8s wrapper module (tests/cluster/k8s), copied so kubeadm's extra go.sum entries and our
# crictl land in the copy, never in the project's module: one place still pins every version.
k8s_module_copy() {
  local dir="$NODE_DIR/k8s-mod"
  if ! cmp -s "$HERE/k8s/go.mod" "$dir/go.mod.orig" || ! cmp -s "$FILES/crictl/main.go" "$dir/cmd/crictl/main.go"; then
    rm -rf "$dir"; mkdir -p "$dir/cmd/crictl"
    cp "$HERE/k8s/go.mod" "$HERE/k8s/go.sum" "$dir/"
    cp "$HERE/k8s/go.mod" "$dir/go.mod.orig"
    cp "$FILES/crictl/main.go" "$dir/cmd/crictl/"
  fi
  echo "$dir"
}

k8s_ldflags() {
  local major minor ldflags="-s -w" pkg
  major="${K8S_VERSION#v}"; major="${major%%.*}"
  minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ldflags"
}

# node_bin NAME: the path of a Kubernetes binary at $K8S_VERSION: build.sh's copy in $PETS_BIN
# (same module, same flags) when there is one, else ours, built into $NODE_BIN.
node_bin() {
  local name="$1" pkg="k8s.io/kubernetes/cmd/$1" mod t0
  [[ $name == crictl ]] && pkg=./cmd/crictl
  if [[ $name != kubeadm && $name != crictl ]] && is_cached "$name" "$PETS_BIN" "$K8S_VERSION"; then
    echo "$PETS_BIN/$name"; return
  fi
  local key="$K8S_VERSION"
  [[ $name == crictl ]] && key+=" $(sha256sum "$FILES/crictl/main.go" | cut -c1-12)"
  if ! is_cached "$name" "$NODE_BIN" "$key"; then
    t0=$SECONDS
    mod="$(k8s_module_copy)"
    mkdir -p "$NODE_BIN"
    log "$name $K8S_VERSION: building (nice -n 19; a cold build takes minutes)"
    (cd "$mod" && GOFLAGS="$GOFLAGS -mod=mod" go_progress "$name" build -trimpath -ldflags "$(k8s_ldflags)" \
      -o "$NODE_BIN/.$name.tmp" "$pkg") || die "building $name failed"
    mv "$NODE_BIN/.$name.tmp" "$NODE_BIN/$name"
    echo "$key" >"$NODE_BIN/.$name.version"
    log "$name: built in $((SECONDS - t0)) s"
  fi
  echo "$NODE_BIN/$name"
}

build_etcd() {
  local key t0
  key="$ETCD_VERSION $(cat "$FILES/etcd/go.mod" "$FILES/etcd/go.sum" "$FILES/etcd/main.go" | sha256sum | cut -c1-12)"
  if ! is_cached etcd "$NODE_BIN" "$key"; then
    t0=$SECONDS
    mkdir -p "$NODE_BIN"
    log "etcd $ETCD_VERSION: building (kind-node/etcd wrapper module)"
    (cd "$FILES/etcd" && go_progress etcd build -trimpath -ldflags "-s -w" -o "$NODE_BIN/.etcd.tmp" .) ||
      die "building etcd failed"
    mv "$NODE_BIN/.etcd.tmp" "$NODE_BIN/etcd"
    echo "$key" >"$NODE_BIN/.etcd.version"
    log "etcd: built in $((SECONDS - t0)) s"
  fi
  echo "$NODE_BIN/etcd"
}

build_lpp() {
  local t0 gobin
  if ! is_cached local-path-provisioner "$NODE_BIN" "$LPP_VERSION"; then
    t0=$SECONDS
    gobin="$(mktemp -d "$NODE_DIR/gobin.XXXXXX")"
    log "local-path-provisioner $LPP_VERSION: building (go install)"
    GOBIN="$gobin" go_progress local-path-provisioner install -trimpath -ldflags "-s -w" \
      "github.com/rancher/local-path-provisioner@$LPP_VERSION" || die "building local-path-provisioner failed"
    mv "$gobin/local-path-provisioner" "$NODE_BIN/local-path-provisioner"
    rmdir "$gobin"
    echo "$LPP_VERSION" >"$NODE_BIN/.local-path-provisioner.version"
    log "local-path-provisioner: built in $((SECONDS - t0)) s"
  fi
  echo "$NODE_BIN/local-path-provisioner"
}

# ------------------------------------------------------------------------------------ node image
# Every input of the image, hashed: when it is unchanged, the cached archive is the image.
input_key() {
  local kind_dir="$1"
  {
    echo "$K8S_VERSION $KIND_VERSION $ETCD_VERSION $LPP_VERSION $COREDNS_VERSION ${NODE_PACKAGES[*]} ${PETS_DEBIAN_MIRROR:-}"
    echo "recipe $NODE_RECIPE"
    cat "$HERE/oci_archive.py" "$HERE/k8s/go.mod"
    find "$FILES" -type f ! -name '*.orig' | sort | xargs cat
    (cd "$kind_dir/images/base/files" && find . -type f | sort | xargs cat)
    cat "$PETS_CACHE/images/pause.tar.version" "$PETS_BIN/.coredns.version" 2>/dev/null || true
    local b; for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl; do
      cat "$PETS_BIN/.$b.version" 2>/dev/null || true
    done
  } | sha256sum | cut -c1-16
}

image_key() { docker image inspect "$NODE_IMAGE" --format '{{index .Config.Labels "pets.kind-node.key"}}' 2>/dev/null || true; }

# kind's images/base Dockerfile, steps "COPY files" and the first RUNs, on a debootstrapped rootfs.
install_kind_base_files() {
  local r="$1" f="$2/images/base/files"
  install -d -m 0755 "$r/usr/local/bin" "$r/kind/bin" "$r/LICENSES" "$r/etc/containerd" "$r/etc/default" \
    "$r/etc/sysctl.d" "$r/etc/systemd/system/kubelet.service.d"
  install -m 0755 "$f"/usr/local/bin/* "$r/usr/local/bin/"
  install -m 0644 "$f"/kind/README.txt "$r/kind/"
  install -m 0755 "$f"/kind/bin/* "$r/kind/bin/"
  install -m 0644 "$f"/LICENSES/* "$r/LICENSES/"
  install -m 0644 "$f"/etc/crictl.yaml "$r/etc/"
  install -m 0644 "$f"/etc/containerd/* "$r/etc/containerd/"
  install -m 0644 "$f"/etc/default/* "$r/etc/default/"
  install -m 0644 "$f"/etc/sysctl.d/* "$r/etc/sysctl.d/"
  install -m 0644 "$f"/etc/systemd/system/*.service "$f"/etc/systemd/system/*.slice "$r/etc/systemd/system/"
  install -m 0644 "$f"/etc/systemd/system/kubelet.service.d/* "$r/etc/systemd/system/kubelet.service.d/"
  (
    cd "$r"
    find lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
    rm -f lib/systemd/system/multi-user.target.wants/* etc/systemd/system/*.wants/* \
      lib/systemd/system/local-fs.target.wants/* lib/systemd/system/sockets.target.wants/*udev* \
      lib/systemd/system/sockets.target.wants/*initctl* lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >>etc/systemd/journald.conf
    ln -sfn /lib/systemd/systemd sbin/init
  )
  # Debian's containerd, ctr, shim and runc stand where kind's own builds go (its units name them).
  local b
  for b in containerd ctr containerd-shim-runc-v2; do ln -sfn "/usr/bin/$b" "$r/usr/local/bin/$b"; done
  ln -sfn /usr/sbin/runc "$r/usr/local/sbin/runc"
  # kind's CNI plugins (host-local, loopback, ptp, portmap) from Debian's package, where containerd looks.
  mkdir -p "$r/opt/cni"; ln -sfn /usr/lib/cni "$r/opt/cni/bin"
  chroot "$r" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  chroot "$r" systemctl mask systemd-binfmt.service >/dev/null 2>&1
  mkdir -p "$r/etc/kubernetes/manifests"
  # cri-base.json: `ctr oci spec` with kind's createContainer hook, rlimits dropped (its Dockerfile).
  chroot "$r" sh -c 'ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" | jq "del(.process.rlimits)"' \
    >"$r/etc/containerd/cri-base.json"
  jq -e '.hooks.createContainer[0].path == "/kind/bin/mount-product-files.sh"' "$r/etc/containerd/cri-base.json" >/dev/null ||
    die "cri-base.json was not written right: $r/etc/containerd/cri-base.json"
  rm -f "$r/etc/machine-id" "$r/var/lib/dbus/machine-id"
}

# fill_* ROOTFS: the image root filesystems (oci_archive.py packs each as one layer).
fill_one_bin() { install -D -m 0755 "$2" "$1/usr/local/bin/$(basename "$3")"; mkdir -p "$1/tmp" "$1/etc"; }

fill_tools() { # busybox alone: /bin/sh and its applets
  local r="$1" a
  install -D -m 0755 "$NODE_ROOTFS/bin/busybox" "$r/bin/busybox"
  for a in $("$r/bin/busybox" --list); do [[ $a == busybox ]] || ln -s busybox "$r/bin/$a"; done
  mkdir -p "$r/tmp" "$r/etc" "$r/usr/bin" "$r/sbin" "$r/usr/sbin"
}

# kube-proxy: the binary, iptables (legacy + nft backends), nft and conntrack with the libraries they
# load, taken from the node's own rootfs, busybox for the wrapper, and the wrapper as iptables*.
fill_kube_proxy() {
  local r="$1" f lib
  fill_tools "$r"
  install -D -m 0755 "$KUBE_PROXY_BIN" "$r/usr/local/bin/kube-proxy"
  mkdir -p "$r/usr/sbin" "$r/usr/lib/x86_64-linux-gnu" "$r/lib64"
  for f in usr/sbin/xtables-legacy-multi usr/sbin/xtables-nft-multi usr/sbin/conntrack usr/sbin/nft; do
    install -m 0755 "$NODE_ROOTFS/$f" "$r/$f"
  done
  cp -a "$NODE_ROOTFS/usr/lib/x86_64-linux-gnu/xtables" "$r/usr/lib/x86_64-linux-gnu/"
  for lib in $(chroot "$NODE_ROOTFS" ldd /usr/sbin/xtables-legacy-multi /usr/sbin/xtables-nft-multi \
    /usr/sbin/conntrack /usr/sbin/nft /usr/lib/x86_64-linux-gnu/xtables/*.so |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' | sort -u); do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$NODE_ROOTFS$lib" "$r$lib"
  done
  for f in iptables ip6tables; do
    ln -sfn xtables-legacy-multi "$r/usr/sbin/$f-legacy"
    ln -sfn xtables-legacy-multi "$r/usr/sbin/$f-legacy-save"
    ln -sfn xtables-legacy-multi "$r/usr/sbin/$f-legacy-restore"
    ln -sfn xtables-nft-multi "$r/usr/sbin/$f-nft"
    ln -sfn xtables-nft-multi "$r/usr/sbin/$f-nft-save"
    ln -sfn xtables-nft-multi "$r/usr/sbin/$f-nft-restore"
  done
  install -m 0755 "$FILES/iptables-wrapper" "$r/usr/sbin/iptables-wrapper"
  for f in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sfn iptables-wrapper "$r/usr/sbin/$f"
  done
  mkdir -p "$r/run" "$r/var/lib/kube-proxy"
  local tool
  for tool in iptables-nft iptables-legacy conntrack nft; do
    chroot "$r" "/usr/sbin/$tool" --version >/dev/null ||
      die "the kube-proxy image's $tool does not run (a library missing?)"
  done
}

# pack NAME ARCHIVE FILL [FILL ARGS...] -- [oci_archive.py args]
pack() {
  local name="$1" out="$2" fill="$3" work args=()
  shift 3
  while [[ $# -gt 0 && $1 != -- ]]; do args+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  work="$(mktemp -d "$NODE_WORK/img.XXXXXX")"
  "$fill" "$work" "${args[@]}"
  python3 "$HERE/oci_archive.py" --rootfs "$work" --name "$name" --output "$out" "$@" >&2
  rm -rf "$work"
}

# The images kubeadm asks for (and the CNI's and storage's), made from binaries: nothing is pulled.
make_images() {
  local dir="$1" kubeadm_images=() img name tag
  mapfile -t kubeadm_images < <("$KUBEADM_BIN" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)
  [[ ${#kubeadm_images[@]} -ge 7 ]] || die "kubeadm config images list printed: ${kubeadm_images[*]}"
  for img in "${kubeadm_images[@]}"; do
    name="${img%:*}"; name="${name##*/}"; tag="${img##*:}"
    case "$name" in
      kube-apiserver | kube-controller-manager | kube-scheduler)
        pack "$img" "$dir/$name.tar" fill_one_bin "${BIN[$name]}" "$name" -- --entrypoint "/usr/local/bin/$name" ;;
      kube-proxy)
        KUBE_PROXY_BIN="${BIN[kube-proxy]}"
        pack "$img" "$dir/$name.tar" fill_kube_proxy -- --entrypoint /usr/local/bin/kube-proxy ;;
      etcd)
        [[ $tag == "$ETCD_VERSION"-* || $tag == "${ETCD_VERSION#v}"-* ]] ||
          log "warning: kubeadm asks for etcd $tag; the image holds etcd $ETCD_VERSION (kind-node/etcd/go.mod)"
        pack "$img" "$dir/etcd.tar" fill_one_bin "${BIN[etcd]}" etcd -- --entrypoint /usr/local/bin/etcd ;;
      coredns)
        # The project's CoreDNS ($COREDNS_VERSION, build.sh) under the name kubeadm asks for ($tag).
        pack "$img" "$dir/coredns.tar" fill_coredns_root -- --entrypoint /coredns ;;
      pause)
        # build.sh's pause (upstream pause.c), re-tagged after the import.
        PAUSE_NAME="$img" ;;
      *) die "kubeadm asks for an image this recipe does not know how to make: $img" ;;
    esac
  done
  printf '%s\n' "${kubeadm_images[@]}" >"$dir/kubeadm-images.txt"
  pack "$TOOLS_IMAGE" "$dir/tools.tar" fill_tools -- --entrypoint /bin/sh
  pack "$LPP_IMAGE" "$dir/lpp.tar" fill_one_bin "${BIN[local-path-provisioner]}" local-path-provisioner -- \
    --entrypoint /usr/local/bin/local-path-provisioner
}

fill_coredns_root() { install -D -m 0755 "$PETS_BIN/coredns" "$1/coredns"; mkdir -p "$1/etc" "$1/tmp"; }

# kind's build imports the images with the node's containerd; so do we: the rootfs's own
# containerd binary, its root in the rootfs, state and socket in the work dir, CRI off (it would
# act on this host), images imported unpacked-later and pinned, exactly kind's ctr flags.
import_images() {
  local r="$1" dir="$2" sock="$NODE_WORK/c.sock" pid f i
  cat >"$NODE_WORK/containerd.toml" <<EOF
version = 2
root = "$r/var/lib/containerd"
state = "$NODE_WORK/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[metrics]
  address = ""
EOF
  "$r/usr/bin/containerd" --config "$NODE_WORK/containerd.toml" >"$NODE_WORK/containerd.log" 2>&1 &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    [[ -S $sock ]] && "$r/usr/bin/ctr" --address "$sock" version >/dev/null 2>&1 && break
    sleep 0.2
  done
  local ctr=("$r/usr/bin/ctr" --address "$sock" --namespace=k8s.io)
  for f in "$dir"/*.tar "$PETS_CACHE/images/pause.tar"; do
    "${ctr[@]}" images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack "$f" >&2 ||
      { kill "$pid"; die "ctr images import $f failed; containerd log: $NODE_WORK/containerd.log"; }
  done
  "${ctr[@]}" images tag --force "$PAUSE_IMAGE" "$PAUSE_NAME" >/dev/null
  "${ctr[@]}" images rm "$PAUSE_IMAGE" >/dev/null
  for f in $("${ctr[@]}" images ls -q); do "${ctr[@]}" images label "$f" io.cri-containerd.pinned=pinned >/dev/null; done
  "${ctr[@]}" images ls >&2
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$NODE_WORK/containerd-state"
}

cmd_node_image() {
  [[ $EUID -eq 0 ]] || die "building the node image needs root (debootstrap, chroot)"
  local t0=$SECONDS kind_dir key
  "$ROOT/image/build.sh" engine
  kind_dir="$(kind_module_dir)"
  exec 8>"$PETS_CACHE/.kind-node.lock"
  flock -n 8 || { log "another kind.sh node-image is running; waiting for it"; flock 8; }
  # The project's binaries and images (pause, CoreDNS, kube-*): build.sh builds what is missing.
  "$HERE/build.sh" control-plane node
  command -v debootstrap >/dev/null || { apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; }
  command -v jq >/dev/null || { apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q jq >/dev/null; }
  key="$(input_key "$kind_dir")"
  if [[ "$(image_key)" == "$key" ]]; then
    log "$NODE_IMAGE is up to date (inputs $key)"; return 0
  fi
  if [[ -f $ARCHIVE && "$(cat "$ARCHIVE.version" 2>/dev/null)" == "$key" ]]; then
    log "loading the cached $ARCHIVE"
    docker load -i "$ARCHIVE" >/dev/null
    log "$NODE_IMAGE is up to date (inputs $key)"; return 0
  fi
  local free_gb
  free_gb=$(df -P -BG "$PETS_CACHE" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
  ((free_gb >= 5)) || die "only $free_gb GB free under $PETS_CACHE; the node image build needs about 5 GB"

  mkdir -p "$NODE_DIR" "$PETS_CACHE/images"
  export GOCACHE="${GOCACHE:-$NODE_DIR/go-build}"
  NODE_WORK="$(mktemp -d "$NODE_DIR/work.XXXXXX")"
  # shellcheck disable=SC2064
  trap "[[ -z \${DPID:-} ]] || kill \$DPID 2>/dev/null; rm -rf '$NODE_WORK'" EXIT
  # debootstrap (network and disk) runs beside the Go builds (CPU).
  NODE_ROOTFS="$NODE_WORK/rootfs"
  local t1=$SECONDS pkgs dpid
  pkgs="$(IFS=,; echo "${NODE_PACKAGES[*]}")"
  log "debootstrap bookworm (minbase + ${NODE_PACKAGES[*]}) in the background"
  debootstrap --variant=minbase --include="$pkgs" bookworm "$NODE_ROOTFS" ${PETS_DEBIAN_MIRROR:+"$PETS_DEBIAN_MIRROR"} \
    >"$NODE_WORK/debootstrap.log" 2>&1 &
  dpid=$!; DPID=$dpid
  declare -gA BIN=()
  local b
  for b in kubeadm kubelet kubectl crictl kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    BIN[$b]="$(node_bin "$b")"
  done
  BIN[etcd]="$(build_etcd)"
  BIN[local-path-provisioner]="$(build_lpp)"
  KUBEADM_BIN="${BIN[kubeadm]}"
  local kubelet="${BIN[kubelet]}" kubectl="${BIN[kubectl]}" crictl="${BIN[crictl]}"

  if ! wait "$dpid"; then tail -20 "$NODE_WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; fi
  DPID=
  log "debootstrap: done $((SECONDS - t1)) s after it started; $(du -sh "$NODE_ROOTFS" | cut -f1)"
  install_kind_base_files "$NODE_ROOTFS" "$kind_dir"
  # pkg/build/nodeimage: the Kubernetes binaries in /usr/bin, /kind/version, the manifests, images.
  install -m 0755 "$kubelet" "$KUBEADM_BIN" "$kubectl" "$NODE_ROOTFS/usr/bin/"
  install -m 0755 "$crictl" "$NODE_ROOTFS/usr/local/bin/crictl"
  printf '%s' "$K8S_VERSION" >"$NODE_ROOTFS/kind/version"
  install -D -m 0644 "$FILES/manifests/default-cni.yaml" "$NODE_ROOTFS/kind/manifests/default-cni.yaml"
  install -D -m 0644 "$FILES/manifests/default-storage.yaml" "$NODE_ROOTFS/kind/manifests/default-storage.yaml"
  mkdir -p "$NODE_WORK/images"
  make_images "$NODE_WORK/images"
  import_images "$NODE_ROOTFS" "$NODE_WORK/images"
  rm -rf "$NODE_WORK/images"
  # shellcheck disable=SC2086 # the globs expand inside the rootfs
  (cd "$NODE_ROOTFS" && rm -rf $TRIM)
  log "rootfs: $(du -sh "$NODE_ROOTFS" | cut -f1); importing it as $NODE_IMAGE"
  local previous
  previous="$(docker image inspect "$NODE_IMAGE" --format '{{.Id}}' 2>/dev/null || true)"
  # kind's final stage: one squashed layer, container=docker, STOPSIGNAL, its ENTRYPOINT.
  # (docker import takes no STOPSIGNAL, so the metadata comes from a FROM-only Dockerfile.)
  tar --numeric-owner -C "$NODE_ROOTFS" -c . | docker import - "$NODE_IMAGE-rootfs" >/dev/null
  rm -rf "$NODE_ROOTFS"
  printf '%s\n' "FROM $NODE_IMAGE-rootfs" 'ENV container=docker' 'STOPSIGNAL SIGRTMIN+3' \
    'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    "LABEL pets.kind-node.key=$key pets.kind-node.kubernetes=$K8S_VERSION pets.kind-node.kind-recipe=$KIND_VERSION" |
    DOCKER_BUILDKIT=0 docker build -q -t "$NODE_IMAGE" - >"$NODE_WORK/docker-build.log" 2>&1 ||
    die "docker build of $NODE_IMAGE failed: $(cat "$NODE_WORK/docker-build.log")"
  docker image rm "$NODE_IMAGE-rootfs" >/dev/null
  docker save -o "$ARCHIVE.tmp" "$NODE_IMAGE"
  chmod 0644 "$ARCHIVE.tmp"; mv "$ARCHIVE.tmp" "$ARCHIVE"
  echo "$key" >"$ARCHIVE.version"
  if [[ -n $previous && $previous != "$(docker image inspect "$NODE_IMAGE" --format '{{.Id}}')" ]]; then
    if docker image rm "$previous" >/dev/null 2>&1; then log "removed the superseded image ${previous:7:12}"; fi
  fi
  if [[ $GOCACHE == "$NODE_DIR/go-build" ]]; then rm -rf "$GOCACHE"; fi
  log "built $NODE_IMAGE in $((SECONDS - t0)) s: $(docker image inspect "$NODE_IMAGE" --format '{{.Size}}' | numfmt --to=iec), archive $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
}

cmd_image() {
  if ! docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
    [[ -f $ARCHIVE ]] || return 1
    docker load -i "$ARCHIVE" >/dev/null || return 1
  fi
  echo "$NODE_IMAGE"
}

# ------------------------------------------------------------------------------------ check
# The node image in a container without --privileged: all capabilities but CAP_SYS_RESOURCE
# (this sandbox's bounding set lacks it), seccomp and AppArmor off, a private cgroup namespace,
# and the mounts kind gives its nodes (tmpfs /run and /tmp, /lib/modules, a volume for /var).
# What --privileged would also give, done by hand:
# - docker mounts /sys and the cgroup v1 hierarchies read-only in an unprivileged container; a
#   shell before kind's entrypoint remounts them read-write (bind remounts: the container's own
#   namespaced view, never the host's tree; bind-mounting the host's /sys/fs/cgroup instead lets
#   one node's systemd remove another container's cgroups);
# - containerd.service asks systemd for OOMScoreAdjust=-999, which needs CAP_SYS_RESOURCE: a
#   drop-in mounted for the check sets 0 (kind's privileged nodes keep -999);
# - every device allowed in the node's devices cgroup (--device-cgroup-rule 'a *:* rwm'):
#   privileged pods (kube-proxy) ask runc for "a *:* rwm", which a child cgroup may not exceed;
# - for kubeadm init: /dev/kmsg (kubelet's OOM watcher) and a writable /proc/sys
#   (--security-opt systempaths=unconfined), and containerd's restrict_oom_score_adj = true
#   (runc cannot lower a container's oom_score_adj either; kind's entrypoint sets the same for
#   rootless nodes).
CHECK_DIR=""
check_node_start() { # NAME [docker run args...]
  local name="$1"; shift
  docker rm -f -v "$name" >/dev/null 2>&1 || true
  docker run -d --name "$name" --hostname "$name" \
    --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    --cgroupns private --tmpfs /run --tmpfs /tmp -v /lib/modules:/lib/modules:ro -v /var \
    --device /dev/kmsg --security-opt systempaths=unconfined --device-cgroup-rule 'a *:* rwm' \
    -v "$CHECK_DIR/10-no-oom-score.conf:/etc/systemd/system/containerd.service.d/10-no-oom-score.conf:ro" \
    "$@" --entrypoint /bin/sh "$NODE_IMAGE" -c \
    'mount -o remount,bind,rw /sys && for m in /sys/fs/cgroup /sys/fs/cgroup/*; do
       if mountpoint -q "$m"; then mount -o remount,bind,rw "$m" || exit 1; fi
     done && exec /usr/local/bin/entrypoint /sbin/init' >/dev/null
  local i state
  for ((i = 0; i < 90; i++)); do
    state="$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)"
    [[ $state == running || $state == degraded ]] && break
    sleep 1
  done
  log "$name: systemd $state after ${i}s"
  if [[ $state != running && $state != degraded ]]; then docker logs "$name" 2>&1 | tail -30 >&2; return 1; fi
  [[ $state == running ]] || docker exec "$name" systemctl --failed --no-legend >&2 || true
}

check_cleanup() {
  local n
  if [[ -n ${PETS_KIND_CHECK_KEEP:-} ]]; then
    log "kept ${CHECK_NODES[*]} (PETS_KIND_CHECK_KEEP): docker rm -f -v ${CHECK_NODES[*]} when done"
    return
  fi
  for n in "${CHECK_NODES[@]}"; do docker rm -f -v "$n" >/dev/null 2>&1 || true; done
  rm -rf "$CHECK_DIR"
}

cmd_check() {
  local mode="${1:-}" fail=0 want have img
  case "$mode" in "" | --kubeadm-init | --two-nodes) ;; *) die "usage: $0 check [--kubeadm-init|--two-nodes]" ;; esac
  docker image inspect "$NODE_IMAGE" >/dev/null 2>&1 || die "$NODE_IMAGE is not built: run $0 node-image"
  CHECK_DIR="$(mktemp -d)"
  printf '[Service]\nOOMScoreAdjust=0\n' >"$CHECK_DIR/10-no-oom-score.conf"
  CHECK_NODES=("$CHECK_NAME")
  [[ $mode != --two-nodes ]] || CHECK_NODES+=("$CHECK_NAME-worker")
  CHECK_LOG="$PETS_CACHE/kind-node/check-kubeadm-init.log"
  trap check_cleanup EXIT
  log "starting $CHECK_NAME from $NODE_IMAGE (no --privileged)"
  check_node_start "$CHECK_NAME" || die "the node container did not boot"
  ex() { docker exec "$CHECK_NAME" "$@"; }
  wait_for "containerd active" 30 ex systemctl is-active containerd || fail=1
  log "containerd: $(ex systemctl is-active containerd 2>&1) ($(ex containerd --version 2>&1 | awk '{print $3}'))"
  want="$(ex kubeadm config images list --kubernetes-version "$(ex cat /kind/version)" 2>/dev/null)"
  have="$(ex ctr -n k8s.io images ls -q 2>/dev/null)"
  for img in $want "$TOOLS_IMAGE" "$LPP_IMAGE"; do
    if grep -qxF "$img" <<<"$have"; then log "  image ok: $img"; else log "  image MISSING: $img"; fail=1; fi
  done
  log "crictl inspecti (what kind load runs): $(ex crictl inspecti registry.k8s.io/pause:3.10 2>&1 | jq -c '.status | {id, repoTags}' 2>&1)"
  log "kubelet --version: $(ex kubelet --version 2>&1)"
  log "kubeadm version: $(ex kubeadm version -o short 2>&1)"
  log "kubectl version --client: $(ex kubectl version --client 2>&1 | head -1)"
  log "/kind/version: $(ex cat /kind/version); manifests: $(ex ls /kind/manifests | tr '\n' ' ')"
  log "kubelet.service: $(ex systemctl is-enabled kubelet 2>&1) (waits for kubeadm's /var/lib/kubelet/config.yaml)"
  ((fail == 0)) || die "check failed"
  log "check passed"
  [[ -n $mode ]] || return 0
  check_kubeadm_init
  [[ $mode == --two-nodes ]] || return 0
  check_worker_join
}

node_ip() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }

# Beyond what kind itself needs checked: kubeadm init inside the node (as kind's kubeadminit
# action does, preflight skipped), then the image's own CNI and storage manifests, so every image
# it holds actually runs.
check_kubeadm_init() {
  local k=(docker exec "$CHECK_NAME" kubectl --kubeconfig=/etc/kubernetes/admin.conf) t0=$SECONDS ip
  ex sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml
  ex systemctl restart containerd
  # kind's kubeadm config (pkg/cluster/internal/kubeadm/config.go), its settings that matter here:
  # no disk-pressure eviction or image GC (the node sees the host's disk), conntrack sysctls left
  # alone (global, not the node's to set), systemd cgroups under /kubelet, kind's pod subnet.
  ip="$(node_ip "$CHECK_NAME")"
  docker exec -i "$CHECK_NAME" sh -c 'cat >/kind/kubeadm.conf' <<EOF
apiVersion: kubeadm.k8s.io/v1beta3
kind: ClusterConfiguration
kubernetesVersion: $K8S_VERSION
clusterName: pets-kind-check
controlPlaneEndpoint: "$CHECK_NAME:6443"
apiServer:
  certSANs: [localhost, 127.0.0.1]
networking:
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
---
apiVersion: kubeadm.k8s.io/v1beta3
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: "$ip"
  bindPort: 6443
nodeRegistration:
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
    node-ip: "$ip"
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
cgroupRoot: /kubelet
failSwapOn: false
imageGCHighThresholdPercent: 100
evictionHard:
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
iptables:
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
  log "kubeadm init inside $CHECK_NAME (kind's flags: --skip-phases=preflight --config=/kind/kubeadm.conf)"
  if ! ex kubeadm init --skip-phases=preflight --config=/kind/kubeadm.conf --skip-token-print --v=2 >"$CHECK_LOG" 2>&1; then
    tail -30 "$CHECK_LOG" >&2
    ex journalctl -u kubelet --no-pager 2>&1 | tail -30 >&2
    die "kubeadm init failed (log: $CHECK_LOG)"
  fi
  log "kubeadm init: $((SECONDS - t0)) s"
  "${k[@]}" taint nodes --all node-role.kubernetes.io/control-plane- >/dev/null || true
  # kind's installcni action: template PodSubnet, add CONTROL_PLANE_ENDPOINT to container 0's env.
  ex sh -c "sed -e 's#{{ .PodSubnet }}#10.244.0.0/16#' \
    -e 's#^        - name: POD_SUBNET#        - {name: CONTROL_PLANE_ENDPOINT, value: \"$CHECK_NAME:6443\"}\\n&#' \
    /kind/manifests/default-cni.yaml | kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f -" >&2
  "${k[@]}" apply -f /kind/manifests/default-storage.yaml >&2
  local ok=0
  "${k[@]}" wait --for=condition=Ready node --all --timeout=120s >&2 &&
    "${k[@]}" -n kube-system rollout status deploy/coredns --timeout=180s >&2 &&
    "${k[@]}" -n local-path-storage rollout status deploy/local-path-provisioner --timeout=180s >&2 && ok=1
  "${k[@]}" get pods -A -o wide >&2
  ((ok == 1)) || die "the cluster inside the check container did not come up (see above)"
  log "kubeadm init + CNI + CoreDNS + local-path-provisioner up in $((SECONDS - t0)) s"
  # A pod: a PVC from local-path (its busybox helper pod), DNS, the kubernetes Service via kube-proxy.
  docker exec -i "$CHECK_NAME" kubectl --kubeconfig=/etc/kubernetes/admin.conf apply -f - >&2 <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pets-kind-check}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: pets-kind-check}
spec:
  restartPolicy: Never
  containers:
  - name: check
    image: $TOOLS_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "echo written > /data/f && cat /data/f && nslookup kubernetes.default.svc.cluster.local && wget -q -O- --no-check-certificate https://kubernetes.default.svc/livez && echo"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: pets-kind-check}}]
EOF
  "${k[@]}" wait --for=jsonpath='{.status.phase}'=Succeeded pod/pets-kind-check --timeout=120s >&2 ||
    { "${k[@]}" describe pod pets-kind-check >&2; die "the check pod did not succeed"; }
  log "check pod (PVC + DNS + Service): $("${k[@]}" logs pets-kind-check | tr '\n' ' ')"
}

# A second node joins (kind's kubeadmjoin action: kubeadm join, preflight skipped), and a pod on
# each node reaches the other across nodes: the CNI's routes between nodes.
check_worker_join() {
  local w="$CHECK_NAME-worker" k=(docker exec -i "$CHECK_NAME" kubectl --kubeconfig=/etc/kubernetes/admin.conf) join t0=$SECONDS
  check_node_start "$w" --add-host "$CHECK_NAME:$(node_ip "$CHECK_NAME")" || die "the worker container did not boot"
  docker exec "$w" sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml
  docker exec "$w" systemctl restart containerd
  read -r -a join <<<"$(ex kubeadm token create --print-join-command 2>/dev/null)"
  log "kubeadm join on $w"
  docker exec "$w" "${join[@]}" --skip-phases=preflight >>"$CHECK_LOG" 2>&1 || { tail -20 "$CHECK_LOG" >&2; die "kubeadm join failed"; }
  "${k[@]}" wait --for=condition=Ready "node/$w" --timeout=180s >&2 || die "the worker did not become Ready"
  local n
  for n in "$CHECK_NAME" "$w"; do
    "${k[@]}" apply -f - >&2 <<EOF
apiVersion: v1
kind: Pod
metadata: {name: ping-$n, labels: {app: pets-kind-ping}}
spec:
  nodeName: $n
  containers:
  - {name: p, image: $TOOLS_IMAGE, imagePullPolicy: Never, command: ["sh", "-c", "httpd -f -p 8080 -h /etc"]}
EOF
  done
  "${k[@]}" wait --for=condition=Ready pod -l app=pets-kind-ping --timeout=120s >&2 || die "the ping pods did not start"
  local ip2
  ip2="$("${k[@]}" get pod "ping-$w" -o jsonpath='{.status.podIP}')"
  "${k[@]}" get pods -o wide -l app=pets-kind-ping >&2
  # The CNI agent writes routes every 10 s. (busybox's wget -T crashes: timeout(1) bounds it.)
  local i answer=""
  for ((i = 0; i < 30; i++)); do
    answer="$("${k[@]}" exec "ping-$CHECK_NAME" -- timeout 5 wget -q -O- "http://$ip2:8080/hostname" 2>/dev/null)" && break
    sleep 1
  done
  [[ $answer == "ping-$w" ]] || die "the pod on $CHECK_NAME cannot reach the pod $ip2 on $w"
  log "two nodes: $w joined and Ready; the pod on $CHECK_NAME reached the pod on $w ($ip2, it answered '$answer') in $((SECONDS - t0)) s"
}

main() {
  case "${1:-}" in
    preflight) cmd_preflight ;;
    node-image) cmd_node_image ;;
    check) cmd_check "${2:-}" ;;
    image) cmd_image ;;
    *) die "usage: $0 preflight|node-image|check|image" ;;
  esac
}

main "$@"; exit
