#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A Kubernetes cluster of one or more nodes to run the e2e suite on.
#
# usage: cluster.sh up|down|status [local|kind]          (default: local)
#        cluster.sh node-lose|node-start NODE             a node of the local cluster lost / back (below)
#        cluster.sh addon-up|addon-down kubeflow|kueue|s3|mlflow|prometheus
#                                                         the real training-operator / Kueue, an
#                                                         S3 server (versitygw), an MLflow tracking
#                                                         server, a Prometheus server (addons.sh)
#        cluster.sh netpol-up|netpol-down NODE            the NetworkPolicy enforcer of a node of the
#                                                         local cluster (netpol.sh; build.sh netpol first)
#
# local: the control plane of control-plane.sh (etcd, kube-apiserver, kube-controller-manager)
#        plus PETS_NODES nodes on this machine, each with its own containerd + runc, CNI bridge,
#        kubelet (cgroupfs driver) and kube-proxy (iptables); kube-scheduler and CoreDNS (a pod) once.
#        The first node runs in the host's network namespace; every further node in a network
#        namespace of its own, linked to the host by a veth pair, with its pod subnet routed
#        (docs/cluster.md "Several nodes"). Needs root and no network beyond the package
#        registries: every binary and image is built here (build.sh).
# kind:  `kind create cluster` with a kind CLI built from the Go module proxy; needs Docker and a
#        registry to pull kind's node image (not available on the machine this was written on).
#
# Environment (all optional; control-plane.sh lists its own):
#   PETS_STATE           state directory                                  [/tmp/pets-training-cluster]
#   PETS_NODES           how many nodes; with 2 or more the first is a     [1]
#                        tainted control-plane node (make cluster-up NODES=3: 1 control plane, 2 workers)
#   PETS_NODE_NAME       the first node's name; node N>1 is NAME-N        [pets-node]
#   PETS_NODE_IP         the first node's address                         [source address of the default route]
#   PETS_POD_CIDR        pod network; node N serves the N-th /24 of it    [10.88.0.0/16]
#   PETS_LINK_CIDR       veth links of nodes 2..N: 10.87.N.1 (host) - .2  [10.87.0.0/16]
#   PETS_SERVICE_CIDR    service network                                  [10.96.0.0/12]
#   PETS_CONTAINERD_ROOT containerd's image store, kept across up/down    [$PETS_CACHE/containerd; node N: ...-NAME-N]
#   PETS_KIND_NAME       kind cluster name                                [pets-training]
#   PETS_KIND_IMAGE      kind node image                                  [kind's default for its version]
#   PETS_ADDONS          add-ons `up` installs at the end: "kubeflow kueue s3 mlflow prometheus" (make cluster-up KUBEFLOW=1 ... PROMETHEUS=1)
#   PETS_NETPOL          1: NetworkPolicy enforced on every node of the    [1]
#                        local cluster (netpol.sh); 0: not (make cluster-up POLICY=0)
# Kubeconfig: $PETS_STATE/kubeconfig (local) or $PETS_STATE/kind-kubeconfig (kind).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=cluster
# shellcheck source=lib.sh
source "$HERE/lib.sh"

NODE_NAME="${PETS_NODE_NAME:-pets-node}"
NODES="${PETS_NODES:-1}"
POD_CIDR="${PETS_POD_CIDR:-10.88.0.0/16}"
LINK_CIDR="${PETS_LINK_CIDR:-10.87.0.0/16}"
SERVICE_CIDR="${PETS_SERVICE_CIDR:-10.96.0.0/12}"
FIRST_CONTAINERD_ROOT="${PETS_CONTAINERD_ROOT:-$PETS_CACHE/containerd}"
CNI_BIN_DIR="${PETS_CNI_BIN_DIR:-/usr/lib/cni}"
BRIDGE=pets0
RULE_COMMENT="pets-training-cluster"
KIND_NAME="${PETS_KIND_NAME:-pets-training}"
# sysctls the node needs; their previous values are saved at up and restored at down.
SYSCTLS=(net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1)
NODE_COMPONENTS=(kube-proxy kubelet containerd)
NETPOL="${PETS_NETPOL-1}"
[[ "$NETPOL" == [01] ]] || { echo "PETS_NETPOL (make cluster-up POLICY=) must be 0 or 1 (got '$NETPOL')" >&2; exit 1; }
[[ "$NODES" =~ ^[1-9][0-9]?$ ]] || { echo "PETS_NODES must be a number from 1 to 99 (got '$NODES')" >&2; exit 1; }

node_ip() {
  if [[ -n "${PETS_NODE_IP:-}" ]]; then echo "$PETS_NODE_IP"; return; fi
  ip -4 route get 192.0.2.255 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }'
}

