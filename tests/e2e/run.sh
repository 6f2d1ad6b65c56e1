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
# Kueue before any test: its webhooks take every Job and pod of the cluster, and refuse them until its
# controller answers (about 30 s). Installed by its module's fixture mid-suite, that window refused the
# Jobs of a test running beside it (CI, 2026-11-27). The fixture's own addon-up then finds it up.
tests/cluster/cluster.sh addon-up kueue >/dev/null
log "Kueue up in $((SECONDS - t0)) s"
t0=$SECONDS
# The longest modules first (after the smoke checks), so the two workers below end close together:
# test_backends_and_queues.py (about 670 s alone on the 2-core CI machine; it installs the real
# training-operator and Kueue, cluster.sh addon-up), test_training.py (500 s), then the rest.
# The watching modules start their add-ons themselves: MLflow, Prometheus (docs/watching.md).
suites=(tests/e2e/test_cluster_smoke.py tests/e2e/test_backends_and_queues.py tests/e2e/test_training.py
  tests/e2e/test_client_e2e.py tests/e2e/test_dataset_sources.py tests/e2e/test_tracking.py
  tests/e2e/test_hostile_pods.py tests/e2e/test_output_claim.py tests/e2e/test_dashboard.py
  tests/e2e/test_tensorboard.py)
# Training across nodes, a node lost and a resize need two nodes that take pods (make cluster-up NODES=3).
workers=$(kubectl get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' |
  grep -cv 'node-role.kubernetes.io/control-plane' || true)
# A cluster asked for with NODES=3 (as CI does) that came up short fails the run: it would hide node loss
# and spreading. Only a person who asked for a smaller cluster gets the suite skipped.
requested=$(cat "$PETS_STATE/nodes-requested" 2>/dev/null || echo 1)
if ((workers >= 2)); then
  suites+=(tests/e2e/test_several_nodes.py tests/e2e/test_resize.py)
elif ((requested >= 3)) || [[ ${CI:-} == true ]]; then
  die "the cluster has $workers worker node(s) but tests/e2e/test_several_nodes.py and test_resize.py need 2, and it was asked for with NODES=$requested${CI:+ (CI=$CI)}: kubectl get nodes"
else
  log "NOT running tests/e2e/test_several_nodes.py and test_resize.py: this cluster was asked for with NODES=$requested ($workers worker(s)); they need 2 workers (make cluster-up NODES=3)"
fi
# NetworkPolicy's own module, last: on a cluster brought up with POLICY=0 it starts an enforcer on every
# node for its duration (make cluster-up starts them otherwise, and the whole suite runs policed), and
# the other worker's trainings then keep training: their own policies let their own traffic through.
suites+=(tests/e2e/test_network_policy.py)
# tee-sys: what the tests print (the numbers they measure: the operator's peak memory beside hostile pods,
# a lost node's restart time) shows in the log as they run, and pytest still reports it with a failure;
# -rP: with pytest-xdist, whose workers' output does not stream, it shows at the end.
# --durations=0: every test's time at the end, so a slow CI run says where its time went.
#
# Two at a time (PETS_E2E_WORKERS, pytest-xdist): much of a test's time is waiting (a pod's start, the
# operator's 10 s progress poll, a Job's backoff), not training. Each module runs whole in one worker
# (--dist loadfile), in the order above: a module's own fixtures (the add-ons and their queues, the S3
# server, the hostile image, the smoke image) are made once and its tests keep their order. Not
# loadgroup: pytest 9.2 broke its grouping (pytest-xdist#1386), and it spread one module's tests over
# both workers. The tests that disrupt every training on the cluster (marked cluster_wide: a node lost,
# the operator deleted) run after, alone.
e2e_workers=${PETS_E2E_WORKERS:-2}
[[ $e2e_workers =~ ^[0-9]+$ ]] || die "PETS_E2E_WORKERS=$e2e_workers: give a number of pytest-xdist workers (0 or 1: one test at a time)"
pytest_flags=(--capture=tee-sys --durations=0)
pytest_e2e() {
  # pytest's exit status 5 is "no test selected": a -k that picks tests of one part only.
  local rc=0
  .venv/bin/pytest "${pytest_flags[@]}" "$@" || rc=$?
  ((rc == 0 || rc == 5)) || exit "$rc"
  return "$rc"
}
if ((e2e_workers <= 1)); then
  .venv/bin/pytest "${pytest_flags[@]}" -m e2e "${suites[@]}" "$@"
else
  together=0 alone=0
  pytest_e2e -m "e2e and not cluster_wide" -n "$e2e_workers" --dist loadfile --no-loadscope-reorder -rP "${suites[@]}" "$@" || together=$?
  log "the tests that run beside others passed in $((SECONDS - t0)) s, $e2e_workers at a time; now those that run alone"
  pytest_e2e -m "e2e and cluster_wide" "${suites[@]}" "$@" || alone=$?
  ((together == 0 || alone == 0)) || die "no e2e test selected (pytest arguments: $*)"
fi
log "e2e suite passed in $((SECONDS - t0)) s"
