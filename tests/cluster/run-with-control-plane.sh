#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Run a command against a fresh, private control plane (etcd + kube-apiserver +
# kube-controller-manager), then tear it down whatever the command did.
#
# usage: run-with-control-plane.sh CMD [ARGS...]
#
# Builds the binaries if they are not cached, brings the control plane up, exports KUBECONFIG and
# a PATH that starts with $PETS_CACHE/bin (helm, kube-*), runs CMD, always brings it down, and exits
# with CMD's exit code. Each run gets a new state directory of its own under the state root
# ($PETS_STATE/control-plane.XXXXXX) and free ports, so it never touches a cluster that is already
# running (cluster.sh's in $PETS_STATE itself, or another run's); PETS_CONTROL_PLANE_STATE names a
# directory to use instead. KCM_CONTROLLERS passes through (e.g. "*,-job" to drive Job status from the test).
# The private state directory (logs, certs) is removed after a successful run and kept after a
# failed one (its path is printed); PETS_KEEP_STATE=1 keeps it always.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=run-with-control-plane
caller_state="${PETS_CONTROL_PLANE_STATE:-}"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

[[ $# -gt 0 ]] || die "usage: $0 CMD [ARGS...]"

free_port_pair() {
  # A free port p with p+1 free too (etcd client + peer), drawn at random below the kernel's
  # ephemeral range (32768+), where outgoing connections take their source ports.
  python3 - <<'EOF'
import random, socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
for _ in range(200):
    port = random.randrange(20000, 32000, 2)
    if free(port) and free(port + 1):
        print(port)
        break
else:
    raise SystemExit("no free pair of ports found in 20000-32000")
EOF
}

pick_ports() {
  PETS_APISERVER_PORT="$(free_port_pair)"
  PETS_ETCD_PORT="$(free_port_pair)"
  export PETS_APISERVER_PORT PETS_ETCD_PORT
}

private_state=0
if [[ -z "$caller_state" ]]; then
  mkdir -p "$PETS_STATE"
  PETS_STATE="$(mktemp -d "$PETS_STATE/control-plane.XXXXXX")"
  private_state=1
  [[ -n "${PETS_APISERVER_PORT:-}" && -n "${PETS_ETCD_PORT:-}" ]] || pick_ports
else
  PETS_STATE="$(realpath -m "$caller_state")"
fi
export PETS_STATE

t0=$SECONDS
"$HERE/build.sh" control-plane
log "phase build: $((SECONDS - t0)) s"

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
  local t=$SECONDS
  "$HERE/control-plane.sh" down || log "control-plane down failed (state: $PETS_STATE)"
  log "phase down: $((SECONDS - t)) s"
  if [[ $private_state == 1 && $rc == 0 && -z "${PETS_KEEP_STATE:-}" ]]; then
    rm -rf "$PETS_STATE"
  else
    log "state kept in $PETS_STATE"
  fi
}
rc=1
trap cleanup EXIT
# A signal ends the script through `exit`, so the EXIT trap brings the control plane down.
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS
# A port picked as free can be taken by someone else before our server binds it; on a private
# control plane that case is retried with new ports.
for attempt in 1 2 3; do
  "$HERE/control-plane.sh" up && break
  if [[ $private_state == 1 && $attempt -lt 3 ]] && grep -qs 'address already in use' "$PETS_STATE"/logs/*.log; then
    log "a port was taken meanwhile; retrying with new ports"
    "$HERE/control-plane.sh" down
    rm -rf "$PETS_STATE/logs"
    pick_ports
    continue
  fi
  exit 1
done
log "phase up: $((SECONDS - t0)) s"

export KUBECONFIG="$PETS_STATE/kubeconfig"
export PATH="$PETS_BIN:$PATH"
t0=$SECONDS
rc=0
# Run CMD in the background and wait for it, so that INT/TERM sent to this script are handled at
# once (passed on to CMD) and the EXIT trap still brings the control plane down: nothing leaks.
"$@" <&0 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM
while :; do
  wait "$child" && rc=0 || rc=$?
  kill -0 "$child" 2>/dev/null || break
done
log "phase command: $((SECONDS - t0)) s, exit code $rc"
exit "$rc"
