#!/usr/bin/env bash
# Build the trainer and operator images, offline when no registry can be reached.
#
#   image/build.sh engine      make sure a Docker engine answers (installs and starts one on Debian as root)
#   image/build.sh base        the local Debian bookworm base image, from Debian's packages (debootstrap)
#   image/build.sh wheelhouse  fill $PETS_CACHE/wheelhouse/{trainer,operator} with `pip download`
#   image/build.sh trainer     build pets-training/trainer:VERSION
#   image/build.sh operator    build pets-training/operator:VERSION
#   image/build.sh all         engine, base, wheelhouse, operator, trainer
#   image/build.sh clean       remove our images and their build cache (not the base, not $PETS_CACHE)
#   image/build.sh sizes       print the images' sizes
#   image/build.sh version     print the version the images are tagged with
#
# Environment:
#   PETS_CACHE          cache directory (default ~/.cache/pets-training): rootfs tarball, wheelhouse
#   PETS_BASE_IMAGE     build FROM this image instead of the local offline base, for example
#                       python:3.11-slim-bookworm on a machine that can pull it
#   PETS_DEBIAN_MIRROR  Debian mirror for debootstrap (default: debootstrap's own)
#   PETS_PYTHON         host Python whose pip fills the wheelhouse (default: python3)
#   PETS_IMAGE_SOURCE   the OCI source label (default: the git remote `origin`, else "unknown")
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PETS_CACHE=${PETS_CACHE:-$HOME/.cache/pets-training}
PETS_PYTHON=${PETS_PYTHON:-python3}
# The legacy builder: Debian's docker.io (20.10) has no BuildKit, and the Dockerfile needs none.
export DOCKER_BUILDKIT=0

