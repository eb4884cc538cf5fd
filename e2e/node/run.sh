#!/usr/bin/env bash
# End-to-end on a real single-node Kubernetes cluster built from source (no Docker, no
# registry): build or reuse the node's and the control plane's binaries (cached outside the
# repository), start the node (e2e/node/node.sh), build the image (e2e/image/build.sh) and
# import it, then install the chart the way the README's Helm quick start does and run
# e2e/scenario.txt and e2e/day-two.txt through real Pods with kubectl, `kubectl norsk` and
# simctl. Every wait is bounded; a failure dumps the cluster's state; teardown always runs
# and checks the host is left as it was.
#
#   bash e2e/node/run.sh          # KEEP=1 keeps the node running afterwards (for debugging;
#                                 # then `bash e2e/node/run.sh down RUN_DIR` stops it)
#   MANAGER=published bash e2e/node/run.sh
#                                 # the same against a published Manager (the simulator
#                                 # without the AutoManager additions)
#
# The last line is `e2e node: N/M steps passed`; the exit code is 0 only when N = M.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=node.sh
source "$ROOT/e2e/node/node.sh"
# shellcheck source=../lib/scenario.sh
source "$ROOT/e2e/lib/scenario.sh"

if [[ "${1:-}" == down ]]; then
    RUN="${2:?usage: run.sh down RUN_DIR}"
    # shellcheck source=/dev/null
    source "$RUN/binaries"
    node_down
    node_check_host && echo "stopped; the host is as it was"
    exit
fi

