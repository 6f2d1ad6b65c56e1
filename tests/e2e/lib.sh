# shellcheck shell=bash
# Shared by run.sh, demo.sh and bench.sh: where the cluster is, and how images reach its node.

E2E_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PETS_STATE=${PETS_STATE:-/tmp/pets-training-cluster}
export PETS_CACHE=${PETS_CACHE:-$HOME/.cache/pets-training}
# kubectl and helm at the cluster's version (tests/cluster/build.sh) before any other.
export PATH="$PETS_CACHE/bin:$PATH"
# pets_contract.__version__, the one source of the version (its __init__ imports nothing)
VERSION=$(PYTHONPATH="$E2E_ROOT/src" python3 -c 'import pets_contract; print(pets_contract.__version__)')
export VERSION

die() { printf '[%s] error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# use_cluster local|kind: export KUBECONFIG and PETS_CLUSTER for that kind of cluster.
use_cluster() {
  export PETS_CLUSTER=$1
  case "$1" in
    local) export KUBECONFIG=${KUBECONFIG:-$PETS_STATE/kubeconfig} ;;
    kind) export KUBECONFIG=${KUBECONFIG:-$PETS_STATE/kind-kubeconfig} ;;
    *) die "CLUSTER must be local or kind, got '$1'" ;;
  esac
}

require_cluster() {
  kubectl get nodes >/dev/null 2>&1 \
    || die "no cluster answers with KUBECONFIG=$KUBECONFIG: start one with 'make cluster-up CLUSTER=$PETS_CLUSTER'"
}

# load_images: put the operator and trainer images (built by image/build.sh) into the node.
load_images() {
  local image
  # The operator onto every node (the e2e suite may place it on a control-plane node, as platform
  # teams do with system components); the trainer, 6 GB, only where trainers run.
  "$E2E_ROOT/tests/cluster/load-image.sh" --all-nodes "pets-training/operator:$VERSION"
  # test_hostile_pods' image, left by a run killed before its teardown: it holds an older trainer's
  # layers (12 GB a node), and the import below needs that room.
  "$E2E_ROOT/tests/cluster/load-image.sh" --remove "pets-training/hostile:$VERSION"
  "$E2E_ROOT/tests/cluster/load-image.sh" "pets-training/trainer:$VERSION"
}