SUITE=bookworm
# bookworm's python3 is 3.11: the wheelhouse is downloaded for that interpreter, whatever the host runs.
IMAGE_PYTHON=3.11
BASE_PACKAGES=python3,python3-venv,ca-certificates
BASE_GLIBC_MINOR=36 # bookworm's glibc is 2.36
BASE_RECIPE=2       # bump when cmd_base changes how the rootfs is made: the cached tarball is rebuilt
# What the images never need at run time, removed from the rootfs: apt's lists and caches, docs,
# man pages, message translations (the images run in C.UTF-8), packaging lint data, logs.
BASE_TRIM='var/lib/apt/lists/* var/cache/apt/* usr/share/doc/* usr/share/man/* usr/share/info/*
  usr/share/locale/* usr/share/lintian usr/share/bash-completion var/log/*.log tmp/*'
BASE_TAG=pets-training/base:$SUITE
IMAGES=(operator trainer) # the order of their stages in image/Dockerfile

log() { printf '[image/build.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_python() {
  "$PETS_PYTHON" -c 'import sys, tomllib' 2>/dev/null ||
    die "PETS_PYTHON=$PETS_PYTHON is not a Python 3.11 or newer (tomllib reads pyproject.toml); set PETS_PYTHON"
}

# pets_contract.__version__, the one source of the version (its __init__ imports nothing).
version() {
  PYTHONPATH="$ROOT/src" "$PETS_PYTHON" -c 'import pets_contract; print(pets_contract.__version__)'
}

image_tag() { echo "pets-training/$1:$(version)"; }

# ---------------------------------------------------------------- engine
engine_answers() { docker info >/dev/null 2>&1; }

wait_for_engine() {
  local deadline=$((SECONDS + ${1:-60}))
  until engine_answers; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

cmd_engine() {
  command -v docker >/dev/null 2>&1 || [[ $EUID -eq 0 && -f /etc/debian_version ]] ||
    die "no docker command. Install Docker (https://docs.docker.com/engine/install/) or, on Debian, run this as root."
  if engine_answers; then
    return 0
  fi
  if [[ $EUID -ne 0 || ! -f /etc/debian_version ]]; then
    die "no Docker engine answers (docker info failed). Start one (systemctl start docker) or install Docker: \
https://docs.docker.com/engine/install/ . As root on Debian, this script installs docker.io and starts dockerd itself."
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing Debian's docker.io (no Docker engine here)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io iptables >/dev/null
  fi
  mkdir -p "$PETS_CACHE"
  # A dockerd killed without its shutdown (a machine stopped under it) leaves its pid file, and the next
  # one refuses to start ("pid file found") until it is gone.
  local pidfile=/var/run/docker.pid
  if [[ -f $pidfile ]] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    log "removing $pidfile: its dockerd (pid $(cat "$pidfile")) is gone"
    rm -f "$pidfile"
  fi
  log "starting dockerd (log: $PETS_CACHE/dockerd.log)"
  setsid dockerd >"$PETS_CACHE/dockerd.log" 2>&1 </dev/null &
  wait_for_engine 120 || die "dockerd did not answer within 120 s; see $PETS_CACHE/dockerd.log:
$(tail -n 20 "$PETS_CACHE/dockerd.log")"
  log "Docker engine $(docker version --format '{{.Server.Version}}') is up"
}

# ---------------------------------------------------------------- base
cmd_base() {
  if [[ -n ${PETS_BASE_IMAGE:-} ]]; then
    log "PETS_BASE_IMAGE=$PETS_BASE_IMAGE: no local base needed"
    return 0
  fi
  cmd_engine
  local key tarball
  key=$(printf '%s %s %s %s %s' "$BASE_RECIPE" "$SUITE" "$BASE_PACKAGES" "$BASE_TRIM" "${PETS_DEBIAN_MIRROR:-}" |
    sha256sum | cut -c1-12)
  tarball=$PETS_CACHE/base/$SUITE-minbase-$key.tar
  if docker image inspect "$BASE_TAG" --format '{{index .Config.Labels "pets.base.key"}}' 2>/dev/null |
    grep -qx "$key"; then
    log "base image $BASE_TAG is up to date"
    return 0
  fi
  if [[ ! -f $tarball ]]; then
    [[ $EUID -eq 0 ]] || die "building the offline base needs root (debootstrap); or set PETS_BASE_IMAGE=python:3.11-slim-bookworm"
    if ! command -v debootstrap >/dev/null 2>&1; then
      [[ -f /etc/debian_version ]] || die "debootstrap is missing: install it, or set PETS_BASE_IMAGE=python:3.11-slim-bookworm"
      log "installing debootstrap"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    local rootfs
    mkdir -p "$PETS_CACHE/base"
    rootfs=$(mktemp -d "$PETS_CACHE/base/rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$rootfs'" EXIT
    log "debootstrap $SUITE (minbase + $BASE_PACKAGES) into $rootfs; about a minute"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" \
      ${PETS_DEBIAN_MIRROR:+"$PETS_DEBIAN_MIRROR"} > >(tee "$PETS_CACHE/base/debootstrap.log" |
        grep --line-buffered -E '^I: ((Resolving|Installing|Unpacking|Configuring) .*(packages|system)|Base system)' >&2) 2>&1 ||
      die "debootstrap failed; its log: $PETS_CACHE/base/debootstrap.log"
    [[ -x $rootfs/usr/bin/python3 ]] || die "debootstrap finished without $rootfs/usr/bin/python3"
    # shellcheck disable=SC2086 # the globs expand inside the rootfs
    (cd "$rootfs" && rm -rf $BASE_TRIM)
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    find "$PETS_CACHE/base" -maxdepth 1 -name "$SUITE-minbase-*.tar" ! -name "${tarball##*/}" -delete
    rm -rf "$rootfs"
    trap - EXIT
    log "cached the rootfs: $tarball ($(du -h "$tarball" | cut -f1))"
  fi
  log "importing $tarball as $BASE_TAG"
  docker import \
    --change "LABEL pets.base.key=$key" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    "$tarball" "$BASE_TAG" >/dev/null
}

# ---------------------------------------------------------------- wheelhouse
platform_args() {
  local arch
  arch=$(uname -m)
  case $arch in
    x86_64 | aarch64) ;;
    *) die "unsupported machine $arch for the wheelhouse (x86_64 or aarch64)" ;;
  esac
  # bookworm has glibc 2.36: every manylinux tag up to it fits (pip does not widen a --platform
  # itself), plus the legacy aliases and pure-Python wheels.
  local args=(--only-binary=:all: --python-version "$IMAGE_PYTHON" --implementation cp
    --abi "cp${IMAGE_PYTHON/./}") glibc
  for ((glibc = BASE_GLIBC_MINOR; glibc >= 5; glibc--)); do args+=(--platform "manylinux_2_${glibc}_$arch"); done
  args+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch" --platform any)
  echo "${args[@]}"
}

