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

step "kubectl apply -f petstraining.yaml (as it is: its results go to a claim the operator makes)"
# An earlier demo's training goes first, and its claim with it (foreground: the claim is gone when this
# returns): its checkpoints would make this one resume at its end instead of training.
kubectl -n "$NAMESPACE" delete -f petstraining.yaml --ignore-not-found --cascade=foreground --wait
kubectl -n "$NAMESPACE" apply -f petstraining.yaml
name=$(kubectl create --dry-run=client -f petstraining.yaml -o jsonpath='{.metadata.name}')

step "training (kubectl get pt $name -w shows the same); Ctrl-C stops watching, not training"
deadline=$((SECONDS + TIMEOUT_S))
last=""
# One line from the training's status: the phase, the pods and the step, and an epoch's metrics once
# one has ended (pets_client.progress.live_line, run by the host's python3: it needs only the stdlib).
progress_line() {
  kubectl -n "$NAMESPACE" get pt "$name" -o json 2>/dev/null | python3 "$E2E_ROOT/src/pets_client/progress.py"
}
while :; do
  line=$(progress_line || true)
  if [[ -n $line && $line != "$last" ]]; then
    printf '%s  %s\n' "$(date +%H:%M:%S)" "$line"
    last=$line
  fi
  case "$line" in
    Succeeded:*) break ;;
    Failed:*)
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
# Where its time went (status.goodput), once the operator has booked the finished training.
for _ in 1 2 3 4 5; do
  split=$(kubectl -n "$NAMESPACE" get pt "$name" -o json | python3 "$E2E_ROOT/src/pets_client/progress.py" --time-split || true)
  [[ $split == *training* ]] && break
  sleep 2
done
echo "Time: ${split:-status.goodput not booked yet}"
# Where the results are: the claim the operator made (status.children.outputClaim), and on this machine
# its volume's directory (the local cluster's shared storage is a hostPath).
claim=$(kubectl -n "$NAMESPACE" get pt "$name" -o jsonpath='{.status.children.outputClaim}')
durable=$(kubectl -n "$NAMESPACE" get pt "$name" -o jsonpath='{.status.conditions[?(@.type=="OutputDurable")].message}')
echo "Output: $durable"
[[ -n $claim ]] || die "no output claim: is there a default StorageClass (kubectl get sc)?"
volume=$(kubectl -n "$NAMESPACE" get pvc "$claim" -o jsonpath='{.spec.volumeName}')
results=$(kubectl get pv "$volume" -o jsonpath='{.spec.hostPath.path}')
if [[ -n $results && -d $results ]]; then
  echo "Results on this machine, in $results (claim $claim, volume $volume):"
  for f in model.safetensors metrics.png summary.json progress.jsonl; do
    [[ -f $results/$f ]] || die "$results/$f is missing"
    printf '  %-18s %s (%s bytes)\n' "$f" "$results/$f" "$(stat -c %s "$results/$f")"
  done
  printf '  %-18s %s\n' "checkpoints/" "$results/checkpoints"
else
  echo "Results are on claim $claim (volume $volume), not a directory of this machine:"
  echo "  kubectl pets fetch $name ./results copies them out (docs/python.md)"
fi
cat <<EOT
More:
  summary:   kubectl -n $NAMESPACE get pt $name -o jsonpath='{.status.summary}'
  table:     kubectl -n $NAMESPACE get pt
  logs:      kubectl -n $NAMESPACE logs -l training.pets.dev/training=$name --prefix
  fetch:     .venv/bin/kubectl-pets -n $NAMESPACE fetch $name ./results (after make install)
  results:   the claim $claim goes with the PetsTraining (a day after it finished:
             ttlSecondsAfterFinished); spec.output.managedClaim.retentionPolicy: Retain keeps it
  cluster:   KUBECONFIG=$KUBECONFIG; stop it with 'make cluster-down' (the shared directory stays)
EOT
