# The verbs of e2e/scenario.txt and e2e/day-two.txt on a real cluster, shared by
# e2e/node/run.sh and e2e/kind/run.sh. The runner defines `kubectl`, `helm`, `simctl`
# (norsk-auto-manager simctl against the simulator) and `knorsk` (`kubectl norsk`), and
# sets ROOT, NS (the scenario's namespace), SYSTEM_NS, RELEASE, CHART and TIMEOUT.
#
#   scenario_step VERB ARGS...     one line of a scenario file
#   scenario_lines FILE...         the steps of the files, one per line
#   readme_commands HEADING [A B]  the commands of the README's sh block after HEADING
#                                  (parts `# A.` to `# B.`), one per line
#   readme_step COMMAND            one of them, as a person runs it from the repository

scenario_lines() {
    local file line
    for file in "$@"; do
        while read -r line; do
            [[ -z "$line" || "$line" == \#* ]] && continue
            echo "$line"
        done <"$ROOT/e2e/$file"
    done
}

readme_commands() { python3 "$ROOT/e2e/lib/readme.py" "$ROOT/README.md" "$@"; }

# The README's command as written, from the repository's root, with two differences: the
# image is the one the run built (imported into the node, so no registry; kind loads it),
# and a command that waits is bounded by TIMEOUT.
readme_step() {
    local cmd="$1"
    cmd="${cmd//registry.example.com\/norsk-auto-manager/norsk-auto-manager}"
    cmd="${cmd//image.tag=0.1.0/image.tag=${IMAGE_TAG:-e2e}}"
    case "$cmd" in
        "kubectl delete "*) cmd+=" --timeout=${TIMEOUT}s" ;;
        "helm uninstall "*) cmd+=" --wait --timeout ${TIMEOUT}s" ;;
        "helm install "*) cmd+=" --timeout ${TIMEOUT}s" ;;
    esac
    # MANAGER=published: the simulator is a published Manager, without the additions.
    if [[ "$cmd" == "helm install "* && "${MANAGER:-full}" == published ]]; then
        cmd+=" --set simulator.publishedApiOnly=true"
    fi
    echo "\$ $cmd" >&2
    (cd "$ROOT" && export NODE_WD="$ROOT" && eval "$cmd")
}

# poll SECONDS WHAT COMMAND...: COMMAND until it succeeds, bounded; its last output on failure.
poll() {
    local timeout="$1" what="$2" deadline out
    shift 2
    deadline=$((SECONDS + timeout))
    while true; do
        if out="$("$@" 2>&1)"; then return 0; fi
        if ((SECONDS >= deadline)); then
            echo "timed out after ${timeout}s: $what" >&2
            echo "$out" | tail -n 20 >&2
            return 1
        fi
        sleep 2
    done
}

# jsonpath RESOURCE PATH [NAMESPACE]
jsonpath() { kubectl -n "${3:-$NS}" get "$1" -o "jsonpath=$2"; }

operator_pods() {
    kubectl -n "$SYSTEM_NS" get pods -l app.kubernetes.io/component=operator \
        -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}'
}
lease_holder() {
    local holder
    holder="$(jsonpath lease/norsk-auto-manager '{.spec.holderIdentity}' "$SYSTEM_NS")"
    [[ -n "$holder" ]] && echo "$holder"
}

KILLED=""
scenario_step() {
    local verb="$1"
    shift
    case "$verb" in
        # Into one namespace, as tests/kube/scenario.rs does (the examples name their own).
        apply) sed '/^[[:space:]]*namespace:/d' "$ROOT/$1" | kubectl apply -n "$NS" -f - ;;
        ready) kubectl wait -n "$NS" --for=condition=Ready --timeout="${TIMEOUT}s" "$1/$2" ;;
        fault) simctl "$@" ;;
        kill-primary) primary_of "$1" "$2" && simctl kill-node "$KILLED" ;;
        moved-off) moved_off "$1" "$2" ;;
        drain-primary) primary_of "$1" "$2" && shift 2 && knorsk drain "$KILLED" "$@" ;;
        interrupt-primary) primary_of "$1" "$2" && shift 2 && knorsk interrupt "$KILLED" "$@" ;;
        migrate) knorsk -n "$NS" migrate "$@" ;;
        migration-done) poll "$TIMEOUT" "JobMigrations done" migrations_done ;;
        together) together "$@" ;;
        restart-leader) restart_leader ;;
        helm-upgrade) helm_upgrade "$@" ;;
        events) events "$@" ;;
        one-instance) one_instance ;;
        plain-logs) plain_logs ;;
        uninstall) uninstall ;;
        *) echo "unknown step: $verb" >&2; return 2 ;;
    esac
}

primary_of() {
    KILLED="$(jsonpath "$1/$2" '{.status.primaryNode}')"
    [[ -n "$KILLED" ]] || { echo "$1/$2 has no primary node" >&2; return 1; }
    echo "$1/$2 runs on $KILLED"
}