# The wheelhouse of one image: $PETS_CACHE/wheelhouse/NAME holds requirements.txt (the runtime
# requirements), build-requirements.txt (to build our own package inside the image) and their wheels.
fill_wheelhouse() {
  local name=$1 dir reqs build_reqs key
  dir=$PETS_CACHE/wheelhouse/$name
  reqs=$("$PETS_PYTHON" image/requirements.py "$name" --runtime)
  build_reqs=$("$PETS_PYTHON" image/requirements.py "$name" --build)
  key=$(printf '%s\n%s\n%s\n' "$reqs" "$build_reqs" "$(platform_args)" | sha256sum | cut -c1-16)
  if [[ -f $dir/.complete && $(cat "$dir/.complete") == "$key" ]]; then
    log "wheelhouse $dir is complete ($(du -sh "$dir" | cut -f1))"
    return 0
  fi
  log "pip download into $dir for Python $IMAGE_PYTHON on $(uname -m); the trainer's torch is several GB"
  rm -rf "$dir.new"
  mkdir -p "$dir.new"
  printf '%s\n' "$reqs" >"$dir.new/requirements.txt"
  printf '%s\n' "$build_reqs" >"$dir.new/build-requirements.txt"
  # pip's full output goes to pip.log; its "Saved ..." lines show the progress.
  # shellcheck disable=SC2046
  "$PETS_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --dest "$dir.new" $(platform_args) \
    -r "$dir.new/requirements.txt" -r "$dir.new/build-requirements.txt" \
    > >(tee "$dir.new/pip.log" | grep --line-buffered -E '^(Saved|ERROR)' >&2) 2>&1 ||
    die "pip download for $name failed; its log: $dir.new/pip.log"
  echo "$key" >"$dir.new/.complete"
  rm -rf "$dir"
  mv "$dir.new" "$dir"
  log "wheelhouse $dir: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}

cmd_wheelhouse() {
  local name
  for name in "${@:-${IMAGES[@]}}"; do fill_wheelhouse "$name"; done
}

# The build reads the wheelhouse over loopback (docker build --network host): a static file server on
# 127.0.0.1 for the length of one build. The port is fixed, because the legacy builder keys its layer
# cache on build-arg values. The wheels never enter the build context or a layer.
WHEELHOUSE_PORT=${PETS_WHEELHOUSE_PORT:-38471}
WHEELHOUSE_URL=http://127.0.0.1:$WHEELHOUSE_PORT
WHEELHOUSE_PID=

serve_wheelhouse() {
  local tries
  "$PETS_PYTHON" -m http.server --bind 127.0.0.1 --directory "$PETS_CACHE/wheelhouse" "$WHEELHOUSE_PORT" \
    >"$PETS_CACHE/wheelhouse-server.log" 2>&1 &
  WHEELHOUSE_PID=$!
  for ((tries = 0; tries < 50; tries++)); do
    kill -0 "$WHEELHOUSE_PID" 2>/dev/null ||
      die "the wheelhouse server could not listen on 127.0.0.1:$WHEELHOUSE_PORT (in use? set PETS_WHEELHOUSE_PORT): $(tail -n 3 "$PETS_CACHE/wheelhouse-server.log")"
    "$PETS_PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
      "$WHEELHOUSE_URL/" 2>/dev/null && return 0
    sleep 0.2
  done
  die "the wheelhouse server on $WHEELHOUSE_URL did not answer within 10 s"
}

stop_wheelhouse() {
  [[ -z $WHEELHOUSE_PID ]] || kill "$WHEELHOUSE_PID" 2>/dev/null || true
  WHEELHOUSE_PID=
}

# ---------------------------------------------------------------- images
# A cold trainer build holds the fetched wheels (3 GB, in the build container until pip is done) and
# the installed venv (6 GB) at once: about 10 GB under the engine's root.
warn_if_low_on_disk() {
  local name=$1 root free_gb need_gb=2
  [[ $name != trainer ]] || need_gb=10
  root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) || return 0
  free_gb=$(df -P -BG "$root" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
  if ((free_gb < need_gb)); then
    log "warning: $free_gb GB free under $root; a cold $name build needs about $need_gb GB" \
      "(image/build.sh clean frees our old images)"
  fi
}

build_image() {
  local name=$1 tag base source revision start previous
  tag=$(image_tag "$name")
  base=${PETS_BASE_IMAGE:-$BASE_TAG}
  source=${PETS_IMAGE_SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo unknown)}
  revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  if [[ -n $(git -C "$ROOT" status --porcelain -- src operator pyproject.toml 2>/dev/null) ]]; then
    revision=$revision-dirty
  fi
  warn_if_low_on_disk "$name"
  # The trainer's build stage also reads the operator's wheelhouse (the build backend).
  local wheel_args=() wheels sets=(operator)
  [[ $name == operator ]] || sets+=("$name")
  for wheels in "${sets[@]}"; do
    fill_wheelhouse "$wheels"
    wheel_args+=(--build-arg "${wheels^^}_WHEELS=$(cat "$PETS_CACHE/wheelhouse/$wheels/.complete")")
  done
  previous=$(docker image inspect "$tag" --format '{{.Id}}' 2>/dev/null || true)
  serve_wheelhouse
  trap stop_wheelhouse EXIT
  log "building $tag FROM $base (revision $revision)"
  start=$SECONDS
  docker build --network host -f image/Dockerfile --target "$name" \
    --build-arg BASE_IMAGE="$base" \
    --build-arg WHEELHOUSE="$WHEELHOUSE_URL" \
    "${wheel_args[@]}" \
    --build-arg VERSION="$(version)" \
    --build-arg REVISION="$revision" \
    --build-arg SOURCE="$source" \
    -t "$tag" . || die "docker build of $tag failed"
  stop_wheelhouse
  trap - EXIT
  log "built $tag in $((SECONDS - start)) s: $(docker image inspect "$tag" --format '{{.Size}}' | numfmt --to=iec)"
  # The image this tag named before is superseded: remove it (its code layer; the dependency layers
  # it shares with the new image stay). A container still using it keeps it.
  if [[ -n $previous && $previous != "$(docker image inspect "$tag" --format '{{.Id}}')" ]]; then
    docker image rm "$previous" >/dev/null 2>&1 && log "removed the superseded ${previous:7:12}" || true
  fi
}

