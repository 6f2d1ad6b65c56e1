#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build (once) and cache kwok, the node/pod simulator the scale benchmark runs beside the test
# control plane: `go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION` into $PETS_CACHE/bin, with a
# stamp file holding the version, the way tests/cluster/build.sh builds its Go binaries. The rest of
# the scale harness (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) comes from
# tests/cluster/build.sh control-plane node.
#
# usage: tests/scale/build.sh        (prints nothing but log lines; the binary is $PETS_CACHE/bin/kwok)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=scale-build
# shellcheck source=../cluster/lib.sh
source "$HERE/../cluster/lib.sh"

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
mkdir -p "$PETS_BIN"

is_cached() { [[ -x "$PETS_BIN/$1" && "$(cat "$PETS_BIN/.$1.version" 2>/dev/null)" == "$2" ]]; }

build_kwok() {
  local t0=$SECONDS gobin own_cache=""
  is_cached kwok "$KWOK_VERSION" && { log "kwok $KWOK_VERSION: cached"; return 0; }
  # A Go build cache of the caller's is used and kept; otherwise a private one, removed after the
  # build (nothing else here would reuse it, and it holds hundreds of MB).
  if [[ -z "${GOCACHE:-}" ]]; then
    own_cache="$(mktemp -d "$PETS_CACHE/go-build-kwok.XXXXXX")"
    export GOCACHE="$own_cache"
  fi
  gobin="$(mktemp -d "$PETS_CACHE/gobin.XXXXXX")"
  log "kwok $KWOK_VERSION: building (go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION, nice -n 15; a few minutes cold)"
  if ! GOBIN="$gobin" nice -n 15 go install -trimpath \
      -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; then
    rm -rf "$gobin" ${own_cache:+"$own_cache"}
    die "kwok $KWOK_VERSION: go install failed"
  fi
  mv "$gobin/kwok" "$PETS_BIN/kwok"
  rmdir "$gobin"
  printf '%s\n' "$KWOK_VERSION" >"$PETS_BIN/.kwok.version"
  [[ -n "$own_cache" ]] && rm -rf "$own_cache"
  log "kwok $KWOK_VERSION: built in $((SECONDS - t0)) s -> $PETS_BIN/kwok"
}

main() {
  # One build at a time per cache (the same lock tests/cluster/build.sh takes).
  exec 9>"$PETS_CACHE/.build.lock"
  if ! flock -n 9; then
    log "another build is running on $PETS_CACHE; waiting for it"
    flock 9
  fi
  build_kwok
}

main "$@"
