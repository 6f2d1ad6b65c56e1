#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Optional add-ons of the local cluster: the real Kubeflow training-operator (PyTorchJob) and the
# real Kueue, built here (build.sh kubeflow|kueue), imported into the node, installed from upstream's
# manifests with only the image, pull policy, args and requests changed (addon_manifests.py); and an
# S3 server (the Versity S3 gateway, build.sh s3) whose manifests addon_manifests.py generates:
# http://s3.pets-s3.svc:7070, root credentials in Secret pets-s3/s3-credentials (s3_harness.py puts
# test data into it from the host); and an MLflow tracking server (build.sh mlflow, mlflow_manifests.py):
# http://mlflow.pets-mlflow.svc:5000, SQLite and artifacts on a claim; and a Prometheus server (build.sh
# prometheus, prometheus_manifests.py): http://prometheus.pets-prometheus.svc:9090, scraping the operator
# and the trainers of the chart's release as its ServiceMonitor and PodMonitor say, with its alert rules.
#
# usage: addons.sh up|down|status kubeflow|kueue|s3|mlflow|prometheus   (also: cluster.sh addon-up|addon-down NAME)
#
#   up    build (cached), import the image, apply the manifests server-side, wait until the
#         Deployment is Ready and (controllers) its webhooks answer a server-side dry-run create.
#         Idempotent: a second `up` that renders the same manifests, with the add-on still Ready (and
#         its webhook answering), returns at once; otherwise it imports, applies and waits again.
#   down  remove every object `up` applied (and, for Kueue, the finalizers it left), waiting for it.
#         Idempotent. The images stay in the node's image store, like the project's other images.
#
# Environment (all optional):
#   TRAINING_OPERATOR_VERSION  training-operator module version           [v1.8.1]
#   VERSITYGW_VERSION          the S3 add-on's github.com/versity/versitygw version    [v1.0.14]
#   PETS_KUEUE_DIR             prebuilt Kueue (kueue.gz, manifests.yaml)    [<repo>/../shared/kueue]
#   PETS_KUEUE_SOURCE          auto|go|prebuilt: where Kueue's binary comes from (auto: go install
#                              when the Go module proxy serves sigs.k8s.io/kueue, else prebuilt)
#   PETS_KUEUE_CPU_REQUEST     the Kueue controller's CPU request (upstream: 500m)            [50m]
#   PETS_KUEUE_FRAMEWORKS      job integrations to enable besides Kueue's defaults (space-separated;
#                              "" keeps upstream's list)                     [kubeflow.org/pytorchjob]
#   PETS_KUEUE_VISIBILITY_API  1: keep Kueue's aggregated visibility API (pending workloads). Off by
#                              default: the local apiserver has no front-proxy (aggregation) setup, so
#                              its APIServices stay unavailable, and that stalls namespace deletion [0]
#   PETS_PROMETHEUS_RELEASE    the chart's release the Prometheus add-on scrapes (its monitors, rendered
#                              with helm template, become the scrape jobs)          [pets: the e2e's]
#   PETS_PROMETHEUS_RELEASE_NAMESPACE  that release's namespace                   [pets-system]
#   PETS_PROMETHEUS_INTERVAL   the monitors' scrape interval and the rules' evaluation interval  [5s]
#   PETS_ADDON_TIMEOUT         seconds to wait for the controller and its webhook              [300]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=addons
# shellcheck source=lib.sh
source "$HERE/lib.sh"
# (for VERSITYGW_VERSION, S3_IMAGE, MLFLOW_IMAGE and PROMETHEUS_IMAGE; its functions need build.sh's and are not called here)
# shellcheck source=addons-build.sh
source "$HERE/addons-build.sh"

ADDON_STATE="$PETS_STATE/addons"
TIMEOUT="${PETS_ADDON_TIMEOUT:-300}"
KUEUE_CPU_REQUEST="${PETS_KUEUE_CPU_REQUEST:-50m}"
KUEUE_FRAMEWORKS="${PETS_KUEUE_FRAMEWORKS-kubeflow.org/pytorchjob}"
# Where the training-operator's image keeps the workers' init-container template (addons-build.sh).
KUBEFLOW_INIT_TEMPLATE_IN_IMAGE=/etc/training-operator/pytorch-init-container.yaml

