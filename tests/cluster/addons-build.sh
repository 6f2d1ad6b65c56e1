# Build the optional add-ons' binaries and images (sourced by build.sh, which provides go_install,
# is_cached, mark_cached, oci_image and the lock). addons.sh installs them into the local cluster.
#
#   kubeflow: `go install github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION`
#             -> $PETS_BIN/training-operator.v1 -> image $KUBEFLOW_IMAGE
#   kueue:    `go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION` where the Go module proxy serves that
#             module, else the prebuilt $KUEUE_DIR/kueue.gz (PETS_KUEUE_SOURCE=go|prebuilt forces one)
#             -> $PETS_BIN/kueue -> image $KUEUE_IMAGE
#   s3:       `go install github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION` (the Versity
#             S3 gateway, Apache-2.0: a real S3 server over a POSIX directory)
#             -> $PETS_BIN/versitygw -> image $S3_IMAGE (the binary as /usr/local/bin/versitygw)
#   mlflow:   `mlflow` from PyPI (mlflow-requirements.txt) -> image $MLFLOW_IMAGE
#   prometheus: upstream's Prometheus server, `go build` in the wrapper module prometheus/
#             -> $PETS_BIN/prometheus -> image $PROMETHEUS_IMAGE (/usr/local/bin/prometheus)
# The images are the project's offline Debian bookworm base (image/build.sh base: its cached rootfs
# tarball, no Docker needed once that exists) plus the binary (/manager for the controllers), packed
# by oci_archive.py.
# shellcheck shell=bash disable=SC2034  # S3_IMAGE is used by addons.sh, which sources this too

REPO_DIR="$(cd "$HERE/../.." && pwd)"

# The S3 add-on's version and image. (Beside TRAINING_OPERATOR_VERSION and KUEUE_VERSION in lib.sh
# would be their natural place; they are here so that the add-on stays in the add-on files: addons.sh
# sources this file for them.)
VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.0.14}"
S3_IMAGE="localhost/pets-training/s3:$VERSITYGW_VERSION"