# The n-th address of a CIDR (1 = the `kubernetes` Service, 10 = cluster DNS).
nth_ip() { python3 -c 'import ipaddress, sys; print(ipaddress.ip_network(sys.argv[1])[int(sys.argv[2])])' "$1" "$2"; }
# The n-th /24 of a CIDR, counting from 0.
nth_subnet() {
  python3 -c 'import ipaddress, sys; print(list(ipaddress.ip_network(sys.argv[1]).subnets(new_prefix=24))[int(sys.argv[2])])' "$1" "$2"
}

# ------------------------------------------------------------------ nodes
# select_node N: point the per-node variables at node N (1..NODES). Node 1 keeps the paths of the
# single-node cluster; node N>1 lives under $PETS_STATE/nodes/NAME and in network namespace NAME.
select_node() {
  local n="$1"
  NODE_INDEX="$n"
  NODE_SUBNET="$(nth_subnet "$POD_CIDR" $((n - 1)))"
  if ((n == 1)); then
    NODE="$NODE_NAME" NODE_STATE="$PETS_STATE" SUFFIX="" NETNS="" IN_NODE=()
    CONTAINERD_ROOT="$FIRST_CONTAINERD_ROOT"
    NODE_ADDR="$(node_ip)" CGROUP_ROOT="/"
  else
    NODE="$NODE_NAME-$n" NODE_STATE="$PETS_STATE/nodes/$NODE_NAME-$n" SUFFIX="-$NODE_NAME-$n"
    NETNS="$NODE" IN_NODE=(nsenter "--net=/run/netns/$NODE")
    CONTAINERD_ROOT="$FIRST_CONTAINERD_ROOT-$NODE"
    NODE_ADDR="$(nth_ip "$(nth_subnet "$LINK_CIDR" "$n")" 2)" CGROUP_ROOT="/$NODE"
  fi
  CONTAINERD_DIR="$NODE_STATE/containerd"
  CONTAINERD_SOCK="$CONTAINERD_DIR/containerd.sock"
  CNI_DIR="$NODE_STATE/cni"
  KUBELET_DIR="$NODE_STATE/kubelet"
}

# select_node_named NAME: select_node for a node's name (pets-node, pets-node-2, ...).
select_node_named() {
  local n
  for n in $(node_numbers); do
    select_node "$n"
    [[ "$NODE" == "$1" ]] && return 0
  done
  die "no node named '$1' in this cluster (nodes: $(for n in $(node_numbers); do select_node "$n"; printf '%s ' "$NODE"; done))"
}

# The numbers of the nodes this cluster has: 1, and every node N>1 whose state directory exists
# (so `down` and `status` find them whatever PETS_NODES says now).
node_numbers() {
  local d
  echo 1
  for d in "$PETS_STATE/nodes/$NODE_NAME"-*; do
    [[ -d "$d" ]] && echo "${d##*-}"
  done | sort -n
}

ctr_() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
kubectl_() { KUBECONFIG="$KUBECONFIG_ADMIN" kubectl "$@"; }

# ------------------------------------------------------------------ host preparation
set_sysctls() {
  local kv key saved="$PETS_STATE/sysctl.saved"
  [[ -f "$saved" ]] || for kv in "${SYSCTLS[@]}"; do
    key="${kv%%=*}"
    echo "$key=$(sysctl -n "$key")" >>"$saved"
  done
  for kv in "${SYSCTLS[@]}"; do sysctl -q -w "$kv"; done
}

restore_sysctls() {
  local saved="$PETS_STATE/sysctl.saved" kv
  [[ -f "$saved" ]] || return 0
  while read -r kv; do sysctl -q -w "$kv" || true; done <"$saved"
  rm -f "$saved"
}

# Docker (if running) sets the FORWARD policy to DROP; pod traffic is accepted explicitly.
add_forward_rules() {
  local dir
  for dir in -s -d; do
    iptables -C FORWARD "$dir" "$POD_CIDR" -m comment --comment "$RULE_COMMENT" -j ACCEPT 2>/dev/null ||
      iptables -I FORWARD 1 "$dir" "$POD_CIDR" -m comment --comment "$RULE_COMMENT" -j ACCEPT
  done
}

# Pods reach other pods (on any node) by their own addresses; only traffic leaving the pod
# network is masqueraded, in the selected node's network namespace.
add_masquerade_rule() {
  local rule=(POSTROUTING -s "$POD_CIDR" ! -d "$POD_CIDR" -m comment --comment "$RULE_COMMENT" -j MASQUERADE)
  "${IN_NODE[@]}" iptables -t nat -C "${rule[@]}" 2>/dev/null || "${IN_NODE[@]}" iptables -t nat -A "${rule[@]}"
}

