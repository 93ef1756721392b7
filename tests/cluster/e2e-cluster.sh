#!/usr/bin/env bash
# `make e2e-cluster`: install the chart into the cluster of $KUBECONFIG and run the quickstart job to Succeeded.
# Not run in CI (no cluster there). Needs kubectl and helm on PATH, and images the cluster can pull:
#   OPERATOR_IMAGE  (default ascend-train/operator:0.1.0)      the Dockerfile's `operator` target
#   ENGINE_IMAGE    (default ascend-train/engine-cpu:0.1.0)    the Dockerfile's `engine-cpu` target
#   NAMESPACE       (default ascend-e2e)   where the job runs; the operator goes to ascend-system
#   TIMEOUT_S       (default 900)          how long the job may take
#   KEEP=1          leave the release, namespace and job in place afterwards
set -euo pipefail

OPERATOR_IMAGE=${OPERATOR_IMAGE:-ascend-train/operator:0.1.0}
ENGINE_IMAGE=${ENGINE_IMAGE:-ascend-train/engine-cpu:0.1.0}
NAMESPACE=${NAMESPACE:-ascend-e2e}
TIMEOUT_S=${TIMEOUT_S:-900}
RELEASE=ascend-train-operator
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

for tool in kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-cluster: $tool is not on PATH" >&2; exit 2; }
done
kubectl cluster-info >/dev/null || { echo "e2e-cluster: no cluster reachable (KUBECONFIG=${KUBECONFIG:-~/.kube/config})" >&2; exit 2; }

cleanup() {
  if [[ "${KEEP:-0}" != 1 ]]; then
    kubectl delete namespace "$NAMESPACE" --ignore-not-found --wait=false
    helm uninstall "$RELEASE" -n ascend-system || true
  fi
}
trap cleanup EXIT

echo "== installing the chart (operator image $OPERATOR_IMAGE)"
helm upgrade --install "$RELEASE" "$ROOT/charts/ascend-train-operator" \
  --namespace ascend-system --create-namespace \
  --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" \
  --set image.pullPolicy=IfNotPresent --set progressInterval=2 \
  --wait --timeout 5m
kubectl get crd ascendtrainjobs.ascendtrain.dev datasetpreps.ascendtrain.dev checkpointconverts.ascendtrain.dev

echo "== the API server rejects a job whose world size TP does not divide"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
if sed -e "s#^  namespace: default#  namespace: $NAMESPACE#" -e "s#^  nprocPerNode: 1#  nprocPerNode: 3#" \
     -e "s#^  nnodes: 2#  nnodes: 1#" "$ROOT/examples/quickstart.yaml" | kubectl apply --dry-run=server -f - 2>/tmp/e2e-reject.txt; then
  echo "e2e-cluster: a 1 x 3 job with TP2 was accepted" >&2; exit 1
fi
grep -q "divisible" /tmp/e2e-reject.txt

echo "== running the quickstart job (engine image $ENGINE_IMAGE)"
kubectl apply -n "$NAMESPACE" -f - <<PVC
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ascend-workspace}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
PVC
sed -e "s#^  namespace: default#  namespace: $NAMESPACE#" -e "s#image: ascend-train/engine-cpu:0.1.0#image: $ENGINE_IMAGE#" \
  "$ROOT/examples/quickstart.yaml" | kubectl apply -f -

deadline=$((SECONDS + TIMEOUT_S))
phase=""
while (( SECONDS < deadline )); do
  phase=$(kubectl get atj quickstart -n "$NAMESPACE" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  kubectl get atj quickstart -n "$NAMESPACE" --no-headers 2>/dev/null || true
  [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
  sleep 10
done
kubectl get pods -n "$NAMESPACE" -l ascendtrain.dev/job-name=quickstart -o wide || true
if [[ "$phase" != Succeeded ]]; then
  echo "e2e-cluster: quickstart ended as '${phase:-nothing}' after ${SECONDS}s" >&2
  kubectl describe atj quickstart -n "$NAMESPACE" >&2 || true
  kubectl logs -n "$NAMESPACE" -l ascendtrain.dev/job-name=quickstart,ascendtrain.dev/replica-index=0 --tail=50 >&2 || true
  exit 1
fi

iteration=$(kubectl get atj quickstart -n "$NAMESPACE" -o jsonpath='{.status.progress.iteration}')
total=$(kubectl get atj quickstart -n "$NAMESPACE" -o jsonpath='{.spec.train.training.trainIters}')
[[ "$iteration" == "$total" ]] || { echo "e2e-cluster: progress says iteration $iteration of $total" >&2; exit 1; }
echo "e2e-cluster: quickstart Succeeded, $iteration/$total iterations, in ${SECONDS}s"
