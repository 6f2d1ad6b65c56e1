#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# make e2e: on the running cluster, build (cached) and load the images, then run the e2e suite:
# the cluster smoke checks first, then the chart, the operator and the trainer end to end.
#
#   tests/e2e/run.sh [local|kind] [pytest args...]
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
use_cluster "${1:-local}"
shift || true
require_cluster

log() { printf '[e2e] %s\n' "$*" >&2; }
t0=$SECONDS
image/build.sh all
log "images built in $((SECONDS - t0)) s"
t0=$SECONDS
load_images
log "images loaded into the node in $((SECONDS - t0)) s"
t0=$SECONDS
suites=(tests/e2e/test_cluster_smoke.py tests/e2e/test_training.py tests/e2e/test_client_e2e.py tests/e2e/test_dataset_sources.py
  tests/e2e/test_hostile_pods.py tests/e2e/test_output_claim.py tests/e2e/test_backends_and_queues.py)
# Training across nodes and a node lost need two nodes that take pods (make cluster-up NODES=3).
workers=$(kubectl get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' |
  grep -cv 'node-role.kubernetes.io/control-plane' || true)
# A cluster asked for with NODES=3 (as CI does) that came up short fails the run: it would hide node loss
# and spreading. Only a person who asked for a smaller cluster gets the suite skipped.
requested=$(cat "$PETS_STATE/nodes-requested" 2>/dev/null || echo 1)
if ((workers >= 2)); then
  suites+=(tests/e2e/test_several_nodes.py)
elif ((requested >= 3)) || [[ ${CI:-} == true ]]; then
  die "the cluster has $workers worker node(s) but tests/e2e/test_several_nodes.py needs 2, and it was asked for with NODES=$requested${CI:+ (CI=$CI)}: kubectl get nodes"
else
  log "NOT running tests/e2e/test_several_nodes.py: this cluster was asked for with NODES=$requested ($workers worker(s)); it needs 2 workers (make cluster-up NODES=3)"
fi
# NetworkPolicy's own module, last: on a cluster brought up with POLICY=0 it starts an enforcer on every
# node for its duration (make cluster-up starts them otherwise, and the whole suite runs policed).
suites+=(tests/e2e/test_network_policy.py)
# test_backends_and_queues.py installs the real training-operator and Kueue (cluster.sh addon-up).
# tee-sys: what the tests print (the numbers they measure: the operator's peak memory beside hostile pods,
# a lost node's restart time) shows in the log as they run, and pytest still reports it with a failure.
# --durations=0: every test's time at the end, so a slow CI run says where its time went.
.venv/bin/pytest -m e2e --capture=tee-sys --durations=0 "${suites[@]}" "$@"
log "e2e suite passed in $((SECONDS - t0)) s"
