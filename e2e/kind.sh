#!/usr/bin/env bash
# End-to-end on a kind cluster, for machines with Docker (not run in CI here: no Docker engine).
#
#   e2e/kind.sh            create the cluster, build and load the images, fake a GPU node, run tests/e2e
#   KEEP=1 e2e/kind.sh     ... and keep the cluster, release and pool afterwards
#
# Needs docker, kind, kubectl, helm and the repo's Python test environment (`make install`).
# The tests install charts/lorapool, apply a LoRAPool whose engine image is the simulator
# (Dockerfile target `sim`: `vllm serve` runs `lorapool sim`), wait for Ready and send an
# OpenAI request for an adapter through the pool's router via `kubectl port-forward`; a pod
# that is not the pool's router must not reach the engines' runtime LoRA API (NetworkPolicy).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-lorapool-e2e}
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=${IMAGE:-lorapool:e2e-${VERSION}}
SIM_IMAGE=${SIM_IMAGE:-lorapool-sim:e2e-${VERSION}}
KUBECONFIG_FILE=${KUBECONFIG_FILE:-$(mktemp -t lorapool-kind-XXXXXX.kubeconfig)}
GPU_PRODUCT=NVIDIA-A100-SXM4-80GB

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind.sh: $tool is not installed" >&2; exit 1; }
done

cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    echo "Kept cluster $CLUSTER: export KUBECONFIG=$KUBECONFIG_FILE; kind delete cluster --name $CLUSTER when done"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -f "$KUBECONFIG_FILE"
  fi
}
trap cleanup EXIT

# The pool's NetworkPolicy is tested for real here (tests/e2e: another pod cannot call the engines'
# /v1/load_lora_adapter while the router still serves): kindnet enforces NetworkPolicy since kind v0.24.
KIND_MINOR=$(kind version | sed -E 's/^kind v0\.([0-9]+).*/\1/')
if [ "${KIND_MINOR:-0}" -lt 24 ] 2>/dev/null; then
  echo "kind.sh: kind >= v0.24 is needed (its CNI enforces NetworkPolicy); found: $(kind version)" >&2
  exit 1
fi

echo "--- kind cluster $CLUSTER"
kind get clusters 2>/dev/null | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_FILE"
export KUBECONFIG=$KUBECONFIG_FILE

echo "--- the own-pod-status admission policy (deploy/admission-policy.yaml)"
# The chart installs it (admissionPolicy.enabled, on by default), so on kind the sidecars' and routers'
# reports pass it with the tokens the kubelet projects: the pool in tests/e2e becomes Ready only if they
# do. ValidatingAdmissionPolicy is admissionregistration.k8s.io/v1 from Kubernetes 1.30; the kubectl
# path's copy must be accepted as it is (its CEL type-checked by the API server).
SERVER_MINOR=$(kubectl version -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+"))')
if [ "${SERVER_MINOR:-0}" -lt 30 ] 2>/dev/null; then
  echo "kind.sh: Kubernetes >= 1.30 is needed (ValidatingAdmissionPolicy v1); the kind node runs 1.$SERVER_MINOR" >&2
  exit 1
fi
kubectl apply --dry-run=server -f deploy/admission-policy.yaml

echo "--- images $IMAGE and $SIM_IMAGE"
docker build --target runtime -t "$IMAGE" .
docker build --target sim -t "$SIM_IMAGE" .
kind load docker-image "$IMAGE" "$SIM_IMAGE" --name "$CLUSTER"

echo "--- a fake A100 node: GPU Feature Discovery labels and nvidia.com/gpu capacity"
NODE=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
kubectl label node "$NODE" --overwrite \
  "nvidia.com/gpu.product=$GPU_PRODUCT" nvidia.com/gpu.present=true nvidia.com/gpu.count=8 nvidia.com/gpu.memory=81920
# Extended resources nobody's device plugin manages stay as patched (the kubelet keeps them).
kubectl patch node "$NODE" --subresource=status --type=merge \
  -p '{"status":{"capacity":{"nvidia.com/gpu":"8"},"allocatable":{"nvidia.com/gpu":"8"}}}'
kubectl get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' | grep -qx 8

echo "--- tests/e2e against kind"
LORAPOOL_E2E_KUBECONFIG=$KUBECONFIG_FILE \
LORAPOOL_E2E_IMAGE=$IMAGE \
LORAPOOL_E2E_SIM_IMAGE=$SIM_IMAGE \
LORAPOOL_E2E_KEEP=${KEEP:-0} \
  python3 -m pytest tests/e2e -v -p no:cacheprovider --timeout=1200 "$@"