# What the run needs of the machine (.ci/run installs the Debian packages): root, for the
# namespaces; Go for the binaries; rustup's musl target and musl-tools for the image.
missing=()
for tool in go cargo gcc musl-gcc umoci unshare nsenter ip iptables curl openssl python3 pgrep; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ -f /usr/include/seccomp.h ]] || missing+=("seccomp.h")
if ((${#missing[@]})) || ((EUID != 0)); then
    echo "e2e/node/run.sh needs root and: ${missing[*]:-nothing else}" >&2
    echo "  apt-get install libseccomp-dev musl-tools umoci iptables curl openssl util-linux iproute2 procps" >&2
    echo "  rustup target add x86_64-unknown-linux-musl" >&2
    echo "e2e node: 0/1 steps passed"
    exit 1
fi

TIMEOUT=${TIMEOUT:-240}
RELEASE=nam
SYSTEM_NS=norsk-system
NS=default
CHART="$ROOT/charts/norsk-auto-manager"
VALUES="$ROOT/e2e/values.yaml"

say() { printf '\n== %s\n' "$*" >&2; }
timed() { printf '%s: %ss\n' "$1" "$2" >>"$RUN/times"; }

RUN="$(mktemp -d /tmp/norsk-node-XXXXXX)"
export RUN
: >"$RUN/times"

# The binaries: control plane (shared with cargo test's harness) and node, both cached.
t=$SECONDS
CP_BIN="${NORSK_CP_BIN:-$(bash "$ROOT/e2e/control-plane/build.sh" | tail -n 1)}"
timed "control plane binaries" $((SECONDS - t))
t=$SECONDS
NODE_DIR="$(bash "$ROOT/e2e/node/build.sh" | tail -n 1)"
NODE_BIN="$NODE_DIR/bin"
timed "node binaries" $((SECONDS - t))
export CP_BIN NODE_BIN
t=$SECONDS
RELEASE_BIN="$(bash "$ROOT/e2e/image/build.sh" "$RUN/image" | tail -n 1)"
timed "image" $((SECONDS - t))

# What users run, inside the node's network (the API server's address is there).
kubectl() { node_exec env PATH="$RELEASE_BIN:$CP_BIN:$PATH" KUBECONFIG="$RUN/kubeconfig" "$CP_BIN/kubectl" "$@"; }
helm() {
    node_exec env HOME="$RUN/helm-home" KUBECONFIG="$RUN/kubeconfig" "$CP_BIN/helm" "$@"
}
# `kubectl norsk`: kubectl finds the plugin on PATH, as after a krew install.
knorsk() { kubectl norsk "$@"; }
# simctl from the node, through the simulator's Service: its name resolved by the cluster
# DNS, its ClusterIP routed by kube-proxy to the simulator's Pod.
simctl() {
    node_exec "$RELEASE_BIN/norsk-auto-manager" simctl \
        --addr "http://$RELEASE-norsk-auto-manager-sim.$SYSTEM_NS.svc.cluster.local:6789" "$@"
}

STEPS=()
PASSED=0
FAILED_STEP=""
finish() {
    local code=$?
    set +e
    if [[ -n "$FAILED_STEP" || $code -ne 0 ]]; then
        say "FAILED${FAILED_STEP:+ at: $FAILED_STEP}: state of the cluster (run directory $RUN)"
        dump
    fi
    if [[ "${KEEP:-0}" == 1 ]]; then
        say "KEEP=1: the node keeps running; KUBECONFIG=$RUN/kubeconfig inside its namespaces"
        echo "  nsenter -t $(cat "$RUN/holder.pid" 2>/dev/null) -m -n -p -- $CP_BIN/kubectl --kubeconfig $RUN/kubeconfig get pods -A"
        echo "  bash e2e/node/run.sh down $RUN"
    else
        say "teardown"
        node_down
        if node_check_host; then
            echo "host left as it was" >&2
        else
            echo "teardown left the host changed" >&2
            code=1
        fi
    fi
    say "times"
    cat "$RUN/times" >&2
    local total=${#STEPS[@]}
    ((total > 0)) || total=1
    if ((PASSED != total)); then code=1; fi
    # A passing run leaves nothing behind; a failed one keeps its directory (logs, kubeconfig).
    if ((code == 0)) && [[ "${KEEP:-0}" != 1 ]]; then
        rm -rf "$RUN"
    else
        echo "run directory kept: $RUN" >&2
    fi
    echo "e2e node: $PASSED/$total steps passed (${MANAGER:-full} Manager)"
    exit "$code"
}
trap finish EXIT

dump() {
    node_dump
    echo "== norsk resources"
    kubectl get norsk -A -o wide
    kubectl get bundles -A -o yaml | head -n 200
    kubectl get nodedrains,jobmigrations -A -o yaml | head -n 200
    echo "== operator logs"
    local pod
    for pod in $(kubectl -n "$SYSTEM_NS" get pods -l app.kubernetes.io/component=operator -o name 2>/dev/null); do
        echo "-- $pod"
        kubectl -n "$SYSTEM_NS" logs "$pod" --tail=80
    done
    echo "== simulator"
    kubectl -n "$SYSTEM_NS" logs "deploy/$RELEASE-norsk-auto-manager-sim" --tail=40
    simctl snapshot | head -c 6000
}

# --- steps -------------------------------------------------------------------------------

# A step is a command; it passes when it exits 0. The list is built first so the count of
# steps is known before the first one runs.
add_step() { STEPS+=("$*"); }

run_steps() {
    local step t
    for step in "${STEPS[@]}"; do
        printf '\n-- [%d/%d] %s\n' $((PASSED + 1)) "${#STEPS[@]}" "$step" >&2
        t=$SECONDS
        if ! eval "$step"; then
            FAILED_STEP="$step"
            return 1
        fi
        PASSED=$((PASSED + 1))
        printf '   ok (%ss)\n' $((SECONDS - t)) >&2
    done
}

step_node_ready() {
    local t=$SECONDS
    node_up "$NODE_DIR/images/pause.tar" "$RUN/image/norsk-auto-manager.tar"
    timed "node start to Ready" $((SECONDS - t))
    kubectl get nodes -o wide
}

# The README's Helm quick start, parts 2 to 4, command for command (part 1 builds and pushes
# the image; here it is built and imported into the node's container runtime instead):
# the namespace enforcing the restricted Pod Security profile, the chart, the pools and
# channels, then `kubectl describe`. Part 5's commands are e2e/day-two.txt's verbs
# (tests/cli/readme_config.rs holds the two together).
readme_install() {
    local t=$SECONDS
    readme_step "$1" || return 1
    [[ "$1" != "helm install "* ]] || timed "helm install to Ready" $((SECONDS - t))
}

step_leader() {
    local pods holder
    pods="$(operator_pods)"
    [[ "$(wc -l <<<"$pods")" == 2 ]] || { echo "operator pods: $pods" >&2; return 1; }
    poll 60 "a leader" lease_holder
    holder="$(lease_holder)"
    grep -qx "$holder" <<<"$pods" || { echo "Lease held by $holder, not one of: $pods" >&2; return 1; }
    echo "leader: $holder"
    kubectl -n "$SYSTEM_NS" wait --for=condition=Ready pod -l app.kubernetes.io/component=operator --timeout=60s
    # Probes pass: neither replica was restarted by its liveness probe.
    local restarts
    restarts="$(kubectl -n "$SYSTEM_NS" get pods -l app.kubernetes.io/component=operator \
        -o 'jsonpath={range .items[*]}{.status.containerStatuses[0].restartCount}{"\n"}{end}' | sort -u)"
    [[ "$restarts" == 0 ]] || { echo "operator restarts: $restarts" >&2; return 1; }
}

# The metrics Service from inside the cluster (this node's network): the core's gauges.
step_metrics() {
    local ip body
    ip="$(jsonpath "service/$RELEASE-norsk-auto-manager-metrics" '{.spec.clusterIP}' "$SYSTEM_NS")"
    body="$(node_exec curl -sf --max-time 10 "http://$ip:8080/metrics")"
    grep -q '^norsk_automanager_' <<<"$body" || { echo "no norsk_automanager_ series from $ip" >&2; return 1; }
    # The image reports the commit it was built from (e2e/image/build.sh records it).
    local revision
    revision="$(cat "$RUN/image/revision")"
    grep -q "^norsk_automanager_build_info{version=\"[^\"]*\",revision=\"$revision\"} 1" <<<"$body" \
        || { echo "build_info does not name $revision:" >&2; grep build_info <<<"$body" >&2; return 1; }
    grep -c '^norsk_automanager_' <<<"$body" | sed 's/^/series: /'
}

# `kubectl norsk manager`: the leader publishes how each capability beyond the published Manager
# API is carried out, and bundleStore's mode is the run's Manager's (published with
# MANAGER=published, else served).
step_manager() {
    local want=served
    if [[ "${MANAGER:-full}" == published ]]; then want=published; fi
    poll 60 "bundleStore $want in kubectl norsk manager" manager_mode bundleStore "$want"
    knorsk manager
}

# manager_mode CAPABILITY MODE: `kubectl norsk manager` says CAPABILITY is carried out in MODE.
manager_mode() {
    local mode
    mode="$(knorsk manager | awk -v c="$1" '$1 == c { print $2 }')"
    [[ "$mode" == "$2" ]] || { echo "$1 is ${mode:-not listed}, not $2" >&2; return 1; }
}

add_step step_node_ready
mapfile -t README_INSTALL < <(readme_commands "Quick start: the chart with a simulated Manager" 2 4)
((${#README_INSTALL[@]})) || { echo "the README's quick start has no commands" >&2; exit 1; }
for cmd in "${README_INSTALL[@]}"; do
    add_step readme_install "$(printf '%q' "$cmd")"
done
add_step step_leader
add_step step_metrics
add_step step_manager
while read -r line; do
    add_step scenario_step "$line"
done < <(scenario_lines scenario.txt day-two.txt)

say "running ${#STEPS[@]} steps (run directory $RUN)"
t=$SECONDS
run_steps
timed "steps" $((SECONDS - t))
