#!/usr/bin/env bash
# End-to-end on kind (needs docker, kind, kubectl, helm): create a cluster, build and load
# the image, install the chart with the simulator, run e2e/scenario.txt (apply the
# examples, assert statuses, inject faults with simctl), tear down.
#
#   e2e/kind/run.sh            # KEEP_CLUSTER=1 keeps the cluster afterwards
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=norsk-auto-manager
IMAGE=norsk-auto-manager:e2e
RELEASE=nam
SYSTEM_NS=norsk-system
NS=default
TIMEOUT=${TIMEOUT:-300}

say() { printf '\n== %s\n' "$*"; }

teardown() {
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    say "deleting cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" || true
  fi
}

dump() {
  say "FAILED: state of the cluster"
  kubectl get norsk -A -o wide || true
  kubectl -n "$SYSTEM_NS" logs "deploy/$RELEASE-norsk-auto-manager" --tail=200 || true
  kubectl -n "$SYSTEM_NS" logs "deploy/$RELEASE-norsk-auto-manager-sim" --tail=50 || true
}

trap teardown EXIT
trap dump ERR

say "creating cluster $CLUSTER"
kind create cluster --config "$ROOT/e2e/kind/kind.yaml" --wait 120s

say "building $IMAGE"
docker build -t "$IMAGE" "$ROOT"
kind load docker-image --name "$CLUSTER" "$IMAGE"

say "installing the chart"
helm install "$RELEASE" "$ROOT/charts/norsk-auto-manager" \
  --namespace "$SYSTEM_NS" --create-namespace \
  --values "$ROOT/e2e/kind/values.yaml" --wait --timeout "${TIMEOUT}s"

simctl() {
  # distroless has no shell: exec the binary itself in the simulator's pod.
  kubectl -n "$SYSTEM_NS" exec "deploy/$RELEASE-norsk-auto-manager-sim" -- \
    norsk-auto-manager simctl --addr http://127.0.0.1:6789 "$@"
}

KILLED=
kill_primary() {
  KILLED=$(kubectl -n "$NS" get "$1" "$2" -o jsonpath='{.status.primaryNode}')
  [[ -n "$KILLED" ]] || { echo "$1/$2 has no primary node" >&2; return 1; }
  simctl kill-node "$KILLED"
}

moved_off() {
  local kind=$1 name=$2 node=$KILLED deadline=$((SECONDS + TIMEOUT)) primary ready
  while ((SECONDS < deadline)); do
    primary=$(kubectl -n "$NS" get "$kind" "$name" -o jsonpath='{.status.primaryNode}')
    ready=$(kubectl -n "$NS" get "$kind" "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
    if [[ -n "$primary" && "$primary" != "$node" && "$ready" == True ]]; then
      echo "$kind/$name runs on $primary"
      return 0
    fi
    sleep 2
  done
  echo "$kind/$name still on ${primary:-nothing} (Ready=$ready) after ${TIMEOUT}s" >&2
  return 1
}

say "running e2e/scenario.txt"
while read -r verb rest; do
  [[ -z "$verb" || "$verb" == \#* ]] && continue
  read -r -a args <<<"$rest"
  echo "-- $verb ${args[*]}"
  case "$verb" in
    # Into one namespace, as tests/kube_scenario.rs does (the examples name their own).
    apply) sed '/^[[:space:]]*namespace:/d' "$ROOT/${args[0]}" | kubectl apply -n "$NS" -f - ;;
    ready) kubectl wait -n "$NS" --for=condition=Ready --timeout="${TIMEOUT}s" "${args[0]}/${args[1]}" ;;
    fault) simctl "${args[@]}" ;;
    kill-primary) kill_primary "${args[0]}" "${args[1]}" ;;
    moved-off) moved_off "${args[0]}" "${args[1]}" ;;
    *) echo "unknown step: $verb" >&2; exit 2 ;;
  esac
done <"$ROOT/e2e/scenario.txt"

say "scenario passed"
kubectl get norsk -A
