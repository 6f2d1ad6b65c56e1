#!/usr/bin/env bash
# Print the path of the real Kubeflow PyTorchJob CRD (kubeflow.org_pytorchjobs.yaml), taken at test
# time from the kubeflow training-operator Go module through the Go module proxy (cached in the Go
# module cache; nothing is committed to this repository).
#
# usage: pytorchjob-crd.sh            -> prints the path; kubectl apply --server-side -f "$(...)"
#   TRAINING_OPERATOR_VERSION (default v1.8.1, the last release of that module path)
set -euo pipefail

version="${TRAINING_OPERATOR_VERSION:-v1.8.1}"
module="github.com/kubeflow/training-operator@$version"
dir="$(cd "${TMPDIR:-/tmp}" && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod \
  go mod download -json "$module" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')" \
  || { echo "pytorchjob-crd.sh: go mod download $module failed" >&2; exit 1; }
crd="$dir/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
[[ -f "$crd" ]] || { echo "pytorchjob-crd.sh: $crd not found in $module" >&2; exit 1; }
echo "$crd"