moved_off_now() {
    local primary ready
    primary="$(jsonpath "$1/$2" '{.status.primaryNode}')"
    ready="$(jsonpath "$1/$2" '{.status.conditions[?(@.type=="Ready")].status}')"
    [[ -n "$primary" && "$primary" != "$KILLED" && "$ready" == True ]] || {
        echo "$1/$2 on ${primary:-nothing} (Ready=${ready:-?}), was on $KILLED"
        return 1
    }
    echo "$1/$2 runs on $primary"
}
moved_off() { poll "$TIMEOUT" "$1/$2 moved off $KILLED" moved_off_now "$1" "$2"; }

# together BUNDLE: every job of the bundle's primary replica on one node (a co-located group).
together() {
    local nodes
    nodes="$(jsonpath "bundle/$1" '{range .status.replicas[?(@.index==0)].jobs[*]}{.node}{"\n"}{end}' | sort -u)"
    [[ "$(wc -l <<<"$nodes")" == 1 && -n "$nodes" ]] || { echo "bundle/$1's jobs on: $nodes" >&2; return 1; }
    echo "bundle/$1's jobs together on $nodes"
}

migrations_done() {
    local phases
    phases="$(kubectl -n "$NS" get jobmigrations -o 'jsonpath={range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}')"
    echo "$phases"
    [[ -n "$phases" ]] && ! grep -qv '=done$' <<<"$phases"
}

# Force-delete the Lease holder's Pod; the other replica must take the Lease.
restart_leader() {
    local old
    old="$(lease_holder)"
    kubectl -n "$SYSTEM_NS" delete pod "$old" --grace-period=0 --force
    poll "$TIMEOUT" "a new leader" new_leader "$old"
}
new_leader() {
    local now
    now="$(lease_holder)"
    [[ -n "$now" && "$now" != "$1" ]] && echo "leader now $now"
}

# The simulator runs each job's instance on exactly one node: once the migrations are done,
# an instance a killed leader left starting is stopped by the next one within the bound.
one_instance() { poll 60 "every job on one node" one_instance_now; }
one_instance_now() { simctl snapshot | python3 "$ROOT/e2e/lib/instances.py"; }

# helm upgrade KEY=VALUE: the settings checksum rolls the operator Pods.
helm_upgrade() {
    local before after
    before="$(operator_pods | sort)"
    helm upgrade "$RELEASE" "$CHART" --namespace "$SYSTEM_NS" --reuse-values --set "$1" \
        --wait --timeout "${TIMEOUT}s"
    kubectl -n "$SYSTEM_NS" rollout status "deploy/$RELEASE-norsk-auto-manager" --timeout="${TIMEOUT}s"
    # The old Pods stop within their grace period (the Lease's duration).
    local pod
    for pod in $before; do
        kubectl -n "$SYSTEM_NS" wait --for=delete "pod/$pod" --timeout="${TIMEOUT}s" 2>/dev/null || true
    done
    poll "$TIMEOUT" "old operator Pods gone" pods_gone "$before"
    after="$(operator_pods | sort)"
    if [[ -n "$(comm -12 <(echo "$before") <(echo "$after"))" ]]; then
        echo "pods not replaced: before $before, after $after" >&2
        return 1
    fi
    # The new setting is in the settings file the new Pods read.
    local key="${1%%=*}" value="${1#*=}"
    key="${key##*.}"
    kubectl -n "$SYSTEM_NS" get configmap "$RELEASE-norsk-auto-manager" -o yaml | grep -F "$key: $value"
}

# The operators' logs, as a log collector reads them (not a terminal): no colour codes.
plain_logs() {
    local pod escapes
    for pod in $(operator_pods); do
        escapes="$(kubectl -n "$SYSTEM_NS" logs "$pod" | grep -c $'\e\[' || true)"
        [[ "$escapes" == 0 ]] || { echo "$pod: $escapes log lines with colour codes" >&2; return 1; }
    done
    echo "plain text logs"
}

# pods_gone NAMES: none of the named operator Pods is left.
pods_gone() {
    local now
    now="$(operator_pods)"
    ! grep -qxF -f <(tr ' ' '\n' <<<"$1" | sed '/^$/d') <<<"$now"
}

# events KIND NAME: `kubectl describe` lists its Events.
events() {
    local out
    out="$(kubectl -n "$NS" describe "$1" "$2")"
    if grep -q '^Events:[[:space:]]*<none>' <<<"$out" || ! grep -q '^Events:' <<<"$out"; then
        echo "kubectl describe $1 $2 shows no Events:" >&2
        tail -n 15 <<<"$out" >&2
        return 1
    fi
    sed -n '/^Events:/,$p' <<<"$out" | head -n 12
}

# The documented uninstall, the README's Uninstall block as written: the custom resources first (the operator releases their jobs
# and removes its finalizers), then the release, then the CRDs; nothing may hang.
uninstall() {
    local commands cmd
    mapfile -t commands < <(readme_commands Uninstall)
    ((${#commands[@]})) || { echo "the README's Uninstall block has no commands" >&2; return 1; }
    for cmd in "${commands[@]}"; do
        readme_step "$cmd" || return 1
    done
    local left
    left="$(kubectl get crds -o name | grep automanager.norsk.video || true)"
    [[ -z "$left" ]] || { echo "CRDs left: $left" >&2; return 1; }
}

