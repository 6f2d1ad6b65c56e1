#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The scale benchmark (docs/scale.md): a private control plane with the Job controller on and an audit
# log of the operator's requests, kube-scheduler, kwok simulating Nodes whose pods go Pending ->
# Running -> Succeeded/Failed by its stages (kwok-stages.yaml), then bench_scale.py. Everything is
# torn down afterwards, whatever happened.
#
# usage: tests/scale/run.sh [--count N] [bench_scale.py options...]     (make bench-scale COUNT=N)
#
# Environment (all optional):
#   PY                  the Python with the operator installed           [.venv/bin/python]
#   SCALE_KCM_QPS       kube-controller-manager and kube-scheduler client QPS (burst: twice) [200]
#   SCALE_KEEP=1        keep the scratch directory (audit log, configs) and the control plane's state
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
LOG_TAG=bench-scale
caller_state="${PETS_STATE:-}"
# shellcheck source=../cluster/lib.sh
source "$HERE/../cluster/lib.sh"

PY="${PY:-$REPO/.venv/bin/python}"
QPS="${SCALE_KCM_QPS:-200}"

# ---------------------------------------------------------------- inside the control plane
# Run by run-with-control-plane.sh (KUBECONFIG, PETS_STATE, PATH set): scheduler, kwok, benchmark.
inner() {
  local work="$SCALE_WORK" pid child rc
  # Only ever on the private control plane run-with-control-plane.sh made for this run: never on a
  # cluster that another script (cluster.sh's e2e cluster, another test run) owns.
  [[ "$PETS_STATE" == */control-plane.* && -n "${SCALE_PRIVATE_STATE:-}" ]] ||
    die "refusing to run on $PETS_STATE: not a private control plane of run-with-control-plane.sh"
  # shellcheck disable=SC2317  # called from the EXIT trap
  cleanup_inner() {
    stop_daemon kwok
    stop_daemon kube-scheduler
    rm -f "$SCALE_WORK/pids/kwok.pid" "$SCALE_WORK/pids/kube-scheduler.pid"  # stopped: nothing left to catch
  }
  trap cleanup_inner EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # Their own users, so the audit log and RBAC tell them apart from the admin.
  (
    cd "$PKI"
    [[ -f kube-scheduler.crt ]] || make_cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
    [[ -f kwok.crt ]] || make_cert kwok "/O=system:masters/CN=kwok" clientAuth
  )
  write_kubeconfig "$PETS_STATE/kube-scheduler.kubeconfig" kube-scheduler
  write_kubeconfig "$PETS_STATE/kwok.kubeconfig" kwok
  cat >"$work/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $PETS_STATE/kube-scheduler.kubeconfig
  qps: $QPS
  burst: $((QPS * 2))
leaderElection:
  leaderElect: false
EOF
  start_daemon kube-scheduler "$LOGS/kube-scheduler.log" "$(bin kube-scheduler)" \
    --config "$work/scheduler.yaml" --secure-port 0
  cp "$PETS_STATE/pids/kube-scheduler.pid" "$work/pids/"
  start_daemon kwok "$LOGS/kwok.log" "$(bin kwok)" \
    --kubeconfig "$PETS_STATE/kwok.kubeconfig" --config "$HERE/kwok-stages.yaml" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake
  cp "$PETS_STATE/pids/kwok.pid" "$work/pids/"
  sleep 3
  for pid in kube-scheduler kwok; do
    pid_alive "$pid" || { tail -n 30 "$LOGS/$pid.log" >&2; die "$pid exited (log: $LOGS/$pid.log)"; }
  done
  log "kube-scheduler and kwok ($("$PETS_BIN/kwok" --version)) running"

  # In the background, so that a TERM from run-with-control-plane.sh reaches the benchmark too.
  "$PY" "$HERE/bench_scale.py" --work "$work" --audit-log "$work/audit.log" "$@" &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM
  rc=0
  while :; do
    wait "$child" && rc=0 || rc=$?
    kill -0 "$child" 2>/dev/null || break
  done
  return "$rc"
}

if [[ "${1:-}" == __inner ]]; then
  shift
  inner "$@"
  exit $?
fi

# ---------------------------------------------------------------- outside: build, configure, run
# The benchmark always gets a private control plane on free ports: run-with-control-plane.sh makes it
# under the state root ($PETS_STATE/control-plane.XXXXXX: the caller's, as CI's, else lib.sh's default),
# beside whatever cluster runs there, unless PETS_CONTROL_PLANE_STATE names one, which is not wanted here.
[[ -z "$caller_state" ]] || export PETS_STATE="$caller_state"
unset PETS_CONTROL_PLANE_STATE PETS_APISERVER_PORT PETS_ETCD_PORT
export SCALE_PRIVATE_STATE=1
[[ -x "$PY" ]] || die "$PY not found: run \`make install\` (or set PY)"
t0=$SECONDS
"$REPO/tests/cluster/build.sh" control-plane
[[ -x "$PETS_BIN/kube-scheduler" && "$(cat "$PETS_BIN/.kube-scheduler.version" 2>/dev/null)" == "$(k8s_version)" ]] ||
  "$REPO/tests/cluster/build.sh" node
"$HERE/build.sh"
log "phase build: $((SECONDS - t0)) s"

SCALE_WORK="$(mktemp -d "${TMPDIR:-/tmp}/pets-scale.XXXXXX")"
export SCALE_WORK
mkdir -p "$SCALE_WORK/pids"

# Whatever happens, nothing started here outlives the run: run-with-control-plane.sh stops the control
# plane, inner() stops kube-scheduler and kwok, bench_scale.py stops the operator; this catches what a
# KILL left behind (only the processes recorded here, by pid).
# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
  local f pid
  for f in "$SCALE_WORK"/pids/*.pid; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    # Only if that pid still runs what was started under it (a pid can be reused by anything).
    if kill -0 "$pid" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$(basename "$f" .pid)"; then
      log "stopping leftover $(basename "$f" .pid) (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      sleep 2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [[ -n "${SCALE_KEEP:-}" ]]; then
    log "scratch kept in $SCALE_WORK"
  else
    rm -rf "$SCALE_WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The operator's requests, once each (when the response is complete; a watch when it ends), from the
# API server's audit log: apiserver_request_total has no per-client label. Only the service accounts
# of pets-system (the operator's, made by bench_scale.py from the chart's templates) are logged.
cat >"$SCALE_WORK/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:pets-system"]
- level: None
EOF
export PETS_APISERVER_EXTRA_ARGS="--audit-policy-file=$SCALE_WORK/audit-policy.yaml --audit-log-path=$SCALE_WORK/audit.log --audit-log-format=json --audit-log-maxsize=0 --audit-log-maxbackup=0"
# The Job controller and the scheduler at the default 20 QPS would make them, not the operator, the
# bottleneck (2000 pod creates at 20/s is 100 s); large clusters raise it too.
export PETS_KCM_EXTRA_ARGS="--kube-api-qps=$QPS --kube-api-burst=$((QPS * 2))"
export KCM_CONTROLLERS='*'
[[ -n "${SCALE_KEEP:-}" ]] && export PETS_KEEP_STATE=1

t0=$SECONDS
rc=0
"$REPO/tests/cluster/run-with-control-plane.sh" "$HERE/run.sh" __inner "$@" <&0 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM
while :; do
  wait "$child" && rc=0 || rc=$?
  kill -0 "$child" 2>/dev/null || break
done
log "phase benchmark (control plane up, run, down): $((SECONDS - t0)) s, exit code $rc"
exit "$rc"
