# Shared settings and helpers for the scripts in tests/cluster (sourced, not run).
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Expensive, reusable things (Go builds, binaries, images) live here.
PETS_CACHE="${PETS_CACHE:-$HOME/.cache/pets-training}"
PETS_BIN="$PETS_CACHE/bin"
# Our binaries (kubectl at the server's version, helm) come first.
PATH="$PETS_BIN:$PATH"
# Runtime state of a control plane / cluster: data, certs, logs, pids, kubeconfig.
# (absolute and clean: kubelet insists on that for paths under it)
PETS_STATE="$(realpath -m "${PETS_STATE:-/tmp/pets-training-cluster}")"
# The sandbox image, built locally by build.sh (there is no registry to pull one from).
PAUSE_IMAGE="localhost/pets-training/pause:3.10"
COREDNS_VERSION="${COREDNS_VERSION:-v1.13.1}"
COREDNS_IMAGE="localhost/pets-training/coredns:$COREDNS_VERSION"
SMOKE_IMAGE="localhost/pets-training/smoke:bookworm"
# Optional add-ons (addons.sh): the real Kubeflow training-operator and Kueue, built here.
TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.8.1}"
KUBEFLOW_IMAGE="localhost/pets-training/training-operator:$TRAINING_OPERATOR_VERSION"
KUEUE_VERSION=v0.19.2 # the version of the prebuilt fallback in $PETS_KUEUE_DIR
KUEUE_IMAGE="localhost/pets-training/kueue:$KUEUE_VERSION"
# Prebuilt Kueue (binary + rendered manifests), beside the repository: $REPO/../shared/kueue.
KUEUE_DIR="$(realpath -m "${PETS_KUEUE_DIR:-$CLUSTER_DIR/../../../shared/kueue}")"
export PETS_CACHE PETS_STATE
PKI="$PETS_STATE/pki"
LOGS="$PETS_STATE/logs"
KUBECONFIG_ADMIN="$PETS_STATE/kubeconfig"
APISERVER_PORT="${PETS_APISERVER_PORT:-6443}"

log() { printf '[%s %s] %s\n' "$(date -u +%H:%M:%S)" "${LOG_TAG:-cluster}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The Kubernetes version the wrapper module pins (tests/cluster/k8s/go.mod).
k8s_version() {
  awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$CLUSTER_DIR/k8s/go.mod"
}

# Where the k8s.io/kubernetes module sits in the module cache (downloaded if needed).
k8s_module_dir() {
  (cd "$CLUSTER_DIR/k8s" && GOTOOLCHAIN=local GOWORK=off go list -m -f '{{.Dir}}' k8s.io/kubernetes)
}

# nft_queue_works [PREFIX...]: the kernel takes nftables' `queue` statement (CONFIG_NFT_QUEUE), which
# every rule of kube-network-policies ends in. Probed with a rule in a chain no hook reaches, in a
# scratch table removed at once; PREFIX runs nft elsewhere (a node's `nsenter --net=...`).
nft_queue_works() {
  command -v nft >/dev/null || return 1
  "$@" nft -f - >/dev/null 2>&1 <<EOF
add table inet pets-nft-queue-probe
add chain inet pets-nft-queue-probe probe
add rule inet pets-nft-queue-probe probe queue num 100 bypass
delete table inet pets-nft-queue-probe
EOF
}

# netpol_enforcer: the NetworkPolicy enforcer of the local cluster (netpol.sh), PETS_NETPOL_ENFORCER:
# kube-network-policies (SIG Network's, what issue 24 asked for) where the kernel has nft_queue, and
# kube-router's policy controller (iptables and ipset) where it does not, as on the 2-core sandbox.
netpol_enforcer() {
  case "${PETS_NETPOL_ENFORCER:-auto}" in
    kube-network-policies | kube-router) echo "$PETS_NETPOL_ENFORCER" ;;
    auto) if nft_queue_works; then echo kube-network-policies; else echo kube-router; fi ;;
    *) die "PETS_NETPOL_ENFORCER must be auto, kube-network-policies or kube-router (got '$PETS_NETPOL_ENFORCER')" ;;
  esac
}

# wait_for DESCRIPTION TIMEOUT_S COMMAND...: poll COMMAND once a second until it succeeds.
wait_for() {
  local what="$1" timeout="$2" deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 1
  done
}

# pid_alive NAME: the process recorded in $PETS_STATE/pids/NAME.pid is running.
pid_alive() {
  local f="$PETS_STATE/pids/$1.pid"
  [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

# start_daemon NAME LOGFILE COMMAND...: run COMMAND in the background (own session), record its pid.
start_daemon() {
  local name="$1" logfile="$2"
  shift 2
  mkdir -p "$PETS_STATE/pids" "$(dirname "$logfile")"
  printf '=== %s started %s: %s\n' "$name" "$(date -u +%FT%TZ)" "$*" >>"$logfile"
  setsid "$@" >>"$logfile" 2>&1 </dev/null &
  echo $! >"$PETS_STATE/pids/$name.pid"
}

# stop_daemon NAME: TERM the recorded process, wait up to 20 s, then KILL; forget the pid.
stop_daemon() {
  local name="$1" f pid i
  f="$PETS_STATE/pids/$name.pid"
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored TERM for 20 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

# bin NAME: the path of a cached binary, or a clear error saying how to build it.
bin() {
  [[ -x "$PETS_BIN/$1" ]] || die "$PETS_BIN/$1 is missing: run tests/cluster/build.sh"
  echo "$PETS_BIN/$1"
}

# make_cert NAME SUBJECT EXTENDED_KEY_USAGE [SANS]: NAME.key + NAME.crt signed by the CA (in $PWD; the CA is ca.crt/ca.key there).
make_cert() {
  local name="$1" subj="$2" eku="$3" sans="${4:-}" ext
  ext="$(mktemp)"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$sans" ]] && echo "subjectAltName=$sans"
  } >"$ext"
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$ext"
}

# write_kubeconfig FILE USER_CERT_NAME: a kubeconfig with everything embedded (portable).
# Every input is read before the file is written: a missing certificate stops the step (a base64 of
# a missing file inside the heredoc would only leave an empty field, and a component that then
# talks to the API server as system:anonymous).
write_kubeconfig() {
  local file="$1" user="$2" input ca cert key
  for input in "$PKI/ca.crt" "$PKI/$user.crt" "$PKI/$user.key"; do
    [[ -s "$input" ]] || die "cannot write $file: $input is missing (the PKI step must run before it)"
  done
  ca="$(base64 -w0 "$PKI/ca.crt")"
  cert="$(base64 -w0 "$PKI/$user.crt")"
  key="$(base64 -w0 "$PKI/$user.key")"
  (
    umask 077
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pets-training
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: $user
  user:
    client-certificate-data: $cert
    client-key-data: $key
contexts:
- name: pets-training
  context: {cluster: pets-training, user: $user}
current-context: pets-training
EOF
  )
}

