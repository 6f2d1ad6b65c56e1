#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Load an image into the local node's containerd (namespace k8s.io), without a registry.
#
# usage: load-image.sh IMAGE            docker save IMAGE | ctr images import -  (needs docker)
#        load-image.sh --archive FILE   an OCI or docker archive made elsewhere (no docker needed)
# PETS_CLUSTER=kind loads into the kind cluster instead (kind load docker-image / image-archive).
# Pods then use the image with imagePullPolicy IfNotPresent or Never. Docker names are imported
# as containerd normalises them: pets-training/trainer:0.1.0 -> docker.io/pets-training/trainer:0.1.0,
# which is also what kubelet looks up for `image: pets-training/trainer:0.1.0`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=load-image
# shellcheck source=lib.sh
source "$HERE/lib.sh"

if [[ "${PETS_CLUSTER:-local}" == kind ]]; then
  # kind's nodes run their own containerd; kind loads images into them.
  kind="$PETS_BIN/kind"
  [[ -x "$kind" ]] || die "$kind is missing: run tests/cluster/build.sh kind"
  case "${1:-}" in
    --archive) exec "$kind" load image-archive "${2:?--archive needs a file}" --name "${PETS_KIND_NAME:-pets-training}" ;;
    "" | -*) die "usage: $0 IMAGE | --archive FILE (got '${1:-}')" ;;
    *) exec "$kind" load docker-image "$1" --name "${PETS_KIND_NAME:-pets-training}" ;;
  esac
fi

sock="$PETS_STATE/containerd/containerd.sock"
[[ -S "$sock" ]] || die "no containerd socket at $sock: is the local cluster up (tests/cluster/cluster.sh up local)?"
ctr_() { ctr --address "$sock" --namespace k8s.io "$@"; }

t0=$SECONDS
case "${1:-}" in
  --archive)
    [[ -f "${2:-}" ]] || die "--archive: '${2:-}' is not a file"
    ctr_ images import "$2"
    ;;
  "" | -*)
    die "usage: $0 IMAGE | --archive FILE (got '${1:-}')"
    ;;
  *)
    command -v docker >/dev/null || die "docker not found: load-image.sh IMAGE needs docker (or use --archive FILE)"
    docker image inspect "$1" >/dev/null 2>&1 || die "image '$1' is not in docker (docker images lists what is)"
    log "docker save $1 | ctr import"
    docker save "$1" | ctr_ images import -
    ;;
esac
log "loaded in $((SECONDS - t0)) s"
