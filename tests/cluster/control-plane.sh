#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager,
# started from the binaries tests/cluster/build.sh caches. No node: pods are never run here.
#
# usage: control-plane.sh up|down|status|pki | crash etcd|kube-apiserver|kube-controller-manager
#
# Environment (all optional):
#   PETS_STATE            state directory (data, certs, logs, pids, kubeconfig)   [/tmp/pets-training-cluster]
#   PETS_CACHE            where build.sh put the binaries ($PETS_CACHE/bin)       [~/.cache/pets-training]
#   PETS_APISERVER_PORT   kube-apiserver's https port                             [6443]
#   PETS_ETCD_PORT        etcd client port; the peer port is this + 1             [2379]
#   PETS_APISERVER_BIND   address kube-apiserver listens on                       [127.0.0.1]
#   PETS_ADVERTISE_IP     address published in the `kubernetes` Service          [the bind address]
#   PETS_SERVICE_CIDR     service cluster IP range                                [10.96.0.0/12]
#   PETS_POD_CIDR         pod network (controller-manager's --cluster-cidr)        [10.88.0.0/16]
#   KCM_CONTROLLERS       kube-controller-manager --controllers                    [*]
#                         (integration tests may use "*,-job" and drive Job status themselves)
#   PETS_APISERVER_EXTRA_ARGS  more kube-apiserver flags, split on whitespace (e.g. audit logging) []
#   PETS_KCM_EXTRA_ARGS        more kube-controller-manager flags, split on whitespace            []
# The admin kubeconfig is written to $PETS_STATE/kubeconfig.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=control-plane
# shellcheck source=lib.sh
source "$HERE/lib.sh"

ETCD_PORT="${PETS_ETCD_PORT:-2379}"
ETCD_PEER_PORT="$((ETCD_PORT + 1))"
APISERVER_BIND="${PETS_APISERVER_BIND:-127.0.0.1}"
ADVERTISE_IP="${PETS_ADVERTISE_IP:-$APISERVER_BIND}"
SERVICE_CIDR="${PETS_SERVICE_CIDR:-10.96.0.0/12}"
POD_CIDR="${PETS_POD_CIDR:-10.88.0.0/16}"
KCM_CONTROLLERS="${KCM_CONTROLLERS:-*}"
SA_ISSUER="https://kubernetes.default.svc.cluster.local"

COMPONENTS=(etcd kube-apiserver kube-controller-manager)

# The first address of the service range: the `kubernetes` Service's cluster IP.
first_service_ip() {
  python3 -c 'import ipaddress, sys; print(ipaddress.ip_network(sys.argv[1])[1])' "$1"
}

# A CA, the apiserver's serving cert, client certs for each user, and the service-account keys.
make_pki() {
  if [[ -f "$PKI/ca.crt" && -f "$PKI/sa.key" && -f "$PKI/kube-scheduler.crt" && -f "$PKI/.sans" &&
        "$(cat "$PKI/.sans")" == "$(apiserver_sans)" ]]; then
    return 0
  fi
  log "certificates -> $PKI"
  rm -rf "$PKI"
  mkdir -p "$PKI"
  (
    cd "$PKI"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=pets-training-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    make_cert apiserver "/CN=kube-apiserver" "serverAuth" "$(apiserver_sans)"
    make_cert admin "/O=system:masters/CN=pets-admin" "clientAuth"
    make_cert kube-controller-manager "/CN=system:kube-controller-manager" "clientAuth"
    # The scheduler is a control-plane component: its certificate exists before any node's.
    make_cert kube-scheduler "/CN=system:kube-scheduler" "clientAuth"
    make_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "clientAuth"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    apiserver_sans >.sans
  )
}

apiserver_sans() {
  local ip
  ip="$(first_service_ip "$SERVICE_CIDR")"
  printf 'DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,'
  printf 'DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:%s,IP:%s' \
    "$ip" "$ADVERTISE_IP"
}

