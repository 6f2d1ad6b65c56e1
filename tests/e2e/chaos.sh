#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# make chaos: on the running cluster (NODES=3), a batch of trainings while the operator, the API server,
# etcd, a trainer pod and a worker node fail on a seeded schedule (tests/e2e/test_chaos.py).
#
#   tests/e2e/chaos.sh [local|kind] [pytest args...]     PETS_CHAOS_MODE=short|full  PETS_CHAOS_SEED=N
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
use_cluster "${1:-local}"
shift || true
require_cluster
log() { printf '[chaos] %s\n' "$*" >&2; }

t0=$SECONDS
image/build.sh all >/dev/null
load_images
tests/cluster/cluster.sh addon-up kueue >/dev/null
log "images loaded and Kueue up in $((SECONDS - t0)) s; mode ${PETS_CHAOS_MODE:=full}, seed ${PETS_CHAOS_SEED:=1}"
export PETS_CHAOS_MODE PETS_CHAOS_SEED
.venv/bin/pytest --capture=tee-sys --durations=0 -m chaos tests/e2e/test_chaos.py "$@"