if [[ "${PETS_CLUSTER:-local}" == kind ]]; then
  KUBECONFIG_ADDONS="$PETS_STATE/kind-kubeconfig"
else
  KUBECONFIG_ADDONS="$KUBECONFIG_ADMIN"
fi
kubectl_() { KUBECONFIG="$KUBECONFIG_ADDONS" kubectl "$@"; }

# A Python with PyYAML for addon_manifests.py: the repo's venv, else the host's.
python_yaml() {
  local py
  for py in "$HERE/../../.venv/bin/python" python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import yaml' 2>/dev/null; then echo "$py"; return 0; fi
  done
  die "no Python with PyYAML (make install creates .venv with it; or apt-get install python3-yaml)"
}

# go_module_dir MODULE@VERSION: its directory in the Go module cache (downloaded if needed).
go_module_dir() {
  (cd / && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go mod download -json "$1") |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])'
}

cluster_answers() {
  [[ -f $KUBECONFIG_ADDONS ]] && kubectl_ get --raw /readyz >/dev/null 2>&1
}

# ------------------------------------------------------------------ training-operator
# Serving certificates for its webhook, made like the cluster's own PKI (openssl), with their own CA,
# in the shape its cert rotator keeps (CA named training-operator-ca, PKCS#1 CA key, server cert for
# training-operator.kubeflow.svc): it finds them valid, so the webhook answers from the first start
# instead of after kubelet's next sync of a Secret the rotator filled.
kubeflow_pki() {
  local dir="$PKI/addons/kubeflow-webhook" svc=training-operator.kubeflow.svc
  [[ -f $dir/ca.crt && -f $dir/ca.key && -f $dir/tls.crt && -f $dir/tls.key ]] && { echo "$dir"; return 0; }
  mkdir -p "$dir"
  (
    cd "$dir"
    umask 077
    openssl genrsa -traditional -out ca.key 2048 2>/dev/null
    openssl req -x509 -new -key ca.key -out ca.crt -days 3650 \
      -subj "/O=training-operator/CN=training-operator-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment" \
      -addext "subjectAltName=DNS:training-operator-ca" 2>/dev/null
    make_cert tls "/CN=$svc" serverAuth "DNS:$svc,DNS:$svc.cluster.local"
    rm -f ca.srl
  )
  log "kubeflow: webhook certificates -> $dir"
  echo "$dir"
}

render_kubeflow() {
  local out="$1" moddir pki
  moddir="$(go_module_dir "github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION")" ||
    die "go mod download github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION failed"
  pki="$(kubeflow_pki)"
  # (its kustomization still uses commonLabels: kustomize's deprecation warning is dropped)
  kubectl kustomize "$moddir/manifests/overlays/standalone" >"$out.upstream" 2> >(grep -v "'commonLabels' is deprecated" >&2)
  "$(python_yaml)" "$HERE/addon_manifests.py" kubeflow --image "$KUBEFLOW_IMAGE" \
    --init-image "$KUBEFLOW_IMAGE" --init-template "$KUBEFLOW_INIT_TEMPLATE_IN_IMAGE" \
    --webhook-pki "$pki" <"$out.upstream" >"$out.tmp"
  mv "$out.tmp" "$out"
}

KUBEFLOW_PROBE='apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: pets-addon-probe, namespace: default}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: Never
      template: {spec: {containers: [{name: pytorch, image: probe}]}}'

# ------------------------------------------------------------------ Kueue
# Upstream's rendered manifests: the prebuilt folder's manifests.yaml, else `kubectl kustomize
# config/default` of the module (where the Go module proxy serves it).
kueue_upstream() {
  local out="$1" moddir
  if [[ -f $KUEUE_DIR/manifests.yaml ]]; then
    cp "$KUEUE_DIR/manifests.yaml" "$out"
  elif moddir="$(go_module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION" 2>/dev/null)"; then
    kubectl kustomize "$moddir/config/default" >"$out"
  else
    die "Kueue $KUEUE_VERSION: no $KUEUE_DIR/manifests.yaml and the Go module proxy does not serve \
sigs.k8s.io/kueue (set PETS_KUEUE_DIR to a folder holding kueue.gz and manifests.yaml)"
  fi
}

