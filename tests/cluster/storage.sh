#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Shared storage for the local cluster: rancher's local-path-provisioner with `sharedFileSystemPath`
# and the StorageClass `pets-shared` (the default class). Every node of the local cluster runs on this
# host and sees its filesystem, so one host directory stands in for NFS/EFS: each PersistentVolume is
# a directory under it, mounted as a hostPath on whichever node a pod lands, and ReadWriteMany works.
#
# usage: storage.sh up|down|status|render|archives
#   up        create the shared directory, apply the manifests (server-side, idempotent), wait for
#             the provisioner's rollout
#   down      delete what `up` applied; the shared directory and the volumes' data stay on the host
#   status    the StorageClass, the provisioner and the volumes of the class
#   render    print the manifests `up` applies
#   archives  print the two image archives every node must have imported (this script imports none):
#               $PETS_CACHE/images/local-path-provisioner.tar  (build.sh local-path)
#               $PETS_CACHE/images/smoke.tar                   (build.sh smoke-image; the helper pods
#                                                               that create and delete volume directories)
#
# Knobs: PETS_SHARED_DIR (the shared host directory; $PETS_STATE/shared), KUBECONFIG
# ($PETS_STATE/kubeconfig), STORAGE_TIMEOUT (seconds to wait for the rollout and deletion; 120).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=storage
# shellcheck source=lib.sh
source "$HERE/lib.sh"

LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}" # keep in step with build.sh
PROVISIONER_IMAGE="localhost/pets-training/local-path-provisioner:$LOCAL_PATH_VERSION"
PROVISIONER_ARCHIVE="$PETS_CACHE/images/local-path-provisioner.tar"
HELPER_IMAGE="$SMOKE_IMAGE" # Debian minbase: sh, mkdir, rm
HELPER_ARCHIVE="$PETS_CACHE/images/smoke.tar"
SHARED_DIR="$(realpath -m "${PETS_SHARED_DIR:-$PETS_STATE/shared}")"
STORAGE_NAMESPACE=local-path-storage
STORAGE_CLASS=pets-shared
PROVISIONER_NAME=rancher.io/local-path
FIELD_MANAGER=pets-storage
STORAGE_TIMEOUT="${STORAGE_TIMEOUT:-120}"
export KUBECONFIG="${KUBECONFIG:-$KUBECONFIG_ADMIN}"

# The provisioner's config.json (upstream's ConfigMap key): no per-node paths, one shared path.
config_json() {
  printf '{"nodePathMap": [], "sharedFileSystemPath": "%s"}' "$SHARED_DIR"
}

# render: the manifests, modelled on upstream's deploy/local-path-storage.yaml (v0.0.30). Changes:
# our images with imagePullPolicy Never (imported, never pulled), small requests, Recreate (the
# provisioner runs without leader election, so two must not overlap in a rollout), the provisioner
# as nobody, the helper pod as root (it creates directories in the root-owned shared directory),
# the StorageClass `pets-shared` (Immediate: a shared volume needs no node), config.json with
# sharedFileSystemPath, and a config checksum on the pod template so a changed path rolls it.
render() {
  local config checksum
  config="$(config_json)"
  checksum="$(printf '%s' "$config" | sha256sum | cut -c1-16)"
  cat <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: local-path-provisioner-service-account
  namespace: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: local-path-provisioner-role
  namespace: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: local-path-provisioner-role
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
rules:
  - apiGroups: [""]
    resources: ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"]
    verbs: ["get", "list", "watch"]
  - apiGroups: [""]
    resources: ["persistentvolumes"]
    verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create", "patch"]
  - apiGroups: ["storage.k8s.io"]
    resources: ["storageclasses"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: local-path-provisioner-bind
  namespace: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: local-path-provisioner-role
subjects:
  - kind: ServiceAccount
    name: local-path-provisioner-service-account
    namespace: $STORAGE_NAMESPACE
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: local-path-provisioner-bind
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: local-path-provisioner-role
subjects:
  - kind: ServiceAccount
    name: local-path-provisioner-service-account
    namespace: $STORAGE_NAMESPACE
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: local-path-provisioner
  namespace: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
spec:
  replicas: 1
  strategy: {type: Recreate}
  selector:
    matchLabels:
      app: local-path-provisioner
  template:
    metadata:
      labels:
        app: local-path-provisioner
      annotations:
        pets-training/config-sha256: "$checksum"
    spec:
      serviceAccountName: local-path-provisioner-service-account
      securityContext: {runAsUser: 65534, runAsGroup: 65534, runAsNonRoot: true}
      # On the control-plane node where there is one (cluster.sh NODES>=2): a worker lost must not
      # take the provisioner with it for the 300 s of its default toleration.
      tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              preference: {matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: Exists}]}
      containers:
        - name: local-path-provisioner
          image: $PROVISIONER_IMAGE
          imagePullPolicy: Never
          command:
            - local-path-provisioner
            - --debug
            - start
            - --config
            - /etc/config/config.json
            - --helper-image
            - $HELPER_IMAGE
          volumeMounts:
            - name: config-volume
              mountPath: /etc/config/
          env:
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: CONFIG_MOUNT_PATH
              value: /etc/config/
          resources:
            requests: {cpu: 10m, memory: 32Mi}
            limits: {memory: 256Mi}
          securityContext: {allowPrivilegeEscalation: false}
      volumes:
        - name: config-volume
          configMap:
            name: local-path-config
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $STORAGE_CLASS
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: $PROVISIONER_NAME
volumeBindingMode: Immediate
reclaimPolicy: Delete
---
kind: ConfigMap
apiVersion: v1
metadata:
  name: local-path-config
  namespace: $STORAGE_NAMESPACE
  labels: {app.kubernetes.io/managed-by: $FIELD_MANAGER}
