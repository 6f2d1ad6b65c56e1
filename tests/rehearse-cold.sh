#!/usr/bin/env bash
# make rehearse-cold: the README's Quick start as a new user meets it. In a throw-away clone of this
# repository's HEAD, with a throw-away state root and an empty cache root, run `make demo`, then
# `make test`, then `make cluster-down`; print each phase's time and the peak disk use.
#
# Environment (optional):
#   PETS_REHEARSAL_ROOT   where the clone, the state root and (by default) the cache go  [mktemp -d under $TMPDIR or /var/tmp]
#   PETS_REHEARSAL_CACHE  the cache root to fill; it must be empty or absent. Given, it stays afterwards
#                         (so that later runs find it warm); by default it is under the root and removed.
# The Go module cache goes under the cache root too, so nothing downloaded before is reused. Docker's
# image store (/var/lib/docker) is the machine's own: the count of images it held at the start is printed.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[rehearse-cold %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT=${PETS_REHEARSAL_ROOT:-$(mktemp -d "${TMPDIR:-/var/tmp}/pets-rehearsal.XXXXXX")}
CACHE=${PETS_REHEARSAL_CACHE:-$ROOT/cache}
[[ -z "$(ls -A "$CACHE" 2>/dev/null)" ]] || die "the cache root $CACHE is not empty: a cold rehearsal starts with none"
mkdir -p "$ROOT" "$CACHE"
[[ -z "$(ls -A "$ROOT/clone" "$ROOT/state" 2>/dev/null)" ]] || die "$ROOT already holds a clone or a state root"

git clone -q "$REPO" "$ROOT/clone"
export PETS_STATE=$ROOT/state PETS_CACHE=$CACHE GOMODCACHE=$CACHE/go-mod
unset GOCACHE VIRTUAL_ENV KUBECONFIG
log "clone $ROOT/clone at $(git -C "$ROOT/clone" rev-parse --short HEAD), state root $PETS_STATE, cache root $PETS_CACHE"
log "docker images present at the start: $(docker images -q 2>/dev/null | wc -l) (the engine's store is not part of the cache root)"

# Disk: the filesystem's used bytes sampled every 5 s; the peak above the start is the figure.
disk_used_mb() { df --output=used -BM "$ROOT" | tail -n 1 | tr -dc 0-9; }
start_mb=$(disk_used_mb)
echo "$start_mb" >"$ROOT/disk-peak-mb"
( while :; do
    now=$(disk_used_mb)
    (( now > $(cat "$ROOT/disk-peak-mb") )) && echo "$now" >"$ROOT/disk-peak-mb"
    sleep 5
  done ) &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT

declare -a figures=()
phase() {
  local name=$1 t0=$SECONDS rc=0
  shift
  log "phase $name: $*"
  (cd "$ROOT/clone" && "$@") || rc=$?
  figures+=("$(printf '%-14s %5d s  exit %d  disk above start: now %d MB, peak %d MB' "$name" $((SECONDS - t0)) "$rc" \
    $(($(disk_used_mb) - start_mb)) $(($(cat "$ROOT/disk-peak-mb") - start_mb)))")
  log "phase $name: exit $rc after $((SECONDS - t0)) s"
  return "$rc"
}

rc=0
phase "make demo" make demo || rc=$?
((rc)) || phase "make test" make test || rc=$?
down_rc=0
phase "cluster-down" make cluster-down || down_rc=$?
{
  echo "cold rehearsal of $(git -C "$ROOT/clone" rev-parse --short HEAD) on $(nproc) cores, $(date -u +%F)"
  printf '  %s\n' "${figures[@]}"
  echo "  peak disk above the start: $(($(cat "$ROOT/disk-peak-mb") - start_mb)) MB; kept afterwards: $(($(disk_used_mb) - start_mb)) MB"
} | tee "$ROOT/rehearsal.txt"
if ((down_rc)); then
  log "cluster-down failed: the clone, state and cache stay in $ROOT for a look (make cluster-down there first)"
  exit 1
fi
rm -rf "$ROOT/clone" "$ROOT/state"
if [[ -z ${PETS_REHEARSAL_CACHE:-} ]]; then rm -rf "$CACHE"; fi
log "removed the throw-away clone and state${PETS_REHEARSAL_CACHE:+ (the cache root $CACHE stays)}; figures in $ROOT/rehearsal.txt"
exit "$rc"
