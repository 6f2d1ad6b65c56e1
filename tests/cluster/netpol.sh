# The NetworkPolicy enforcer (issue 24) on the local cluster: kube-network-policies, one per node
# (sourced by cluster.sh, after its node helpers: select_node_named, node_kubeconfig, kubectl_ and
# the per-node variables NODE, SUFFIX, NETNS, IN_NODE). Built by `build.sh netpol` (netpol-build.sh).
#
#   netpol_up NODE    start the enforcer of NODE; waits until its NFQUEUE is bound (informers synced,
#                     nftables rules written)
#   netpol_down NODE  stop it and remove its nftables table
#
# Host process, not upstream's hostNetwork DaemonSet (install.yaml), for these reasons:
#  - It is what this harness does with the node's other hostNetwork agent: kube-proxy is a
#    DaemonSet upstream too and a host process here (cluster.sh start_kube_proxy). The enforcer is
#    started the same way: start_daemon, in the node's network namespace (`nsenter --net` for nodes
#    2..N, the host's for node 1), pid in $PETS_STATE/pids and log in $LOGS with the node's suffix,
#    like kubelet$SUFFIX and kube-proxy$SUFFIX (in $LOGS rather than $NODE_STATE, which down_node
#    removes for nodes 2..N: the logs outlive the cluster).
#  - Upstream's manifest asks for `privileged: true` (install.yaml, securityContext), which cannot
#    start here: runc then wants every capability, and this sandbox lacks CAP_SYS_RESOURCE
#    (docs/cluster.md, the kind section). Without `privileged`, NET_ADMIN alone would do (nftables,
#    the NFQUEUE netlink socket and conntrack updates all check CAP_NET_ADMIN, which the sandbox
#    has), and a hostNetwork pod lands in the node's network namespace (the shim inherits
#    containerd's, which cluster.sh starts inside it). So a DaemonSet could run, but it would need
#    an image built and imported into every node (no registry), RBAC through a ServiceAccount, and
#    would come and go with the pods it polices (pets-cri remove-all on down, node-lose kills it
#    as one of the node's pods). Nothing of it would be tested that the host process does not test:
#    the enforcement is the same binary, the same flags, the same netfilter rules.
#  - NRI (containerd's pod-IP feed, install.yaml's /var/run/nri mount) is off: Debian's containerd
#    1.6 has no NRI v2 socket, and its path (/var/run/nri/nri.sock) is host-wide, so with several
#    containerds on one host each enforcer could talk to the wrong node's runtime. Pod IPs come
#    from the API server's pod informer only (upstream's fallback; a pod's first packets before its
#    IP reaches the informer are not policed: https://issues.k8s.io/85966).
#
# Several nodes on one host: the table (`inet kube-network-policies`, fixed in v1.1.1: no flag) and
# the queue number are per network namespace, and nodes 2..N each have their own, so they do not
# collide; node 1 shares the host's (and with it any other cluster's node 1 on this machine: give
# that one another PETS_NETPOL_QUEUE_ID; the table name cannot be changed).
# shellcheck shell=bash

NETPOL_NAME=kube-network-policies
NETPOL_TABLE=kube-network-policies  # pkg/dataplane/controller.go Defaults(); not a flag in v1.1.1
NETPOL_QUEUE_ID="${PETS_NETPOL_QUEUE_ID:-100}"  # upstream's default (install.yaml uses 98)
NETPOL_METRICS_PORT="${PETS_NETPOL_METRICS_PORT:-9080}"
# Fail-open (upstream's default): rules queue with `bypass`, so while no enforcer is bound to the
# queue (not started yet, crashed, killed) traffic passes unpoliced instead of being dropped. A test
# that expects a refusal therefore fails, rather than passes, when the enforcer is not running.
NETPOL_FAIL_OPEN="${PETS_NETPOL_FAIL_OPEN:-true}"

# An enforcer's identity: a client certificate system:NAME, bound to a ClusterRole of RULES (YAML).
netpol_identity() {
  local name="$1" rules="$2"
  if [[ ! -f "$PKI/$name.crt" ]]; then
    (
      cd "$PKI" || exit 1
      umask 077
      make_cert "$name" "/CN=system:$name" clientAuth
    )
  fi
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "pets-training:$name"}
rules:
$rules
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "pets-training:$name"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "pets-training:$name"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:$name"}
EOF
}

# What kube-network-policies reads: upstream's ClusterRole (install.yaml).
NETPOL_RULES='- apiGroups: [""]
  resources: [pods, namespaces]
  verbs: [list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch]'

