#!/usr/bin/env bash
# `make e2e-kind`: a kind cluster with this checkout's images, then the same checks as `make e2e-cluster`.
# Not run in CI (no Docker engine there). Needs docker, kind, kubectl and helm on PATH.
#   CLUSTER (default ascend-e2e)   kind cluster name; created if missing
#   KEEP=1                         keep the cluster (and the job) afterwards
set -euo pipefail

CLUSTER=${CLUSTER:-ascend-e2e}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OPERATOR_IMAGE=ascend-train/operator:e2e
ENGINE_IMAGE=ascend-train/engine-cpu:e2e

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is not on PATH" >&2; exit 2; }
done

created=0
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 120s
  created=1
fi
cleanup() {
  if [[ "$created" == 1 && "${KEEP:-0}" != 1 ]]; then kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT

echo "== building images"
docker build --target operator -t "$OPERATOR_IMAGE" "$ROOT"
docker build --target engine-cpu -t "$ENGINE_IMAGE" "$ROOT"
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$ENGINE_IMAGE"

export KUBECONFIG
KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
OPERATOR_IMAGE=$OPERATOR_IMAGE ENGINE_IMAGE=$ENGINE_IMAGE bash "$ROOT/tests/cluster/e2e-cluster.sh"