render_kueue() {
  local out="$1" f args=()
  kueue_upstream "$out.upstream"
  for f in $KUEUE_FRAMEWORKS; do args+=(--framework "$f"); done
  [[ ${PETS_KUEUE_VISIBILITY_API:-0} == 1 ]] && args+=(--visibility-api)
  "$(python_yaml)" "$HERE/addon_manifests.py" kueue --image "$KUEUE_IMAGE" \
    --cpu-request "$KUEUE_CPU_REQUEST" --dropped "$out.dropped" "${args[@]}" <"$out.upstream" >"$out.tmp"
  mv "$out.tmp" "$out"
}

KUEUE_PROBE='apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: pets-addon-probe}'

# ------------------------------------------------------------------ S3 (Versity S3 gateway)
# Generated (no upstream manifests): Namespace pets-s3, Secret s3-credentials, Deployment and Service s3.
render_s3() {
  local out="$1"
  "$(python_yaml)" "$HERE/addon_manifests.py" s3 --image "$S3_IMAGE" >"$out.tmp"
  mv "$out.tmp" "$out"
}

# ------------------------------------------------------------------ MLflow tracking server
# Generated (mlflow_manifests.py): Namespace pets-mlflow, its claim, Deployment and Service mlflow.
render_mlflow() {
  local out="$1"
  "$(python_yaml)" "$HERE/mlflow_manifests.py" --image "$MLFLOW_IMAGE" >"$out.tmp"
  mv "$out.tmp" "$out"
}

# ------------------------------------------------------------------ Prometheus server
# Generated (prometheus_manifests.py) from the chart as the release renders it with its monitoring on:
# Namespace pets-prometheus, its service discovery's RBAC, the configuration, Deployment and Service.
render_prometheus() {
  local out="$1" interval="${PETS_PROMETHEUS_INTERVAL:-5s}" chart="$REPO_DIR/charts/pets-training"
  helm template "${PETS_PROMETHEUS_RELEASE:-pets}" "$chart" \
    --namespace "${PETS_PROMETHEUS_RELEASE_NAMESPACE:-pets-system}" --values "$chart/ci/monitoring-values.yaml" \
    --set "metrics.serviceMonitor.interval=$interval,metrics.podMonitor.interval=$interval" >"$out.chart" ||
    die "prometheus: helm template of $chart failed"
  "$(python_yaml)" "$HERE/prometheus_manifests.py" --image "$PROMETHEUS_IMAGE" \
    --evaluation-interval "$interval" <"$out.chart" >"$out.tmp"
  rm -f "$out.chart"
  mv "$out.tmp" "$out"
}

# ------------------------------------------------------------------ common
# addon_vars NAME: NS, DEPLOY, SELECTOR (its pods), IMAGE, ARCHIVE, PROBE of the add-on (PROBE: an
# object its webhooks must admit; empty for an add-on without webhooks).
addon_vars() {
  case "$1" in
    kubeflow)
      NS=kubeflow DEPLOY=training-operator IMAGE="$KUBEFLOW_IMAGE" PROBE="$KUBEFLOW_PROBE"
      SELECTOR=control-plane=kubeflow-training-operator
      ARCHIVE="$PETS_CACHE/images/training-operator.tar" ;;
    kueue)
      NS=kueue-system DEPLOY=kueue-controller-manager IMAGE="$KUEUE_IMAGE" PROBE="$KUEUE_PROBE"
      SELECTOR=control-plane=controller-manager
      ARCHIVE="$PETS_CACHE/images/kueue.tar" ;;
    s3)
      NS=pets-s3 DEPLOY=s3 IMAGE="$S3_IMAGE" PROBE=""
      SELECTOR=app.kubernetes.io/name=s3
      ARCHIVE="$PETS_CACHE/images/s3.tar" ;;
    mlflow)
      NS=pets-mlflow DEPLOY=mlflow IMAGE="$MLFLOW_IMAGE" PROBE=""
      SELECTOR=app.kubernetes.io/name=mlflow
      ARCHIVE="$PETS_CACHE/images/mlflow.tar" ;;
    prometheus)
      NS=pets-prometheus DEPLOY=prometheus IMAGE="$PROMETHEUS_IMAGE" PROBE=""
      SELECTOR=app.kubernetes.io/name=prometheus
      ARCHIVE="$PETS_CACHE/images/prometheus.tar" ;;
    *) die "unknown add-on '$1' (expected kubeflow, kueue, s3, mlflow or prometheus)" ;;
  esac
}