# The selected node's network namespace has our queue bound: a line of /proc/net/netfilter/nfnetlink_queue
# (the reader's namespace's) starting with the queue number ("%5u %6u ...", net/netfilter/nfnetlink_queue.c).
netpol_queue_bound() {
  "${IN_NODE[@]}" grep -qE "^ *$NETPOL_QUEUE_ID " /proc/net/netfilter/nfnetlink_queue
}

# kube-network-policies sends a new connection's first packet to user space with nftables' `queue`
# statement (lib.sh nft_queue_works). Without the kernel's nft_queue every rule sync fails with
# "netlink receive: no such file or directory" and, fail-open, nothing is policed: the 2-core
# sandbox's kernel (6.18, firecracker) lacks it, while it has the iptables NFQUEUE target and
# nfnetlink_queue. There lib.sh netpol_enforcer picks kube-router (below).
netpol_kernel_queues() {
  command -v nft >/dev/null || { log "no nft here to check the kernel's nft_queue; starting anyway"; return 0; }
  nft_queue_works "${IN_NODE[@]}" ||
    die "kube-network-policies cannot enforce on this kernel ($(uname -r)): nftables' queue statement is refused; the kernel needs CONFIG_NFT_QUEUE (nft_queue), or PETS_NETPOL_ENFORCER=kube-router. See docs/cluster.md, NetworkPolicy enforcement"
}

netpol_up() {
  select_node_named "$1"
  [[ $(netpol_enforcer) == kube-router ]] && { kube_router_up; return; }
  local name="$NETPOL_NAME$SUFFIX" exe kubeconfig
  pid_alive "$name" && { log "$name: running"; return 0; }
  exe="$(bin "$NETPOL_NAME")"
  [[ -e /proc/net/netfilter/nfnetlink_queue ]] ||
    die "$name: this kernel has no nfnetlink_queue (/proc/net/netfilter/nfnetlink_queue); modprobe nfnetlink_queue"
  netpol_kernel_queues
  netpol_identity "$NETPOL_NAME" "$NETPOL_RULES"
  kubeconfig="$(node_kubeconfig "$NETPOL_NAME" "$NETPOL_NAME")"
  # --hostname-override: it polices the pods whose spec.nodeName is this (the kubelet's
  # --hostname-override). Metrics on loopback of the node's namespace, as kube-proxy's.
  start_daemon "$name" "$LOGS/$name.log" "${IN_NODE[@]}" "$exe" \
    --kubeconfig "$kubeconfig" --hostname-override "$NODE" \
    --nfqueue-id "$NETPOL_QUEUE_ID" --fail-open="$NETPOL_FAIL_OPEN" --disable-nri \
    --metrics-bind-address "127.0.0.1:$NETPOL_METRICS_PORT" --v 1
  wait_for "$name to bind NFQUEUE $NETPOL_QUEUE_ID (log: $LOGS/$name.log)" 60 netpol_queue_bound ||
    { tail -20 "$LOGS/$name.log" >&2; die "$name did not start"; }
  log "$name: enforcing NetworkPolicy for the pods of $NODE (queue $NETPOL_QUEUE_ID, fail-open=$NETPOL_FAIL_OPEN)"
}

netpol_down() {
  select_node_named "$1"
  if [[ $(netpol_enforcer) == kube-router ]]; then kube_router_down; else kube_network_policies_down; fi
}

# On `cluster.sh down`, for the selected node: an enforcer netpol-down never stopped (its test was
# killed) goes too, whichever it is, before the node's namespace does.
netpol_down_if_running() {
  if pid_alive "$KUBE_ROUTER_NAME$SUFFIX"; then kube_router_down; fi
  if pid_alive "$NETPOL_NAME$SUFFIX"; then kube_network_policies_down; fi
}

kube_network_policies_down() {
  local name="$NETPOL_NAME$SUFFIX"
  # TERM: it stops, waits its 5 s grace period (cmd/kube-network-policies/standard/main.go) and
  # exits; with fail-open it leaves its table in place (controller.go Shutdown), so remove it here.
  stop_daemon "$name"
  [[ -z "$NETNS" || -e "/run/netns/$NETNS" ]] || return 0  # the namespace, and the table, are gone
  if command -v nft >/dev/null; then
    if "${IN_NODE[@]}" nft list table inet "$NETPOL_TABLE" >/dev/null 2>&1; then
      "${IN_NODE[@]}" nft delete table inet "$NETPOL_TABLE"
    fi
  else
    log "$name: no nft here (Debian nftables) to remove table inet $NETPOL_TABLE; harmless while fail-open"
  fi
}