# The offline Debian base's rootfs tarball (made once by image/build.sh base; it needs Docker only then).
BASE_ROOTFS_TAR=""
find_base_rootfs() {
  local tars
  [[ -n $BASE_ROOTFS_TAR ]] && return 0
  mapfile -t tars < <(ls -t "$PETS_CACHE"/base/bookworm-minbase-*.tar 2>/dev/null)
  if [[ ${#tars[@]} -eq 0 ]]; then
    log "no offline Debian base in $PETS_CACHE/base: image/build.sh base (debootstrap, about a minute)"
    "$REPO_DIR/image/build.sh" base >&2
    mapfile -t tars < <(ls -t "$PETS_CACHE"/base/bookworm-minbase-*.tar 2>/dev/null)
    [[ ${#tars[@]} -gt 0 ]] || die "image/build.sh base left no $PETS_CACHE/base/bookworm-minbase-*.tar"
  fi
  BASE_ROOTFS_TAR="${tars[0]}"
}

# fill_base ROOTFS: the base's files, owners kept (we are root here: the node needs root anyway).
fill_base() {
  tar --numeric-owner -xf "$BASE_ROOTFS_TAR" -C "$1"
}

# The PyTorchJob workers' init container: upstream's template runs `nslookup` (alpine's busybox),
# which the Debian base lacks; this one waits for the master's name with glibc's `getent hosts`.
KUBEFLOW_INIT_TEMPLATE="$HERE/pytorch-init-container.yaml"

fill_kubeflow() {
  fill_base "$1"
  install -m 0755 "$PETS_BIN/training-operator.v1" "$1/manager"
  install -D -m 0644 "$KUBEFLOW_INIT_TEMPLATE" "$1/etc/training-operator/pytorch-init-container.yaml"
}

build_kubeflow() {
  local t0=$SECONDS
  go_install training-operator.v1 github.com/kubeflow/training-operator/cmd/training-operator.v1 \
    "$TRAINING_OPERATOR_VERSION"
  find_base_rootfs
  oci_image "$KUBEFLOW_IMAGE" "$PETS_CACHE/images/training-operator.tar" \
    "$TRAINING_OPERATOR_VERSION ${BASE_ROOTFS_TAR##*/} $(sha256sum "$KUBEFLOW_INIT_TEMPLATE" | cut -c1-12)" \
    fill_kubeflow --entrypoint /manager --user 65532:65532
  log "kubeflow: done in $((SECONDS - t0)) s"
}

# `go install sigs.k8s.io/kueue/cmd/kueue@VERSION` into $PETS_BIN; returns 1 (nothing cached) when the
# Go module proxy refuses it. Seen here: it serves the version's .info/.mod/.zip (`go list -m` works)
# but answers 403 to the module's version list, which `go install` reads for deprecations, so it fails
# within a second, before compiling anything.
kueue_go_install() {
  local gobin commit rc=0 t0=$SECONDS
  commit="$(cd / && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("Origin", {}).get("Hash", "unknown"))')" || return 1
  gobin="$(mktemp -d "$PETS_CACHE/gobin.XXXXXX")"
  log "kueue $KUEUE_VERSION: building (go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION)"
  (cd / && GOBIN="$gobin" go_progress kueue install -trimpath -ldflags "-s -w \
    -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.GitCommit=$commit" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION") || rc=$?
  if [[ $rc -ne 0 || ! -x $gobin/kueue ]]; then
    rm -rf "$gobin"
    return 1
  fi
  mv "$gobin/kueue" "$PETS_BIN/kueue"
  rmdir "$gobin"
  mark_cached kueue "$KUEUE_VERSION"
  echo "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >"$PETS_BIN/.kueue.source"
  log "kueue $KUEUE_VERSION: built in $((SECONDS - t0)) s"
}

kueue_unpack_prebuilt() {
  [[ -f $KUEUE_DIR/kueue.gz ]] || die "Kueue $KUEUE_VERSION: the Go module proxy does not serve sigs.k8s.io/kueue \
and there is no prebuilt $KUEUE_DIR/kueue.gz (set PETS_KUEUE_DIR to a folder holding kueue.gz and manifests.yaml)"
  log "kueue $KUEUE_VERSION: unpacking the prebuilt $KUEUE_DIR/kueue.gz"
  gunzip -c "$KUEUE_DIR/kueue.gz" >"$PETS_BIN/.kueue.tmp"
  chmod 0755 "$PETS_BIN/.kueue.tmp"
  mv "$PETS_BIN/.kueue.tmp" "$PETS_BIN/kueue"
  mark_cached kueue "$KUEUE_VERSION"
  echo "prebuilt $KUEUE_DIR/kueue.gz" >"$PETS_BIN/.kueue.source"
}

build_kueue_binary() {
  local source="${PETS_KUEUE_SOURCE:-auto}"
  is_cached kueue "$KUEUE_VERSION" && { log "kueue $KUEUE_VERSION: cached ($(cat "$PETS_BIN/.kueue.source" 2>/dev/null))"; return 0; }
  case "$source" in
    auto)
      kueue_go_install && return 0
      log "kueue $KUEUE_VERSION: go install failed (the Go module proxy refuses sigs.k8s.io/kueue, see above)"
      kueue_unpack_prebuilt ;;
    go) kueue_go_install || die "kueue $KUEUE_VERSION: go install failed (PETS_KUEUE_SOURCE=go)" ;;
    prebuilt) kueue_unpack_prebuilt ;;
    *) die "PETS_KUEUE_SOURCE='$source': expected auto, go or prebuilt" ;;
  esac
}

fill_kueue() {
  fill_base "$1"
  install -m 0755 "$PETS_BIN/kueue" "$1/manager"
}

build_kueue() {
  local t0=$SECONDS
  build_kueue_binary
  find_base_rootfs
  oci_image "$KUEUE_IMAGE" "$PETS_CACHE/images/kueue.tar" \
    "$KUEUE_VERSION $(sha256sum "$PETS_BIN/kueue" | cut -c1-12) ${BASE_ROOTFS_TAR##*/}" \
    fill_kueue --entrypoint /manager --user 65532:65532
  log "kueue: done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------ S3 (Versity S3 gateway)
S3_BIN_IN_IMAGE=/usr/local/bin/versitygw

fill_s3() {
  fill_base "$1"
  install -D -m 0755 "$PETS_BIN/versitygw" "$1$S3_BIN_IN_IMAGE"
}

# A cold build compiles about 500 packages (the AWS SDK, Azure's, fiber, NATS, Kafka clients...).
build_s3() {
  local t0=$SECONDS
  go_install versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION" \
    "-X=main.Version=$VERSITYGW_VERSION -X=main.Build=pets-training -X=main.BuildTime=none"
  find_base_rootfs
  oci_image "$S3_IMAGE" "$PETS_CACHE/images/s3.tar" "$VERSITYGW_VERSION ${BASE_ROOTFS_TAR##*/}" \
    fill_s3 --entrypoint "$S3_BIN_IN_IMAGE" --user 65532:65532 --workdir /tmp
  log "s3: done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------ MLflow tracking server
# The full `mlflow` from PyPI (mlflow-requirements.txt): `pip download` of wheels for the base's Python
# (3.11, bookworm's glibc 2.36) into $PETS_CACHE/wheelhouse/mlflow, then `pip install --target` of them
# into the base's /opt/mlflow, run as `python3 -m mlflow server` with PYTHONPATH there. No Docker.
MLFLOW_REQUIREMENTS="$HERE/mlflow-requirements.txt"
MLFLOW_VERSION="$(sed -n 's/^mlflow==//p' "$MLFLOW_REQUIREMENTS")"
MLFLOW_IMAGE="localhost/pets-training/mlflow:$MLFLOW_VERSION"
MLFLOW_SITE=/opt/mlflow
# What the tracking server never imports, left out: the model flavours' and data libraries (pyarrow,
# scipy, scikit-learn, matplotlib and theirs), 440 of the 826 MB that pip installs (mlflow 3.17.2). It
# needs pandas and numpy (its search and metric code imports them). tests/e2e/test_tracking.py runs it.
MLFLOW_UNUSED=(pyarrow scipy scipy.libs sklearn scikit_learn scikit_learn.libs matplotlib contourpy
  fontTools fonttools kiwisolver skops PIL pillow pillow.libs)

# A Python with pip for the host side: the repo's venv, else the host's.
mlflow_pip() {
  local py
  for py in "$REPO_DIR/.venv/bin/python" python3; do
    if "$py" -m pip --version >/dev/null 2>&1; then "$py" -m pip --disable-pip-version-check "$@"; return; fi
  done
  die "mlflow: no Python with pip to fill the wheelhouse (make install creates .venv)"
}

# pip's target: the base's CPython 3.11 on glibc 2.36 (image/build.sh's platform_args, for wheels only).
mlflow_platform() {
  local glibc args=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311)
  for ((glibc = 36; glibc >= 17; glibc--)); do args+=(--platform "manylinux_2_${glibc}_$(uname -m)"); done
  echo "${args[@]}" --platform "manylinux2014_$(uname -m)" --platform any
}

mlflow_wheels() {
  local dir="$PETS_CACHE/wheelhouse/mlflow" key
  key="$(cat "$MLFLOW_REQUIREMENTS" <(mlflow_platform) | sha256sum | cut -c1-16)"
  if [[ -f $dir/.complete && $(cat "$dir/.complete") == "$key" ]]; then echo "$dir"; return 0; fi
  rm -rf "$dir.new" && mkdir -p "$dir.new"
  log "mlflow: pip download $MLFLOW_VERSION and its dependencies into $dir"
  # shellcheck disable=SC2046
  mlflow_pip download --progress-bar off --dest "$dir.new" $(mlflow_platform) -r "$MLFLOW_REQUIREMENTS" \
    >"$dir.new/pip.log" 2>&1 || die "mlflow: pip download failed; its log: $dir.new/pip.log"
  echo "$key" >"$dir.new/.complete"
  rm -rf "$dir" && mv "$dir.new" "$dir"
  echo "$dir"
}

fill_mlflow() {
  local site="$1$MLFLOW_SITE" name
  fill_base "$1"
  # shellcheck disable=SC2046
  mlflow_pip install --no-index --find-links "$MLFLOW_WHEELS" --target "$site" $(mlflow_platform) \
    -r "$MLFLOW_REQUIREMENTS" >"$PETS_CACHE/mlflow-pip-install.log" 2>&1 ||
    die "mlflow: pip install --target failed; its log: $PETS_CACHE/mlflow-pip-install.log"
  for name in "${MLFLOW_UNUSED[@]}"; do rm -rf "${site:?}/$name" "$site/$name"-*.dist-info; done
  rm -rf "${site:?}/bin"  # console scripts with the host's interpreter in their #!: the image runs -m
}

build_mlflow() {
  local t0=$SECONDS
  find_base_rootfs
  MLFLOW_WHEELS="$(mlflow_wheels)"
  oci_image "$MLFLOW_IMAGE" "$PETS_CACHE/images/mlflow.tar" \
    "$(sha256sum <"$MLFLOW_REQUIREMENTS" | cut -c1-12) ${MLFLOW_UNUSED[*]} ${BASE_ROOTFS_TAR##*/}" \
    fill_mlflow --entrypoint /usr/bin/python3 --env "PYTHONPATH=$MLFLOW_SITE" --env HOME=/tmp \
    --user 65532:65532 --workdir /tmp
  log "mlflow: done in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------ Prometheus server
# Upstream's Prometheus server (module github.com/prometheus/prometheus v0.301.0 = Prometheus 3.1.0,
# Apache-2.0), built from the Go module proxy through the wrapper module prometheus/ (go.mod says why),
# not Debian's `prometheus` package: Debian removed its Kubernetes service discovery in 1.5.0 (its
# NEWS.Debian: "due to the insane amount of dependencies in their client library"; its 2.42 refuses
# kubernetes_sd_configs), and the add-on finds the operator and the trainers through that discovery, as
# the chart's ServiceMonitor and PodMonitor tell a Prometheus to. Debian's promtool still checks and tests
# the rules (tests/unit/chart). The web UI's assets are not built (npm): the server and its API are whole.
# -> $PETS_BIN/prometheus -> image $PROMETHEUS_IMAGE (/usr/local/bin/prometheus)
PROMETHEUS_MODULE="$HERE/prometheus"
PROMETHEUS_VERSION=3.1.0  # the release of the module version prometheus/go.mod requires
PROMETHEUS_IMAGE="localhost/pets-training/prometheus:$PROMETHEUS_VERSION"
PROMETHEUS_BIN_IN_IMAGE=/usr/local/bin/prometheus

fill_prometheus() {
  fill_base "$1"
  install -D -m 0755 "$PETS_BIN/prometheus" "$1$PROMETHEUS_BIN_IN_IMAGE"
}

# A cold build compiles about 820 packages (every service discovery's SDK: AWS, Azure, GCE...).
build_prometheus_binary() {
  local key t0=$SECONDS v=github.com/prometheus/common/version
  key="$PROMETHEUS_VERSION $(cat "$PROMETHEUS_MODULE/go.mod" "$PROMETHEUS_MODULE/go.sum" | sha256sum | cut -c1-12)"
  is_cached prometheus "$key" && { log "prometheus $PROMETHEUS_VERSION: cached"; return 0; }
  log "prometheus $PROMETHEUS_VERSION: building (go build in $PROMETHEUS_MODULE; a cold build takes minutes)"
  (cd "$PROMETHEUS_MODULE" && go_progress prometheus build -trimpath \
    -ldflags "-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=pets-training -X $v.Revision=module" \
    -o "$PETS_BIN/.prometheus.tmp" github.com/prometheus/prometheus/cmd/prometheus)
  mv "$PETS_BIN/.prometheus.tmp" "$PETS_BIN/prometheus"
  mark_cached prometheus "$key"
  log "prometheus $PROMETHEUS_VERSION: built in $((SECONDS - t0)) s"
}

build_prometheus() {
  local t0=$SECONDS
  build_prometheus_binary
  find_base_rootfs
  oci_image "$PROMETHEUS_IMAGE" "$PETS_CACHE/images/prometheus.tar" \
    "$(cat "$PETS_BIN/.prometheus.version") ${BASE_ROOTFS_TAR##*/}" \
    fill_prometheus --entrypoint "$PROMETHEUS_BIN_IN_IMAGE" --user 65532:65532 --workdir /prometheus
  log "prometheus: done in $((SECONDS - t0)) s"
}
