# Build the NetworkPolicy enforcer (issue 24) for the local cluster (sourced by build.sh, which
# provides go_progress, is_cached, mark_cached, apt_install and the lock). netpol.sh runs it, one
# per node.
#
#   netpol: kube-network-policies (Kubernetes SIG Network; Apache-2.0), its `standard` command
#           (NetworkPolicy only) -> $PETS_BIN/kube-network-policies
# The Go module proxy refuses sigs.k8s.io/kube-network-policies (403 for its version list and
# every tag), so `go install` cannot fetch it: its source comes from an upstream `git archive`
# beside the repository ($NETPOL_TARBALL, ../shared/kube-network-policies), unpacked into
# $PETS_CACHE/src keyed by the tarball's sha256 and built there with GOFLAGS=-mod=mod (its
# dependencies, not vendored, from the Go module proxy into the usual module cache).
# A cold build (empty GOCACHE) took 146 s on 2 shared cores; the binary is 31 MB (static, stripped).
# shellcheck shell=bash

NETPOL_VERSION="${NETPOL_VERSION:-v1.1.1}"
NETPOL_TARBALL="$(realpath -m "${PETS_NETPOL_TARBALL:-$CLUSTER_DIR/../../../shared/kube-network-policies/kube-network-policies-$NETPOL_VERSION.tar.gz}")"

# netpol_source_dir KEY: the unpacked source for tarball hash KEY (unpacked once; atomic rename).
netpol_source_dir() {
  local key="$1" dir tmp top
  dir="$PETS_CACHE/src/kube-network-policies-$key"
  if [[ ! -f "$dir/go.mod" ]]; then
    mkdir -p "$PETS_CACHE/src"
    tmp="$(mktemp -d "$PETS_CACHE/src/.kube-network-policies.XXXXXX")"
    tar -xzf "$NETPOL_TARBALL" -C "$tmp"
    # `git archive --prefix=kube-network-policies-vX/`: one top-level directory.
    top="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d)"
    [[ -n $top && $(wc -l <<<"$top") -eq 1 && -f "$top/go.mod" ]] ||
      { rm -rf "$tmp"; die "$NETPOL_TARBALL: expected one top-level directory holding go.mod"; }
    rm -rf "$dir"
    mv "$top" "$dir"
    rm -rf "$tmp"
  fi
  echo "$dir"
}

# kube-router's network policy controller (cloudnativelabs/kube-router; Apache-2.0), the enforcer
# where the kernel lacks nft_queue (lib.sh netpol_enforcer). v2.1.0 is the only version the Go module
# proxy serves here; its pinned dependencies have had security reports since, which matters little
# for a test harness's policy enforcer but would for a production cluster. It runs iptables and
# ipset (Debian's ipset, installed here).
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"

build_kube_router() {
  apt_install ipset
  go_install kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$KUBE_ROUTER_VERSION" \
    "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
}

# build.sh netpol: the enforcer that netpol.sh will start on this kernel.
build_netpol() {
  apt_install nftables  # nft: the kernel probe, and the removal of kube-network-policies' table
  case "$(netpol_enforcer)" in
    kube-router) build_kube_router ;;
    *) build_kube_network_policies ;;
  esac
}

build_kube_network_policies() {
  local t0=$SECONDS sum key src
  [[ -f $NETPOL_TARBALL ]] || die "kube-network-policies $NETPOL_VERSION: no source tarball at $NETPOL_TARBALL \
(the Go module proxy refuses the module; set PETS_NETPOL_TARBALL to upstream's \`git archive\` of the tag)"
  sum="$(sha256sum "$NETPOL_TARBALL" | cut -c1-16)"
  key="$NETPOL_VERSION $sum"
  is_cached kube-network-policies "$key" && { log "kube-network-policies $NETPOL_VERSION: cached"; return 0; }
  src="$(netpol_source_dir "$sum")"
  log "kube-network-policies $NETPOL_VERSION: building ./cmd/kube-network-policies/standard in $src (nice -n 15)"
  # -mod=mod: no vendor directory, dependencies from the module proxy; the tarball's go.sum checks them.
  (cd "$src" && GOFLAGS="-mod=mod -buildvcs=false" go_progress kube-network-policies build -trimpath \
    -ldflags "-s -w" -o "$PETS_BIN/.kube-network-policies.tmp" ./cmd/kube-network-policies/standard)
  mv "$PETS_BIN/.kube-network-policies.tmp" "$PETS_BIN/kube-network-policies"
  mark_cached kube-network-policies "$key"
  log "kube-network-policies $NETPOL_VERSION: built in $((SECONDS - t0)) s ($(du -h "$PETS_BIN/kube-network-policies" | cut -f1))"
}