# Node N>1: its network namespace, a veth pair to the host (10.87.N.1 here, 10.87.N.2 there),
# its pod subnet routed to it, and the sysctls a node needs, set inside the namespace.
make_node_netns() {
  local link host_if="pets-veth$NODE_INDEX" host_addr kv
  link="$(nth_subnet "$LINK_CIDR" "$NODE_INDEX")"
  host_addr="$(nth_ip "$link" 1)"
  [[ -e "/run/netns/$NETNS" ]] || ip netns add "$NETNS"
  if ! ip link show "$host_if" >/dev/null 2>&1; then
    ip link add "$host_if" type veth peer name eth0 netns "$NETNS"
    ip addr add "$host_addr/24" dev "$host_if"
    ip link set "$host_if" up
    ip netns exec "$NETNS" ip addr add "$NODE_ADDR/24" dev eth0
    ip netns exec "$NETNS" ip link set eth0 up
    ip netns exec "$NETNS" ip link set lo up
    ip netns exec "$NETNS" ip route add default via "$host_addr"
  fi
  ip link set "$host_if" up  # (down while the node is lost)
  ip route replace "$NODE_SUBNET" via "$NODE_ADDR" dev "$host_if"
  for kv in "${SYSCTLS[@]}"; do "${IN_NODE[@]}" sysctl -q -w "$kv"; done
}

# The node's cgroup root (kubelet's cgroupRoot must exist): a directory in every v1 hierarchy,
# cpuset's filled from its parent as cgroup v1 requires.
make_node_cgroup() {
  local d
  [[ "$CGROUP_ROOT" == / ]] && return 0
  for d in /sys/fs/cgroup/*/; do
    [[ -f "$d/cgroup.procs" && "$d" != */unified/ ]] || continue
    mkdir -p "$d${CGROUP_ROOT#/}"
    if [[ -f "$d/cpuset.cpus" ]]; then
      cat "$d/cpuset.cpus" >"$d${CGROUP_ROOT#/}/cpuset.cpus"
      cat "$d/cpuset.mems" >"$d${CGROUP_ROOT#/}/cpuset.mems"
    fi
  done
}

# Swap: kubelet is told not to fail on it (failSwapOn: false, swapBehavior NoSwap), so
# nothing on the host is changed.

# ------------------------------------------------------------------ components
node_pki() {
  local kubelet_cert="kubelet$SUFFIX"
  [[ -f "$PKI/$kubelet_cert.crt" && -f "$PKI/kube-proxy.crt" ]] && return 0
  (
    cd "$PKI"
    umask 077
    make_cert "$kubelet_cert" "/O=system:nodes/CN=system:node:$NODE" "clientAuth"
    [[ -f kube-proxy.crt ]] || make_cert kube-proxy "/CN=system:kube-proxy" "clientAuth"
  )
}

# A kubeconfig for a component of the selected node: nodes in their own network namespace reach
# the API server at the first node's address (in its serving certificate) instead of 127.0.0.1.
node_kubeconfig() {
  local file="$NODE_STATE/$1.kubeconfig"
  mkdir -p "$NODE_STATE"
  write_kubeconfig "$file" "$2"
  [[ -z "$NETNS" ]] || sed -i "s#server: https://127.0.0.1:#server: https://$(node_ip):#" "$file"
  echo "$file"
}

# "true" when this process lacks CAP_SYS_RESOURCE (bit 24 of CapEff).
restrict_oom() {
  local capeff
  capeff="$(awk '/^CapEff:/ { print $2 }' /proc/self/status)"
  if (( (16#$capeff >> 24) & 1 )); then echo false; else echo true; fi
}

start_containerd() {
  pid_alive "containerd$SUFFIX" && return 0
  mkdir -p "$CONTAINERD_DIR" "$CONTAINERD_ROOT" "$CNI_DIR/net.d"
  cat >"$CONTAINERD_DIR/config.toml" <<EOF
version = 2
root = "$CONTAINERD_ROOT"
state = "$CONTAINERD_DIR/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_DIR/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CONTAINERD_DIR/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Without CAP_SYS_RESOURCE (true in some VMs and containers) runc cannot lower oom_score_adj
  # (-998 for sandboxes); keep pods' scores at or above containerd's own instead.
  restrict_oom_score_adj = $(restrict_oom)
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's own state, per node: several containerds share this machine.
        Root = "$CONTAINERD_DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_DIR/net.d"
EOF
  cat >"$CNI_DIR/net.d/10-pets.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pets",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$NODE_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$CNI_DIR/ipam"
      }
    }
  ]
}
EOF
  start_daemon "containerd$SUFFIX" "$LOGS/containerd$SUFFIX.log" \
    "${IN_NODE[@]}" containerd --config "$CONTAINERD_DIR/config.toml"
  wait_for "containerd$SUFFIX" 60 ctr_ version ||
    { tail -20 "$LOGS/containerd$SUFFIX.log" >&2; die "containerd of $NODE did not start"; }
}

import_image() {
  # import_image ARCHIVE: load an OCI/docker archive into the node's image store (k8s.io namespace).
  ctr_ images import "$1" >/dev/null
}