webhook_answers() { kubectl_ create --dry-run=server -f - <<<"$PROBE" >/dev/null 2>&1; }

# No pod of the controller is terminating. After a rollout (a re-run `up` that changed it) the old pod
# lingers a few seconds, and a webhook call the Service sends to it hangs for its 10 s timeout.
no_old_pods() {
  [[ -z "$(kubectl_ -n "$NS" get pods -l "$SELECTOR" -o jsonpath='{.items[*].metadata.deletionTimestamp}')" ]]
}

# The add-on is up as the manifests just rendered (in $ADDON_STATE/next) say: the last `up` applied the same
# ones and finished, its controller is Ready with no old pod left, and its webhook answers.
already_up() {
  [[ -f $ADDON_STATE/$1.up ]] && cmp -s "$ADDON_STATE/next/$1.yaml" "$ADDON_STATE/$1.yaml" &&
    kubectl_ -n "$NS" rollout status "deployment/$DEPLOY" --timeout=5s >/dev/null 2>&1 &&
    no_old_pods && { [[ -z $PROBE ]] || webhook_answers; }
}

up() {
  local name="$1" t0=$SECONDS t manifests f
  addon_vars "$name"
  cluster_answers || die "no cluster answers at $KUBECONFIG_ADDONS: run tests/cluster/cluster.sh up first"
  mkdir -p "$ADDON_STATE/next"
  manifests="$ADDON_STATE/$name.yaml"
  t=$SECONDS
  "$HERE/build.sh" "$name"
  log "$name: phase build: $((SECONDS - t)) s"
  "render_$name" "$ADDON_STATE/next/$name.yaml"
  # A second `up` (each module that needs the add-on asks for it) costs seconds, not an import of the image
  # into every node, a server-side apply of the CRDs and the waits: a minute or two on the 2-core machine.
  if already_up "$name"; then
    rm -f "$ADDON_STATE/next/$name".yaml*
    log "$name: already up with these manifests, in $((SECONDS - t0)) s"
    return 0
  fi
  rm -f "$ADDON_STATE/$name.up" "$manifests.dropped"
  t=$SECONDS
  # (every node: the controller prefers the control-plane node, where there is one)
  "$HERE/load-image.sh" --all-nodes --archive "$ARCHIVE" >/dev/null
  log "$name: phase image import ($IMAGE, $(du -m "$ARCHIVE" | cut -f1) MB): $((SECONDS - t)) s"
  t=$SECONDS
  for f in "$ADDON_STATE/next/$name".yaml*; do mv "$f" "$ADDON_STATE/${f##*/}"; done
  log "$name: applying upstream's manifests, adapted ($manifests)"
  kubectl_ apply --server-side --force-conflicts --field-manager=pets-addons -f "$manifests" >/dev/null
  # What is left out on purpose (Kueue's visibility APIServices) goes, should an earlier install have it.
  if [[ -s $manifests.dropped ]]; then
    kubectl_ delete --ignore-not-found -f "$manifests.dropped" >/dev/null
  fi
  log "$name: phase apply: $((SECONDS - t)) s"
  t=$SECONDS
  log "$name: waiting for deployment/$DEPLOY in $NS to be Ready (up to ${TIMEOUT}s)"
  if ! kubectl_ -n "$NS" rollout status "deployment/$DEPLOY" --timeout="${TIMEOUT}s" >&2; then
    kubectl_ -n "$NS" describe pods >&2 || true
    kubectl_ -n "$NS" logs "deployment/$DEPLOY" --tail=30 >&2 || true
    die "$name: deployment/$DEPLOY did not become Ready"
  fi
  wait_for "the old pods of deployment/$DEPLOY to go" "$TIMEOUT" no_old_pods ||
    die "$name: an old pod of deployment/$DEPLOY is still terminating"
  log "$name: phase controller Ready: $((SECONDS - t)) s"
  if [[ -z $PROBE ]]; then
    touch "$ADDON_STATE/$name.up"
    log "$name up in $((SECONDS - t0)) s"
    return 0
  fi
  t=$SECONDS
  log "$name: waiting for its webhook to answer a server-side dry-run create"
  if ! wait_for "$name's webhook" "$TIMEOUT" webhook_answers; then
    kubectl_ create --dry-run=server -f - <<<"$PROBE" >&2 || true
    kubectl_ -n "$NS" logs "deployment/$DEPLOY" --tail=30 >&2 || true
    die "$name: its webhook did not answer"
  fi
  log "$name: phase webhook: $((SECONDS - t)) s"
  touch "$ADDON_STATE/$name.up"
  log "$name up in $((SECONDS - t0)) s"
}

