#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# make bench-e2e: with the images on the node, install the chart, then time apply -> pods Running
# and apply -> first training step, median of 5 (tests/e2e/bench.py).
#
#   tests/e2e/bench.sh [local|kind] [bench.py args...]
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
use_cluster "${1:-local}"
shift || true
require_cluster
"$PETS_CACHE/bin/helm" upgrade --install pets charts/pets-training --namespace pets-system \
  --create-namespace --wait --timeout 5m >/dev/null
exec .venv/bin/python tests/e2e/bench.py "$@"
