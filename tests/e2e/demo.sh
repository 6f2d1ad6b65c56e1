#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# make demo: from a fresh machine to a trained PetsTraining.
# cluster up -> images built and loaded -> helm install -> kubectl apply -f petstraining.yaml ->
# live progress until Succeeded (or Failed) -> where the results are.
#
#   tests/e2e/demo.sh [local|kind]
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$E2E_ROOT"
CLUSTER=${1:-local}
NAMESPACE=${PETS_DEMO_NAMESPACE:-default}
OPERATOR_NAMESPACE=${PETS_OPERATOR_NAMESPACE:-pets-system}
TIMEOUT_S=${PETS_DEMO_TIMEOUT:-1800}

step() { printf '\n==> %s\n' "$*" >&2; }

step "cluster ($CLUSTER)"
tests/cluster/cluster.sh up "$CLUSTER"
use_cluster "$CLUSTER"

step "images"
image/build.sh all
load_images

step "helm install the operator into $OPERATOR_NAMESPACE"
tests/cluster/build.sh control-plane >/dev/null
"$PETS_CACHE/bin/helm" upgrade --install pets charts/pets-training \
  --namespace "$OPERATOR_NAMESPACE" --create-namespace --wait --timeout 5m

step "kubectl apply -f petstraining.yaml"
kubectl -n "$NAMESPACE" delete -f petstraining.yaml --ignore-not-found --wait
kubectl -n "$NAMESPACE" apply -f petstraining.yaml
name=$(kubectl create --dry-run=client -f petstraining.yaml -o jsonpath='{.metadata.name}')

step "training (kubectl get pt $name -w shows the same); Ctrl-C stops watching, not training"
deadline=$((SECONDS + TIMEOUT_S))
last=""
fmt='{.status.phase} epoch {.status.epoch}/{.status.totalEpochs} loss {.status.trainLoss} accuracy {.status.evalAccuracy} images/s {.status.imagesPerSecond} eta {.status.etaSeconds}s restarts {.status.restarts}'
while :; do
  line=$(kubectl -n "$NAMESPACE" get pt "$name" -o jsonpath="$fmt" 2>/dev/null || true)
  if [[ $line != "$last" && $line != " "* ]]; then  # (no status yet: nothing to show)
    printf '%s  %s\n' "$(date +%H:%M:%S)" "$line"
    last=$line
  fi
  case "$line" in
    Succeeded*) break ;;
    Failed*)
      kubectl -n "$NAMESPACE" describe pt "$name" >&2
      die "the training failed; pods: kubectl -n $NAMESPACE get pods -l training.pets.dev/training=$name"
      ;;
  esac
  ((SECONDS < deadline)) || die "not finished after $TIMEOUT_S s"
  sleep 2
done

step "done"
accuracy=$(kubectl -n "$NAMESPACE" get pt "$name" -o jsonpath='{.status.evalAccuracy}')
echo "PetsTraining $NAMESPACE/$name Succeeded: eval accuracy $accuracy"
cat <<EOT
Results:
  summary:   kubectl -n $NAMESPACE get pt $name -o jsonpath='{.status.summary}'
  table:     kubectl -n $NAMESPACE get pt
  logs:      kubectl -n $NAMESPACE logs -l training.pets.dev/training=$name --prefix
  files:     progress.jsonl, summary.json, model.safetensors, metrics.png and checkpoints/ are
             written to the pods' output volume: an emptyDir in this sample (gone with the pods);
             set spec.output.persistentVolumeClaim to keep them (docs/operator.md)
  cluster:   KUBECONFIG=$KUBECONFIG; stop it with 'make cluster-down'
EOT