host_resolv_conf() {
  if grep -q '^nameserver 127\.' /etc/resolv.conf 2>/dev/null && [[ -f /run/systemd/resolve/resolv.conf ]]; then
    echo /run/systemd/resolve/resolv.conf
  else
    echo /etc/resolv.conf
  fi
}

start_kubelet() {
  pid_alive "kubelet$SUFFIX" && return 0
  local dns_ip kubeconfig
  dns_ip="$(nth_ip "$SERVICE_CIDR" 10)"
  mkdir -p "$KUBELET_DIR"
  kubeconfig="$(node_kubeconfig kubelet "kubelet$SUFFIX")"
  make_node_cgroup
  cat >"$KUBELET_DIR/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
# Each node's pods under a cgroup of their own (several kubelets share this machine's hierarchy).
cgroupRoot: "$CGROUP_ROOT"
containerRuntimeEndpoint: "unix://$CONTAINERD_SOCK"
clusterDomain: cluster.local
clusterDNS: ["$dns_ip"]
# Upstream DNS for CoreDNS and hostNetwork pods; systemd-resolved's stub (127.0.0.53) would loop.
resolvConf: "$(host_resolv_conf)"
failSwapOn: false
memorySwap: {swapBehavior: NoSwap}
# The disk is shared with builds and images: no eviction or image GC by disk use (kind's settings: a
# threshold of 0% is none). At 1% a nearly full disk made the kubelet delete the imported pause image,
# which no registry can give back, and every later pod on that node failed to start.
evictionHard: {memory.available: "200Mi", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Images are imported, never pulled: start pods without waiting on pulls one after the other.
serializeImagePulls: false
registerNode: true
maxPods: 110
# Container logs under the state dir (kubelet still links them from /var/log/containers).
podLogsDir: "$NODE_STATE/pod-logs"
EOF
  local exe
  exe="$(bin kubelet)"
  start_daemon "kubelet$SUFFIX" "$LOGS/kubelet$SUFFIX.log" "${IN_NODE[@]}" "$exe" \
    --config "$KUBELET_DIR/config.yaml" --kubeconfig "$kubeconfig" \
    --root-dir "$KUBELET_DIR/root" --cert-dir "$KUBELET_DIR/pki" \
    --hostname-override "$NODE" --node-ip "$NODE_ADDR" \
    --pod-infra-container-image "$PAUSE_IMAGE" --v 1
}

start_scheduler() {
  pid_alive kube-scheduler && return 0
  write_kubeconfig "$PETS_STATE/kube-scheduler.kubeconfig" kube-scheduler
  local exe
  exe="$(bin kube-scheduler)"
  start_daemon kube-scheduler "$LOGS/kube-scheduler.log" "$exe" \
    --kubeconfig "$PETS_STATE/kube-scheduler.kubeconfig" --secure-port 0 --leader-elect=false
}

start_kube_proxy() {
  pid_alive "kube-proxy$SUFFIX" && return 0
  local kubeconfig
  kubeconfig="$(node_kubeconfig kube-proxy kube-proxy)"
  cat >"$NODE_STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$kubeconfig"}
mode: iptables
clusterCIDR: "$POD_CIDR"
hostnameOverride: "$NODE"
# Leave the host's conntrack table sizes alone.
conntrack: {maxPerCore: 0}
metricsBindAddress: "127.0.0.1:10249"
healthzBindAddress: "127.0.0.1:10256"
EOF
  local exe
  exe="$(bin kube-proxy)"
  start_daemon "kube-proxy$SUFFIX" "$LOGS/kube-proxy$SUFFIX.log" "${IN_NODE[@]}" "$exe" \
    --config "$NODE_STATE/kube-proxy.yaml"
}

