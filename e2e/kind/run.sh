#!/usr/bin/env bash
# End-to-end on kind (needs docker, kind, kubectl, helm and the kubectl-norsk plugin on
# PATH): create a cluster, build and load the image, install the chart with the simulator
# as the README's Helm quick start does, run e2e/scenario.txt and e2e/day-two.txt (the same
# verbs as e2e/node/run.sh, from e2e/lib/scenario.sh), tear down.
#
#   e2e/kind/run.sh            # KEEP_CLUSTER=1 keeps the cluster afterwards
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../lib/scenario.sh
source "$ROOT/e2e/lib/scenario.sh"
CLUSTER=norsk-auto-manager
IMAGE=norsk-auto-manager:e2e
RELEASE=nam
SYSTEM_NS=norsk-system
NS=default
CHART="$ROOT/charts/norsk-auto-manager"
TIMEOUT=${TIMEOUT:-300}

say() { printf '\n== %s\n' "$*"; }
knorsk() { kubectl norsk "$@"; }
# distroless has no shell: exec the binary itself in the simulator's pod.
simctl() {
  kubectl -n "$SYSTEM_NS" exec "deploy/$RELEASE-norsk-auto-manager-sim" -- \
    norsk-auto-manager simctl --addr http://127.0.0.1:6789 "$@"
}

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
docker build -t "$IMAGE" --build-arg REVISION="$(git -C "$ROOT" rev-parse HEAD)" "$ROOT"
kind load docker-image --name "$CLUSTER" "$IMAGE"

say "installing the chart: the README's quick start, parts 2 to 4"
IMAGE_TAG="${IMAGE##*:}"
mapfile -t README_INSTALL < <(readme_commands "Quick start: the chart with a simulated Manager" 2 4)
for cmd in "${README_INSTALL[@]}"; do
  readme_step "$cmd" || exit 1
done

say "running e2e/scenario.txt and e2e/day-two.txt"
while read -r line; do
  echo "-- $line"
  read -r -a step <<<"$line"
  scenario_step "${step[@]}"
done < <(scenario_lines scenario.txt day-two.txt)

say "scenario passed"
kubectl get norsk -A