# kube-router (--run-firewall only: no routing, no service proxy, no CNI), where the kernel has no
# nft_queue. The same host process as above, in the node's network namespace. It matches a pod's
# packets in the node's FORWARD chain (the bridge's too: bridge-nf-call-iptables=1) against
# per-policy chains and ipsets of pod IPs, and drops what no policy allows, for the pods of its node
# (spec.nodeName == --hostname-override). Unlike kube-network-policies it is not fail-open: its rules
# stay while it is down, until kube_router_down removes them.
KUBE_ROUTER_NAME=kube-router

# What its policy controller reads (upstream's daemonset manifests' ClusterRole, less what routing,
# the service proxy and the load balancer allocator need).
KUBE_ROUTER_RULES='- apiGroups: [""]
  resources: [namespaces, pods, services, nodes, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]'

# Its first full sync is done when its top-level chain is hooked into FORWARD.
kube_router_synced() {
  "${IN_NODE[@]}" iptables -S FORWARD | grep -q -- '-j KUBE-ROUTER-FORWARD'
}

kube_router_up() {
  local name="$KUBE_ROUTER_NAME$SUFFIX" exe kubeconfig
  pid_alive "$name" && { log "$name: running"; return 0; }
  exe="$(bin "$KUBE_ROUTER_NAME")"
  command -v ipset >/dev/null || die "$name needs ipset: tests/cluster/build.sh netpol installs it"
  # The rules of one that was killed (cluster.sh node-lose) are still there: start from none.
  kube_router_cleanup || log "$name: the rules of an earlier run could not all be removed"
  netpol_identity "$KUBE_ROUTER_NAME" "$KUBE_ROUTER_RULES"
  kubeconfig="$(node_kubeconfig "$KUBE_ROUTER_NAME" "$KUBE_ROUTER_NAME")"
  # Health and metrics ports off: several nodes share the host's loopback only for node 1, and
  # nothing here scrapes them.
  start_daemon "$name" "$LOGS/$name.log" "${IN_NODE[@]}" "$exe" \
    --kubeconfig "$kubeconfig" --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --enable-pod-egress=false --service-cluster-ip-range "$SERVICE_CIDR" \
    --health-port 0 --metrics-port 0 -v 1
  wait_for "$name to hook its chains into FORWARD (log: $LOGS/$name.log)" 60 kube_router_synced ||
    { tail -20 "$LOGS/$name.log" >&2; die "$name did not start"; }
  log "$name: enforcing NetworkPolicy for the pods of $NODE (iptables and ipset)"
}

kube_router_down() {
  local name="$KUBE_ROUTER_NAME$SUFFIX"
  stop_daemon "$name"
  [[ -z "$NETNS" || -e "/run/netns/$NETNS" ]] || return 0  # the namespace, and its rules, are gone
  kube_router_cleanup || log "$name: its iptables rules or ipsets could not all be removed"
}

# Its rules stay after it exits and go on rejecting (a later pod that gets a policed pod's address
# would be refused), and v2.1.0's own --cleanup-config panics (a nil pointer in its service proxy's
# cleanup, before it reaches the policy rules). So: delete the jumps from the built-in chains into
# its chains, flush and delete its chains (KUBE-ROUTER-*, a KUBE-POD-FW-* per policed pod,
# KUBE-NWPLCY-* per policy), all in one iptables-restore --noflush, then destroy its ipsets.
kube_router_cleanup() {
  local rules chains set
  rules=$("${IN_NODE[@]}" iptables-save -t filter)
  chains=$(grep -oE '^:KUBE-(ROUTER|POD-FW|NWPLCY)-[^ ]+' <<<"$rules" | cut -c2- || true)
  {
    echo '*filter'
    grep -E '^-A (INPUT|FORWARD|OUTPUT) .*-j KUBE-ROUTER-' <<<"$rules" | sed 's/^-A /-D /' || true
    for chain in $chains; do echo "-F $chain"; done
    for chain in $chains; do echo "-X $chain"; done
    echo COMMIT
  } | "${IN_NODE[@]}" iptables-restore --noflush
  for set in $("${IN_NODE[@]}" ipset list -n | grep -E '^(KUBE-(SRC|DST)-|kube-router-)' || true); do
    "${IN_NODE[@]}" ipset destroy "$set"
  done
}