etcd_healthy() { curl -fsS "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }

apiserver_ready() {
  curl -fsS --cacert "$PKI/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz" | grep -qx ok
}

# A component that died while starting: show the end of its log, then fail.
check_alive() {
  pid_alive "$1" && return 0
  log "$1 exited; last lines of $LOGS/$1.log:"
  tail -n 25 "$LOGS/$1.log" >&2 || true
  return 1
}

wait_ready() {
  local name="$1" timeout="$2" check="$3" deadline=$((SECONDS + $2))
  until "$check" 2>/dev/null; do
    check_alive "$name" || die "$name failed to start"
    ((SECONDS < deadline)) || die "$name not ready after ${timeout}s (log: $LOGS/$name.log)"
    sleep 0.5
  done
}

start_etcd() {
  pid_alive etcd && return 0
  rm -rf "$PETS_STATE/etcd"
  local exe
  exe="$(bin etcd)"
  start_daemon etcd "$LOGS/etcd.log" "$exe" \
    --name pets --data-dir "$PETS_STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "pets=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes 4294967296
  wait_ready etcd 60 etcd_healthy
}

start_apiserver() {
  pid_alive kube-apiserver && return 0
  local exe extra=()
  exe="$(bin kube-apiserver)"
  read -ra extra <<<"${PETS_APISERVER_EXTRA_ARGS:-}"
  start_daemon kube-apiserver "$LOGS/kube-apiserver.log" "$exe" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$APISERVER_BIND" --advertise-address "$ADVERTISE_IP" \
    --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,ExternalIP,Hostname \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --service-account-issuer "$SA_ISSUER" \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --profiling=false "${extra[@]}"
  wait_ready kube-apiserver 120 apiserver_ready
}

start_controller_manager() {
  pid_alive kube-controller-manager && return 0
  write_kubeconfig "$PETS_STATE/kube-controller-manager.kubeconfig" kube-controller-manager
  # --secure-port 0: nothing to serve, and no port to clash with a second control plane.
  local exe extra=()
  exe="$(bin kube-controller-manager)"
  read -ra extra <<<"${PETS_KCM_EXTRA_ARGS:-}"
  start_daemon kube-controller-manager "$LOGS/kube-controller-manager.log" \
    "$exe" \
    --kubeconfig "$PETS_STATE/kube-controller-manager.kubeconfig" \
    --secure-port 0 --leader-elect=false \
    --controllers "$KCM_CONTROLLERS" \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" \
    --root-ca-file "$PKI/ca.crt" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$POD_CIDR" \
    --allocate-node-cidrs=false "${extra[@]}"
  # Ready enough when its controllers act: the serviceaccount controller creates "default" in
  # "default" (unless that controller was switched off, then only check that it stays up).
  if [[ ",$KCM_CONTROLLERS," == *",-serviceaccount,"* ]]; then
    check_alive kube-controller-manager || die "kube-controller-manager failed to start"
  else
    wait_ready kube-controller-manager 60 default_serviceaccount_exists
  fi
}

default_serviceaccount_exists() {
  KUBECONFIG="$KUBECONFIG_ADMIN" kubectl get serviceaccount default -n default -o name >/dev/null
}

up() {
  local t0=$SECONDS
  mkdir -p "$PETS_STATE" "$LOGS"
  make_pki
  write_kubeconfig "$KUBECONFIG_ADMIN" admin
  start_etcd
  start_apiserver
  start_controller_manager
  # Only the components are recorded here; a second `up` finds them alive and does nothing.
  log "up in $((SECONDS - t0)) s: https://127.0.0.1:$APISERVER_PORT, KUBECONFIG=$KUBECONFIG_ADMIN" \
      "(controllers: $KCM_CONTROLLERS)"
}

down() {
  local t0=$SECONDS i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_daemon "${COMPONENTS[i]}"
  done
  rm -rf "$PETS_STATE/etcd"
  log "down in $((SECONDS - t0)) s (logs kept in $LOGS)"
}

status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c"; then
      echo "$c: running (pid $(cat "$PETS_STATE/pids/$c.pid"))"
    else
      echo "$c: stopped"; rc=1
    fi
  done
  if apiserver_ready 2>/dev/null; then echo "readyz: ok"; else echo "readyz: not ready"; rc=1; fi
  echo "kubeconfig: $KUBECONFIG_ADMIN"
  return "$rc"
}

# crash NAME: a component's crash and restart, as a supervisor would do it: SIGKILL (no shutdown, no
# flush), then the same command line again, its data kept (`up` starts etcd on an empty directory;
# this does not). Returns once it serves again. `make chaos` (tests/e2e/faults.py) calls it.
crash() {
  local name="$1" check pid argv=()
  case "$name" in
    etcd) check=etcd_healthy ;;
    kube-apiserver) check=apiserver_ready ;;
    kube-controller-manager) check=true ;;
    *) die "crash: $name is not one of ${COMPONENTS[*]}" ;;
  esac
  pid_alive "$name" || die "crash: $name is not running (no live pid in $PETS_STATE/pids/$name.pid)"
  pid="$(cat "$PETS_STATE/pids/$name.pid")"
  mapfile -d '' -t argv <"/proc/$pid/cmdline"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  local t0=$SECONDS
  start_daemon "$name" "$LOGS/$name.log" "${argv[@]}"
  wait_ready "$name" 120 "$check"
  log "$name SIGKILLed (pid $pid), started again with its data, serving after $((SECONDS - t0)) s"
}

case "${1:-}" in
  pki) mkdir -p "$PETS_STATE"; make_pki ;;  # the certificates alone (tests/cluster/test_pki.py)
  up) up ;;
  down) down ;;
  status) status ;;
  crash) crash "${2:?crash needs a component: ${COMPONENTS[*]}}" ;;
  *) die "usage: $0 up|down|status|pki|crash NAME (got '${1:-}')" ;;
esac