apply_coredns() {
  local dns_ip
  dns_ip="$(nth_ip "$SERVICE_CIDR" 10)"
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "pets-training:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "pets-training:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "pets-training:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            # Short TTL (also the negative TTL): a rank's name that did not exist yet when a
            # peer first asked must resolve within seconds once the pod is there.
            ttl 5
        }
        forward . /etc/resolv.conf
        cache 30
        loop
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      # On the control-plane node where there is one (a worker lost must not take DNS with it).
      tolerations: [{key: node-role.kubernetes.io/control-plane, effect: NoSchedule}]
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: Exists}]}
      dnsPolicy: Default
      containers:
      - name: coredns
        image: "$COREDNS_IMAGE"
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, initialDelaySeconds: 10}
        resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 170Mi}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
      - {name: config, configMap: {name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: "$dns_ip"
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

node_ready() {
  [[ "$(kubectl_ get node "$NODE" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# up_node N: node N's runtime, kubelet and kube-proxy, with the cluster's own images; waits for Ready.
up_node() {
  select_node "$1"
  node_pki
  if [[ -n "$NETNS" ]]; then make_node_netns; fi
  add_masquerade_rule
  start_containerd
  # The cluster's own images (small), on every node: the storage helper pods may run anywhere.
  local archive
  for archive in pause coredns smoke local-path-provisioner; do import_image "$PETS_CACHE/images/$archive.tar"; done
  start_kubelet
  start_kube_proxy
}

# With several nodes, the first is the control-plane node, as in kind and kubeadm clusters: labelled
# and tainted so that pods run on the workers (nodes 2..N), which alone get the big images
# (load-image.sh reads the marker). CoreDNS tolerates the taint, as kubeadm's does.
dedicate_control_plane_node() {
  select_node 1
  kubectl_ label node "$NODE" node-role.kubernetes.io/control-plane= --overwrite >/dev/null
  kubectl_ taint node "$NODE" node-role.kubernetes.io/control-plane:NoSchedule --overwrite >/dev/null
  echo "$NODE" >"$PETS_STATE/control-plane-node"
  log "$NODE is the control-plane node (tainted NoSchedule); pods run on the $((NODES - 1)) worker(s)"
}

wait_node_ready() {
  select_node "$1"
  wait_for "node $NODE Ready (log: $LOGS/kubelet$SUFFIX.log)" 180 node_ready ||
    { tail -20 "$LOGS/kubelet$SUFFIX.log" >&2; die "node $NODE did not become Ready"; }
}

up_local() {
  local t0=$SECONDS t ip n
  [[ $EUID -eq 0 ]] || die "the local node needs root (containerd, kubelet, iptables)"
  ip="$(node_ip)"
  [[ -n "$ip" ]] || die "cannot tell the node's IP (no default route): set PETS_NODE_IP"
  t=$SECONDS; "$HERE/build.sh" control-plane node smoke-image local-path $([[ $NETPOL == 0 ]] || echo netpol); log "phase build: $((SECONDS - t)) s"
  mkdir -p "$PETS_STATE" "$LOGS"
  # A state directory of an earlier cluster with more nodes than asked for now would leave them running.
  (( $(node_numbers | tail -n 1) <= NODES )) ||
    die "$PETS_STATE holds a cluster of $(node_numbers | wc -l) nodes; take it down first (make cluster-down)"
  for ((n = 2; n <= NODES; n++)); do mkdir -p "$PETS_STATE/nodes/$NODE_NAME-$n"; done
  # What was asked for, so the e2e suite can tell a cluster that came up short (run.sh).
  echo "$NODES" >"$PETS_STATE/nodes-requested"
  t=$SECONDS
  # Pods reach the API server through the `kubernetes` Service, which points at the node's IP.
  PETS_APISERVER_BIND=0.0.0.0 PETS_ADVERTISE_IP="$ip" PETS_POD_CIDR="$POD_CIDR" \
    PETS_SERVICE_CIDR="$SERVICE_CIDR" "$HERE/control-plane.sh" up
  log "phase control plane: $((SECONDS - t)) s"
  t=$SECONDS
  set_sysctls
  # containerd bind-mounts /run/netns on itself for pod network namespaces; note whether it was
  # already a mount point, so that `down` removes only a mount that `up` caused.
  [[ -f "$PETS_STATE/netns-was-mounted" ]] || { findmnt -rn /run/netns >/dev/null && echo yes || echo no; } \
    >"$PETS_STATE/netns-was-mounted"
  add_forward_rules
  start_scheduler
  for ((n = 1; n <= NODES; n++)); do up_node "$n"; done
  for ((n = 1; n <= NODES; n++)); do wait_node_ready "$n"; done
  ((NODES == 1)) || dedicate_control_plane_node
  log "phase nodes ($NODES): $((SECONDS - t)) s"
  if [[ $NETPOL == 1 ]]; then
    # Before any pod of ours starts, so every pod a NetworkPolicy selects is policed from its first packet.
    # The kernel is probed once (netpol_enforcer), and node-start reads the choice back.
    t=$SECONDS
    netpol_enforcer >"$PETS_STATE/netpol-enforcer"
    export PETS_NETPOL_ENFORCER; PETS_NETPOL_ENFORCER=$(cat "$PETS_STATE/netpol-enforcer")
    for ((n = 1; n <= NODES; n++)); do select_node "$n"; netpol_up "$NODE"; done
    log "phase NetworkPolicy enforcer ($PETS_NETPOL_ENFORCER, on $NODES node(s)): $((SECONDS - t)) s"
  else
    rm -f "$PETS_STATE/netpol-enforcer"
  fi
  t=$SECONDS
  apply_coredns
  kubectl_ -n kube-system rollout status deployment/coredns --timeout=180s >&2 ||
    { kubectl_ -n kube-system describe pods -l k8s-app=kube-dns >&2; die "CoreDNS did not become ready"; }
  log "phase CoreDNS: $((SECONDS - t)) s"
  t=$SECONDS
  "$HERE/storage.sh" up
  log "phase storage (StorageClass pets-shared on ${PETS_SHARED_DIR:-$PETS_STATE/shared}): $((SECONDS - t)) s"
  log "cluster up in $((SECONDS - t0)) s: $NODES node(s) ($(kubectl_ get nodes -o name | tr '\n' ' ')), KUBECONFIG=$KUBECONFIG_ADMIN"
}

# ------------------------------------------------------------------ a node lost, and back
# node-lose NODE: what "node lost" means in this harness, for a node N>1, in the order of a power cut:
# its link goes down first (the node and its pods drop off the network: peers see no FIN or RST,
# only silence), then its kubelet, kube-proxy, containerd and shims get SIGKILL (so nothing reports
# to the API server), then every process in its pod cgroups (the trainers die mid-step). The node
# controller marks the Node Ready=Unknown once its kubelet has been silent for
# node-monitor-grace-period (50 s).
lose_node() {
  select_node_named "$1"
  [[ -n "$NETNS" ]] || die "$NODE runs the cluster's control plane and scheduler: lose a node other than the first"
  local d pid round
  ip link set "pets-veth$NODE_INDEX" down
  for d in kubelet kube-proxy containerd "$KUBE_ROUTER_NAME" "$NETPOL_NAME"; do
    pid_alive "$d$SUFFIX" && kill -KILL "$(cat "$PETS_STATE/pids/$d$SUFFIX.pid")" 2>/dev/null
    rm -f "$PETS_STATE/pids/$d$SUFFIX.pid"
  done
  kill_node_shims
  for round in 1 2 3; do  # processes forked while the first were being killed
    while read -r d; do
      while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$d"
    done < <(find "/sys/fs/cgroup/memory$CGROUP_ROOT" -name cgroup.procs 2>/dev/null)
    [[ $round -lt 3 ]] && sleep 0.5
  done
  log "node $NODE lost: off the network, its kubelet, kube-proxy, containerd, NetworkPolicy enforcer and pods' processes killed (the API server was not told)"
}

# node-start NODE: a lost node back: its link up, its containerd, kubelet and kube-proxy started, and
# its NetworkPolicy enforcer where the cluster has one; waits for Ready.
start_node() {
  select_node_named "$1"
  up_node "$NODE_INDEX"
  wait_node_ready "$NODE_INDEX"
  if [[ -s "$PETS_STATE/netpol-enforcer" ]]; then PETS_NETPOL_ENFORCER=$(cat "$PETS_STATE/netpol-enforcer") netpol_up "$NODE"; fi
  log "node $NODE is back"
}

# ------------------------------------------------------------------ teardown
# Rules that jump to chains kubelet, kube-proxy or CNI made, then those chains, in every table.
sweep_iptables() {
  local cmd table rule chain
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle; do
      while read -r rule; do
        # shellcheck disable=SC2086  # the rule is a list of iptables words
        eval "$cmd -t $table ${rule/#-A/-D}" 2>/dev/null || true
      done < <("$cmd-save" -t "$table" 2>/dev/null |
        grep -E "^-A [A-Z]+ .*(-j (KUBE-|CNI-)|--comment \"?$RULE_COMMENT)" || true)
      while read -r chain; do "$cmd" -t "$table" -F "$chain" 2>/dev/null || true; done < <(
        "$cmd-save" -t "$table" 2>/dev/null | awk '/^:(KUBE-|CNI-)/ { print substr($1, 2) }')
      while read -r chain; do "$cmd" -t "$table" -X "$chain" 2>/dev/null || true; done < <(
        "$cmd-save" -t "$table" 2>/dev/null | awk '/^:(KUBE-|CNI-)/ { print substr($1, 2) }')
    done
  done
}

# mounts_under PREFIX...: the mount points that start with any PREFIX, deepest first.
mounts_under() {
  findmnt -rn -o TARGET | awk -v list="$(printf '%s\n' "$@")" \
    'BEGIN { n = split(list, p, "\n") } { for (i = 1; i <= n; i++) if (p[i] != "" && index($0, p[i]) == 1) { print; next } }' |
    sort -r
}

unmount_under() {
  local m
  while read -r m; do
    [[ -n "$m" ]] && { umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
  done < <(mounts_under "$@")
}

our_mounts() { mounts_under "$PETS_STATE/" "$FIRST_CONTAINERD_ROOT"; }

# Shims of the selected node's containerd (their command line names its socket): SIGKILL.
kill_node_shims() {
  local shim
  for shim in $(pgrep -f "containerd-shim.*$CONTAINERD_SOCK" || true); do kill -KILL "$shim" 2>/dev/null || true; done
}

leftovers() {
  local found=0 p n
  for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    pid_alive "$p" && { echo "process: $p"; found=1; }
  done
  for n in $(node_numbers); do
    select_node "$n"
    for p in "${NODE_COMPONENTS[@]}"; do
      pid_alive "$p$SUFFIX" && { echo "process: $p$SUFFIX"; found=1; }
    done
    if pgrep -f "containerd-shim.*$CONTAINERD_SOCK" >/dev/null; then echo "process: containerd-shim of $NODE"; found=1; fi
    if [[ -n "$NETNS" && -e "/run/netns/$NETNS" ]]; then echo "network namespace: $NETNS"; found=1; fi
  done
  if [[ -n "$(our_mounts)" ]]; then our_mounts | sed 's/^/mount: /'; found=1; fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then echo "network device: $BRIDGE"; found=1; fi
  if ip -o link show | grep -q ' pets-veth'; then echo "network device: pets-veth*"; found=1; fi
  # A pod's veth left behind would sit on no bridge (docker's veths are on docker0/br-*).
  if ip -o link show type veth | grep -v ' pets-veth' | grep -qv ' master '; then echo "network device: a veth on no bridge"; found=1; fi
  if iptables-save 2>/dev/null | grep -qE "KUBE-|CNI-|$RULE_COMMENT"; then
    echo "iptables: rules or chains of KUBE-/CNI-/$RULE_COMMENT"; found=1
  fi
  return "$found"
}

# down_node N: stop node N's pods (through its CRI, so CNI frees addresses), kubelet, kube-proxy and
# containerd; a lost node's containerd is started again for that first, so nothing is left behind.
down_node() {
  local d
  select_node "$1"
  if [[ -S "$CONTAINERD_SOCK" || -d "$CONTAINERD_DIR" ]] && ! pid_alive "containerd$SUFFIX" && [[ -n "$NETNS" ]] &&
     [[ -e "/run/netns/$NETNS" ]]; then
    (start_containerd) || true  # (a subshell: its `die` must not end the teardown)
  fi
  if [[ -S "$CONTAINERD_SOCK" ]] && pid_alive "containerd$SUFFIX"; then
    stop_daemon "kubelet$SUFFIX"
    # Stop and remove every pod sandbox through the CRI: containers stop, CNI DEL frees each pod's
    # address, veth and iptables rules, and its network namespace goes away.
    "$PETS_BIN/pets-cri" -endpoint "unix://$CONTAINERD_SOCK" remove-all >&2 ||
      log "some pod sandboxes of $NODE could not be removed; sweeping below"
  fi
  (netpol_down_if_running) || log "the NetworkPolicy enforcer of $NODE did not stop cleanly"
  stop_daemon "kube-proxy$SUFFIX"
  if [[ -x "$PETS_BIN/kube-proxy" ]]; then "${IN_NODE[@]}" "$PETS_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  stop_daemon "kubelet$SUFFIX"
  stop_daemon "containerd$SUFFIX"
  kill_node_shims  # of tasks the CRI could not stop
  if [[ -n "$NETNS" ]]; then
    ip netns delete "$NETNS" 2>/dev/null || true  # its bridge, veths, routes and iptables go with it
    ip link delete "pets-veth$NODE_INDEX" 2>/dev/null || true
    ip route delete "$NODE_SUBNET" 2>/dev/null || true
    # The node's pod cgroups, then its cgroup root.
    find /sys/fs/cgroup -mindepth 2 -depth -type d -path "*${CGROUP_ROOT}/*" -exec rmdir {} + 2>/dev/null || true
    for d in /sys/fs/cgroup/*"$CGROUP_ROOT"; do [[ -d "$d" ]] && rmdir "$d" 2>/dev/null; done
  fi
  # kubelet's links to container logs (the path is fixed) that point into the node's pod-logs dir.
  find /var/log/containers -maxdepth 1 -type l -lname "$NODE_STATE/pod-logs/*" -delete 2>/dev/null || true
  unmount_under "$NODE_STATE/" "$CONTAINERD_ROOT/"
  rm -rf "$KUBELET_DIR" "$CONTAINERD_DIR" "$CNI_DIR" "$NODE_STATE/pod-logs"
  [[ -z "$NETNS" ]] || rm -rf "$NODE_STATE"
}

down_local() {
  local t0=$SECONDS m n
  for n in $(node_numbers | sort -rn); do down_node "$n"; done
  select_node 1
  stop_daemon kube-scheduler
  "$HERE/control-plane.sh" down
  unmount_under "$PETS_STATE/" "$FIRST_CONTAINERD_ROOT"
  # Network namespaces containerd made for pods ("cni-<uuid>") that are still there.
  for m in $(ip netns list 2>/dev/null | awk '/^cni-/ { print $1 }'); do ip netns delete "$m" 2>/dev/null || true; done
  if [[ "$(cat "$PETS_STATE/netns-was-mounted" 2>/dev/null)" == no ]] && findmnt -rn /run/netns >/dev/null &&
     [[ -z "$(ls -A /run/netns)" ]]; then
    umount /run/netns || true
  fi
  rm -f "$PETS_STATE/netns-was-mounted"
  ip link delete "$BRIDGE" 2>/dev/null || true
  sweep_iptables
  restore_sysctls
  # The pod cgroups kubelet made (cgroupfs driver: /sys/fs/cgroup/<controller>/kubepods...).
  find /sys/fs/cgroup -mindepth 2 -depth -type d -path '*/kubepods*' -exec rmdir {} + 2>/dev/null || true
  rm -rf "$PETS_STATE/addons" "$PETS_STATE/nodes" "$PETS_STATE/control-plane-node" "$PETS_STATE/nodes-requested" \
    "$PETS_STATE/netpol-enforcer"
  if leftovers >&2; then
    log "down in $((SECONDS - t0)) s: nothing left behind (logs kept in $LOGS)"
  else
    die "down in $((SECONDS - t0)) s but the above was left behind"
  fi
}

status_local() {
  local c rc=0 n
  for n in $(node_numbers); do
    select_node "$n"
    for c in "${NODE_COMPONENTS[@]}" $(cat "$PETS_STATE/netpol-enforcer" 2>/dev/null); do
      if pid_alive "$c$SUFFIX"; then echo "$NODE $c: running (pid $(cat "$PETS_STATE/pids/$c$SUFFIX.pid"))"
      else echo "$NODE $c: stopped"; rc=1; fi
    done
  done
  if pid_alive kube-scheduler; then echo "kube-scheduler: running"; else echo "kube-scheduler: stopped"; rc=1; fi
  "$HERE/control-plane.sh" status || rc=1
  kubectl_ get nodes -o wide 2>/dev/null || true
  return "$rc"
}

# ------------------------------------------------------------------ kind (kind.sh; cannot run on this sandbox)
kind_bin() { "$HERE/build.sh" kind >&2; echo "$PETS_BIN/kind"; }

up_kind() {
  # kind's nodes are privileged containers: say at once, with the runtime's own error, when they
  # cannot start here (kind.sh preflight), instead of failing minutes into `kind create cluster`.
  "$HERE/kind.sh" preflight || exit 1
  local kind image
  kind="$(kind_bin)"
  # The node image built offline (kind.sh node-image) when there is one; else kind's published default.
  image="${PETS_KIND_IMAGE:-$("$HERE/kind.sh" image 2>/dev/null || true)}"
  mkdir -p "$PETS_STATE"
  if "$kind" get clusters | grep -qx "$KIND_NAME"; then
    log "kind cluster $KIND_NAME already exists"
  else
    "$kind" create cluster --name "$KIND_NAME" --wait 5m ${image:+--image "$image"}
  fi
  "$kind" get kubeconfig --name "$KIND_NAME" >"$PETS_STATE/kind-kubeconfig"
  "$HERE/build.sh" control-plane >&2   # helm
  log "kind cluster $KIND_NAME up: KUBECONFIG=$PETS_STATE/kind-kubeconfig"
}

down_kind() {
  local kind
  kind="$(kind_bin)"
  "$kind" delete cluster --name "$KIND_NAME"
  rm -f "$PETS_STATE/kind-kubeconfig"
}

up_addons() {
  local a
  for a in ${PETS_ADDONS:-}; do "$HERE/addons.sh" up "$a"; done
}

# The NetworkPolicy enforcer, per node: `up` starts it on every node unless PETS_NETPOL=0.
# shellcheck source=netpol.sh
source "$HERE/netpol.sh"

action="${1:-}"
case "$action" in
  addon-up | addon-down) exec "$HERE/addons.sh" "${action#addon-}" "${2:-}" ;;
  netpol-up) netpol_up "${2:?netpol-up needs a node name}"; exit ;;
  netpol-down) netpol_down "${2:?netpol-down needs a node name}"; exit ;;
  node-lose) lose_node "${2:?node-lose needs a node name}"; exit ;;
  node-start) start_node "${2:?node-start needs a node name}"; exit ;;
  # The control plane's processes of the local cluster (its environment is read from their command lines).
  crash) exec "$HERE/control-plane.sh" crash "${2:?crash needs etcd, kube-apiserver or kube-controller-manager}" ;;
esac
flavour="${2:-local}"
case "$action:$flavour" in
  up:local) up_local; up_addons ;;
  down:local) down_local ;;
  status:local) status_local ;;
  up:kind) up_kind; PETS_CLUSTER=kind up_addons ;;
  down:kind) down_kind ;;
  status:kind) "$(kind_bin)" get nodes --name "$KIND_NAME" ;;
  *) die "usage: $0 up|down|status [local|kind] | node-lose|node-start NODE | crash COMPONENT | netpol-up|netpol-down NODE | addon-up|addon-down kubeflow|kueue|s3|mlflow|prometheus (got '${action}' '${flavour}')" ;;
esac