cmd_image() {
  local name=$1
  cmd_engine
  cmd_base
  build_image "$name"
}

cmd_all() {
  cmd_engine
  cmd_base
  cmd_wheelhouse
  local name
  for name in "${IMAGES[@]}"; do build_image "$name"; done
  cmd_sizes
}

cmd_sizes() {
  local name
  for name in "${IMAGES[@]}"; do
    docker image inspect "$(image_tag "$name")" --format "{{index .RepoTags 0}} {{.Size}}" 2>/dev/null |
      awk '{ printf "%s %.0f MB\n", $1, $2 / 1e6 }'
  done
}

cmd_clean() {
  cmd_engine
  local name
  for name in "${IMAGES[@]}"; do docker image rm -f "$(image_tag "$name")" >/dev/null 2>&1 || true; done
  # The legacy builder's cache is its intermediate images: every stage of ours carries the label.
  docker image prune -af --filter label=dev.pets-training.dockerfile >/dev/null
  log "removed our images and their build cache (kept $BASE_TAG and $PETS_CACHE)"
}

main() {
  local cmd=${1:-all}
  shift || true
  check_python
  case $cmd in
    engine) cmd_engine ;;
    base) cmd_base ;;
    wheelhouse) cmd_wheelhouse "$@" ;;
    trainer | operator) cmd_image "$cmd" ;;
    all) cmd_all ;;
    clean) cmd_clean ;;
    sizes) cmd_sizes ;;
    version) version ;;
    -h | --help | help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" ;;
    *) die "unknown subcommand '$cmd'; expected one of: engine base wheelhouse trainer operator all clean sizes version" ;;
  esac
}

# On one line with its exit, so that editing this file while it runs cannot feed bash a stale tail.
main "$@"; exit