# Kueue's objects carry finalizers its controller removes; with the controller gone they would hold
# the CRDs' deletion forever. Clear them (after the controller and webhooks are gone).
clear_kueue_finalizers() {
  local res ns obj
  for res in $(kubectl_ api-resources --api-group=kueue.x-k8s.io -o name 2>/dev/null); do
    # "namespace|name" ("|name" for cluster-scoped objects: a whitespace separator would be eaten by read)
    while IFS='|' read -r ns obj; do
      [[ -n $obj ]] || continue
      kubectl_ patch "$res" "$obj" ${ns:+-n "$ns"} --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null ||
        log "kueue: could not clear the finalizers of $res $ns/$obj"
    done < <(kubectl_ get "$res" -A -o jsonpath='{range .items[?(@.metadata.finalizers)]}{.metadata.namespace}{"|"}{.metadata.name}{"\n"}{end}' 2>/dev/null)
  done
}

down() {
  local name="$1" t0=$SECONDS manifests
  addon_vars "$name"
  if ! cluster_answers; then
    log "$name: no cluster answers at $KUBECONFIG_ADDONS: nothing to remove"
    rm -f "$ADDON_STATE/$name.yaml" "$ADDON_STATE/$name.yaml.upstream" "$ADDON_STATE/$name.yaml.dropped" \
      "$ADDON_STATE/$name.up"
    return 0
  fi
  mkdir -p "$ADDON_STATE"
  manifests="$ADDON_STATE/$name.yaml"
  rm -f "$ADDON_STATE/$name.up"
  [[ -f $manifests ]] || "render_$name" "$manifests"
  # First what would make the API refuse or stall the deletions below: the webhooks (their server is
  # going away), Kueue's aggregated API (an unavailable APIService stalls namespace deletion), then
  # the controller itself, so that it does not recreate what is being deleted.
  log "$name: removing its webhooks, API services and controller"
  kubectl_ delete --ignore-not-found --wait=true --timeout=120s \
    -f <("$(python_yaml)" -c '
import sys, yaml
keep = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService", "Deployment"}
docs = [d for d in yaml.load_all(open(sys.argv[1]), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
yaml.safe_dump_all([d for d in docs if d["kind"] in keep], sys.stdout)' "$manifests") >/dev/null
  if [[ -s $manifests.dropped ]]; then
    kubectl_ delete --ignore-not-found -f "$manifests.dropped" >/dev/null
  fi
  if [[ $name == kueue ]]; then clear_kueue_finalizers; fi
  log "$name: removing the rest (CRDs and their objects, RBAC, namespace $NS)"
  kubectl_ delete --ignore-not-found --wait=true --timeout=300s -f "$manifests" >/dev/null
  rm -f "$manifests" "$manifests.upstream" "$manifests.dropped"
  log "$name down in $((SECONDS - t0)) s"
}

status() {
  local name="$1"
  addon_vars "$name"
  cluster_answers || { echo "$name: no cluster"; return 1; }
  kubectl_ -n "$NS" get deployment "$DEPLOY" -o wide 2>/dev/null || { echo "$name: not installed"; return 1; }
  [[ -n $PROBE ]] || return 0
  if webhook_answers; then echo "$name: webhook answers"; else echo "$name: webhook does not answer"; return 1; fi
}

action="${1:-}" name="${2:-}"
case "$action:$name" in
  up:kubeflow | up:kueue | up:s3 | up:mlflow | up:prometheus) up "$name" ;;
  down:kubeflow | down:kueue | down:s3 | down:mlflow | down:prometheus) down "$name" ;;
  status:kubeflow | status:kueue | status:s3 | status:mlflow | status:prometheus) status "$name" ;;
  *) die "usage: $0 up|down|status kubeflow|kueue|s3|mlflow|prometheus (got '$action' '$name')" ;;
esac