data:
  config.json: |-
    $config
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "\$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata:
      name: helper-pod
    spec:
      priorityClassName: system-node-critical
      securityContext: {runAsUser: 0, runAsGroup: 0}
      tolerations:
        - key: node.kubernetes.io/disk-pressure
          operator: Exists
          effect: NoSchedule
      containers:
      - name: helper-pod
        image: $HELPER_IMAGE
        imagePullPolicy: Never
        resources:
          requests: {cpu: 10m, memory: 16Mi}
EOF
}

check_shared_dir() {
  [[ "$SHARED_DIR" != / ]] || die "PETS_SHARED_DIR must not be / (volumes are its subdirectories)"
  [[ "$SHARED_DIR" != *[\"\\]* && "$SHARED_DIR" != *[[:space:]]* ]] ||
    die "PETS_SHARED_DIR '$SHARED_DIR' holds a quote, backslash or space; pick a plain path"
}

kubectl_bin() {
  KUBECTL="$(bin kubectl)"
  [[ -f "$KUBECONFIG" ]] || die "no kubeconfig at $KUBECONFIG (is the cluster up? set KUBECONFIG)"
}

# other_default_classes: names of default StorageClasses other than ours.
other_default_classes() {
  "$KUBECTL" get storageclass -o \
    jsonpath='{range .items[?(@.metadata.annotations.storageclass\.kubernetes\.io/is-default-class=="true")]}{.metadata.name}{"\n"}{end}' |
    grep -vx "$STORAGE_CLASS" || true
}

# class_volumes: "NAME STATUS CLAIM PATH" of the PersistentVolumes of our class.
class_volumes() {
  "$KUBECTL" get pv -o \
    jsonpath='{range .items[?(@.spec.storageClassName=="'"$STORAGE_CLASS"'")]}{.metadata.name} {.status.phase} {.spec.claimRef.namespace}/{.spec.claimRef.name} {.spec.hostPath.path}{"\n"}{end}'
}

up() {
  local t0=$SECONDS a others
  check_shared_dir
  kubectl_bin
  for a in "$PROVISIONER_ARCHIVE" "$HELPER_ARCHIVE"; do
    [[ -f "$a" ]] || log "warning: $a is missing (tests/cluster/build.sh local-path smoke-image); every node needs it imported"
  done
  # The helper pods would create it (hostPath DirectoryOrCreate), as root with mode 0755; made here
  # it exists before the first volume, with the caller's owner.
  mkdir -p "$SHARED_DIR"
  render | "$KUBECTL" apply --server-side --field-manager "$FIELD_MANAGER" --force-conflicts -f - >&2
  others="$(other_default_classes)"
  [[ -z "$others" ]] ||
    log "warning: other default StorageClass(es): $(echo "$others" | tr '\n' ' ')(the newest default wins)"
  if ! "$KUBECTL" -n "$STORAGE_NAMESPACE" rollout status deployment/local-path-provisioner \
    --timeout "${STORAGE_TIMEOUT}s" >&2; then
    "$KUBECTL" -n "$STORAGE_NAMESPACE" get pods -o wide >&2 || true
    "$KUBECTL" -n "$STORAGE_NAMESPACE" describe pods -l app=local-path-provisioner 2>&1 | tail -25 >&2 || true
    die "the provisioner did not roll out in ${STORAGE_TIMEOUT}s (are $PROVISIONER_IMAGE and $HELPER_IMAGE imported on every node?)"
  fi
  log "StorageClass $STORAGE_CLASS (default, RWX) ready in $((SECONDS - t0)) s; volumes under $SHARED_DIR"
}

down() {
  local t0=$SECONDS left
  kubectl_bin
  left="$(class_volumes)"
  if [[ -n "$left" ]]; then
    log "warning: these $STORAGE_CLASS volumes stay (no provisioner will delete them; their data stays on the host):"
    printf '  %s\n' "$left" >&2
  fi
  render | "$KUBECTL" delete -f - --ignore-not-found --wait --timeout "${STORAGE_TIMEOUT}s" >&2
  log "storage down in $((SECONDS - t0)) s; $SHARED_DIR and its data stay"
}

status() {
  kubectl_bin
  "$KUBECTL" get storageclass "$STORAGE_CLASS" || true
  "$KUBECTL" -n "$STORAGE_NAMESPACE" get deployment,pods -o wide || true
  echo "volumes of $STORAGE_CLASS (name phase claim path) under $SHARED_DIR:"
  class_volumes
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  render) check_shared_dir; render ;;
  archives) printf '%s\n' "$PROVISIONER_ARCHIVE" "$HELPER_ARCHIVE" ;;
  *) die "usage: $0 up|down|status|render|archives" ;;
esac
