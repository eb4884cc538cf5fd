# A single-node Kubernetes cluster (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd + runc, CNI bridge, kubelet, kube-proxy, CoreDNS) inside a
# private mount + network + PID namespace, sourced by e2e/node/run.sh.
#
#   node_up       start it and wait until the node is Ready
#   node_exec     run a command inside the node's namespaces (kubectl, helm, curl, ...)
#   node_dump     what a person debugging a failure wants to see
#   node_down     stop it and check the host is as it was
#
# Expects: RUN (working directory), CP_BIN (etcd, kube-apiserver, kubectl, helm),
# NODE_BIN (e2e/node/build.sh's bin), NODE_IMAGES (its images).
#
# The host stays untouched: every daemon runs inside namespaces held by one process (the
# holder, PID 1 of the new PID namespace). Its mounts, network devices, iptables rules and
# per-namespace sysctls vanish with it, and so do the daemons: stopping the holder is the
# teardown. Only the cgroups kubelet creates outlive it; node_down removes them.

NODE_NAME=norsk-e2e
# The node's own address, on a veth pair inside the namespace: kubelet refuses a loopback
# node IP. Nothing routes out of the namespace, so no traffic leaves the machine.
NODE_IP=10.200.0.2
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_API_IP=10.96.0.1
CLUSTER_DOMAIN=cluster.local
NODE_TIMEOUT=${NODE_TIMEOUT:-180}

node_log() { printf '[node %s] %s\n' "$(date +%T)" "$*" >&2; }

# Commands inside the node's mount, network and PID namespaces.
# NODE_WD: the working directory inside (default /), for commands given relative paths.
node_exec() {
    nsenter --target "$(cat "$RUN/holder.pid")" --mount --net --pid --wd="${NODE_WD:-/}" -- "$@"
}

# A daemon inside the namespaces, its output in $RUN/logs/NAME.log.
node_daemon() {
    local name="$1"
    shift
    node_exec env PATH="$NODE_BIN:$CP_BIN:/usr/sbin:/usr/bin:/sbin:/bin" "$@" >"$RUN/logs/$name.log" 2>&1 &
    echo "$!" >"$RUN/pids/$name"
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND once a second until it succeeds.
wait_for() {
    local timeout="$1" what="$2" deadline
    shift 2
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            node_log "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 1
    done
}

# The cgroup kubelet puts pods under: below this shell's own memory cgroup (so memory is
# accounted where the caller's is), the same relative path in every v1 hierarchy.
node_cgroup_root() {
    local own
    own="$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)"
    echo "${own%/}/norsk-e2e-$$"
}

# Host state that must be the same after node_down: mounts, network namespaces, links.
node_host_fingerprint() {
    {
        echo "mounts $(wc -l </proc/self/mountinfo)"
        echo "links $(ip -o link | wc -l)"
        echo "netns $(ls /run/netns 2>/dev/null | wc -l)"
        for p in /var/lib/kubelet /var/lib/cni /etc/cni /opt/cni /var/log/pods /var/log/containers \
            /run/containerd /var/lib/containerd /etc/kubernetes /run/xtables.lock; do
            [[ -e "$p" ]] && echo "exists $p"
        done
        true
    } | sort
}

node_pki() {
    local pki="$RUN/pki"
    mkdir -p "$pki"
    (
        cd "$pki"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
            -subj "/CN=norsk-e2e-ca" 2>/dev/null
        # The API server's serving certificate: its node address, the `kubernetes` Service's
        # ClusterIP and DNS names, and loopback.
        cat >apiserver.ext <<EOF
subjectAltName=IP:$NODE_IP,IP:$SERVICE_API_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost
extendedKeyUsage=serverAuth
EOF
        openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
        openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile apiserver.ext -out apiserver.crt 2>/dev/null
        # One cluster-admin identity for the components and the test: this cluster exists
        # for one run, and per-component RBAC is not what it tests.
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
            -subj "/O=system:masters/CN=norsk-e2e-admin" 2>/dev/null
        openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile client.ext -out admin.crt 2>/dev/null
        openssl genrsa -out sa.key 2048 2>/dev/null
        openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    )
    cat >"$RUN/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: norsk-e2e
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: norsk-e2e
  context: {cluster: norsk-e2e, user: admin, namespace: default}
current-context: norsk-e2e
EOF
}

node_configs() {
    local cfg="$RUN/config"
    mkdir -p "$cfg" "$RUN/cni/net.d" "$RUN/containerd" "$RUN/kubelet" "$RUN/pod-logs" "$RUN/volume-plugins"
    # containerd 2.4 reads config version 4: write version 3 (the documented layout) and
    # let `containerd config migrate` produce the current one.
    cat >"$cfg/containerd.v3.toml" <<EOF
version = 3
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$RUN/containerd/containerd.sock"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
# NRI would listen on /var/run/nri: nothing here uses it.
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    # Imported from e2e/node/build.sh's pause image: nothing is pulled.
    sandbox = "registry.k8s.io/pause:3.10.1"
[plugins."io.containerd.cri.v1.runtime"]
  # This VM grants no CAP_SYS_RESOURCE: a negative oom_score_adj fails runc init
  # ("failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$NODE_BIN/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$NODE_BIN"]
    conf_dir = "$RUN/cni/net.d"
EOF
    "$NODE_BIN/containerd" --config "$cfg/containerd.v3.toml" config migrate >"$cfg/containerd.toml"

    cat >"$RUN/cni/net.d/10-norsk-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "norsk-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$RUN/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

    cat >"$cfg/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $RUN/pki/ca.crt}
authorization: {mode: Webhook}
address: $NODE_IP
# cgroup v1 and no systemd: kubelet manages its cgroups directly, under a root of its own.
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
# iptables chains are kube-proxy's business; kubelet leaves them alone.
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$RUN/containerd/containerd.sock
clusterDNS: [$NODE_IP]
clusterDomain: $CLUSTER_DOMAIN
podLogsDir: $RUN/pod-logs
volumePluginDir: $RUN/volume-plugins
resolvConf: $RUN/config/resolv.conf
staticPodPath: ""
serializeImagePulls: false
# Pods are imported, never pulled; no garbage collection of images mid-run.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
# One run's node: report status often so Ready shows quickly.
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
EOF
    # Pods resolve through the cluster DNS only: nothing outside exists for them.
    printf 'nameserver %s\nsearch svc.%s %s\n' "$NODE_IP" "$CLUSTER_DOMAIN" "$CLUSTER_DOMAIN" >"$cfg/resolv.conf"

    cat >"$cfg/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $RUN/kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Zero leaves the global conntrack sysctls as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF

    cat >"$cfg/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $RUN/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
}

# The namespaces and what must be inside them before any daemon starts.
node_namespaces() {
    # --kill-child: the holder's namespaces (and everything in them) die with this unshare.
    unshare --mount --net --pid --fork --mount-proc --propagation private --kill-child \
        -- sleep infinity </dev/null >/dev/null 2>&1 &
    echo "$!" >"$RUN/pids/unshare"
    local holder="" i
    for i in $(seq 50); do
        holder="$(pgrep -P "$(cat "$RUN/pids/unshare")" sleep || true)"
        [[ -n "$holder" ]] && break
        sleep 0.1
    done
    [[ -n "$holder" ]] || { node_log "the namespace holder did not start"; return 1; }
    echo "$holder" >"$RUN/holder.pid"

    # Each write below stays inside the holder's namespaces.
    node_exec sh -euc "
        # Mount propagation inside this namespace only (kubelet checks for it): the peer
        # groups are new, so nothing propagates to the host's mounts.
        mount --make-rshared /
        # kubelet writes these three sysctls, which are global: give it files that already
        # hold the values it wants, bind-mounted over the /proc/sys entries here only.
        printf '1\n' >'$RUN/config/overcommit_memory'
        printf '10\n' >'$RUN/config/panic'
        printf '1\n' >'$RUN/config/panic_on_oops'
        mount --bind '$RUN/config/overcommit_memory' /proc/sys/vm/overcommit_memory
        mount --bind '$RUN/config/panic' /proc/sys/kernel/panic
        mount --bind '$RUN/config/panic_on_oops' /proc/sys/kernel/panic_on_oops
        # iptables' lock and anything else written under /run stays in this namespace.
        mount -t tmpfs -o mode=755 tmpfs /run
        # Paths kubelet and CNI hard-code (/var/lib/kubelet/device-plugins, /var/log/containers,
        # the CNI cache in /var/lib/cni) land in the run directory, not on the host.
        mkdir -p '$RUN/host/var-lib' '$RUN/host/var-log'
        mount --bind '$RUN/host/var-lib' /var/lib
        mount --bind '$RUN/host/var-log' /var/log
        # Processes on the node resolve through the cluster DNS, as pods do: simctl reaches
        # the simulator by its Service name.
        mount --bind '$RUN/config/resolv.conf' /etc/resolv.conf
        ip link set lo up
        ip link add nodeveth0 type veth peer name nodeveth1
        ip addr add $NODE_IP/24 dev nodeveth0
        ip link set nodeveth0 up
        ip link set nodeveth1 up
        # A default route so Service addresses route before kube-proxy's DNAT; it leads
        # nowhere beyond the namespace.
        ip route add default dev nodeveth0
        # Per network namespace: pods reach Services through this node.
        echo 1 >/proc/sys/net/ipv4/ip_forward
    "
}

node_control_plane() {
    local pki="$RUN/pki"
    node_daemon etcd "$CP_BIN/etcd" --name=norsk-e2e --data-dir="$RUN/etcd" \
        --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
        --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
        --initial-cluster=norsk-e2e=http://127.0.0.1:2380 --unsafe-no-fsync --log-level=warn
    node_daemon kube-apiserver "$CP_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
        --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
        --cert-dir="$RUN/apiserver-certs" \
        --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --client-ca-file="$pki/ca.crt" --authorization-mode=Node,RBAC \
        --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key" \
        --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
        --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --profiling=false \
        --kubelet-preferred-address-types=InternalIP
    wait_for "$NODE_TIMEOUT" "kube-apiserver /readyz" \
        node_exec curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
        "https://$NODE_IP:6443/readyz"
    node_daemon kube-controller-manager "$NODE_BIN/kube-controller-manager" \
        --kubeconfig="$RUN/kubeconfig" --authentication-kubeconfig="$RUN/kubeconfig" \
        --authorization-kubeconfig="$RUN/kubeconfig" --leader-elect=false \
        --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
        --use-service-account-credentials=true --cluster-name=norsk-e2e \
        --bind-address=127.0.0.1 --secure-port=10257 --cert-dir="$RUN/kcm-certs"
    node_daemon kube-scheduler "$NODE_BIN/kube-scheduler" --kubeconfig="$RUN/kubeconfig" \
        --authentication-kubeconfig="$RUN/kubeconfig" --authorization-kubeconfig="$RUN/kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259 --cert-dir="$RUN/scheduler-certs"
}

node_worker() {
    # kubelet wants its cgroup root to exist in every hierarchy.
    local hierarchy
    for hierarchy in /sys/fs/cgroup/*/; do
        mkdir -p "$hierarchy${CGROUP_ROOT#/}"
    done
    node_daemon containerd "$NODE_BIN/containerd" --config "$RUN/config/containerd.toml"
    wait_for 60 "containerd" node_exec "$NODE_BIN/ctr" --address "$RUN/containerd/containerd.sock" version
    local image
    for image in "$@"; do
        node_exec "$NODE_BIN/ctr" --address "$RUN/containerd/containerd.sock" -n k8s.io images import \
            --base-name "$(cat "$image.name")" "$image" >&2
    done
    node_daemon kubelet "$NODE_BIN/kubelet" --config="$RUN/config/kubelet.yaml" \
        --kubeconfig="$RUN/kubeconfig" --root-dir="$RUN/kubelet" --hostname-override="$NODE_NAME" \
        --node-ip="$NODE_IP" --cert-dir="$RUN/kubelet/pki"
    node_daemon kube-proxy "$NODE_BIN/kube-proxy" --config="$RUN/config/kube-proxy.yaml"
    node_daemon coredns "$NODE_BIN/coredns" -conf "$RUN/config/Corefile"
}

node_up() {
    mkdir -p "$RUN/logs" "$RUN/pids"
    printf 'NODE_BIN=%q\nCP_BIN=%q\n' "$NODE_BIN" "$CP_BIN" >"$RUN/binaries"
    CGROUP_ROOT="$(node_cgroup_root)"
    echo "$CGROUP_ROOT" >"$RUN/cgroup-root"
    node_host_fingerprint >"$RUN/host-before"
    node_pki
    node_configs
    node_namespaces
    node_control_plane
    node_worker "$@"
    wait_for "$NODE_TIMEOUT" "node $NODE_NAME Ready" \
        node_exec "$CP_BIN/kubectl" --kubeconfig "$RUN/kubeconfig" wait --for=condition=Ready \
        "node/$NODE_NAME" --timeout=2s
}

node_dump() {
    local k=(node_exec "$CP_BIN/kubectl" --kubeconfig "$RUN/kubeconfig")
    echo "== nodes, pods, events"
    "${k[@]}" get nodes -o wide || true
    "${k[@]}" get pods -A -o wide || true
    "${k[@]}" get events -A --sort-by=.lastTimestamp | tail -n 40 || true
    local log
    for log in kubelet containerd kube-apiserver kube-controller-manager kube-proxy coredns; do
        echo "== $log (last lines of $RUN/logs/$log.log)"
        tail -n 25 "$RUN/logs/$log.log" 2>/dev/null || true
    done
}

node_down() {
    [[ -f "$RUN/pids/unshare" ]] || return 0
    local unshare
    unshare="$(cat "$RUN/pids/unshare")"
    # Ask the daemons to stop (kubelet and containerd end their pods' processes), then
    # end the holder: with it go the PID namespace, the mounts and the network.
    local pidfile
    for pidfile in "$RUN"/pids/*; do
        [[ "$(basename "$pidfile")" == unshare ]] && continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    # The holder is PID 1 of the namespace: killing it kills everything in it, and unshare
    # (its parent) reaps it and exits, leaving no zombie behind.
    kill -9 "$(cat "$RUN/holder.pid")" 2>/dev/null || true
    local i
    for i in $(seq 100); do
        kill -0 "$unshare" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$unshare" 2>/dev/null || true
    wait "$unshare" 2>/dev/null || true
    # The nsenter processes that started the daemons end once their child is gone.
    for pidfile in "$RUN"/pids/*; do
        local pid
        pid="$(cat "$pidfile")"
        for i in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
    # The cgroups kubelet made, deepest first, in every hierarchy.
    local root hierarchy
    root="$(cat "$RUN/cgroup-root")"
    for hierarchy in /sys/fs/cgroup/*/; do
        [[ -d "$hierarchy${root#/}" ]] || continue
        for i in $(seq 50); do
            find "$hierarchy${root#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [[ -d "$hierarchy${root#/}" ]] || break
            sleep 0.2
        done
    done
    rm -f "$RUN/pids/unshare"
}

# Fails when the host differs from before node_up: mounts, links, namespaces, leftover
# paths, processes or cgroups.
node_check_host() {
    local problems=0
    node_host_fingerprint >"$RUN/host-after"
    if ! diff -u "$RUN/host-before" "$RUN/host-after"; then problems=1; fi
    local root hierarchy
    root="$(cat "$RUN/cgroup-root")"
    for hierarchy in /sys/fs/cgroup/*/; do
        if [[ -d "$hierarchy${root#/}" ]]; then
            echo "cgroup left: $hierarchy${root#/}"
            problems=1
        fi
    done
    # Every process this run started names its directory or the node's binaries.
    local left
    left="$(pgrep -f -- "^nsenter --target $(cat "$RUN/holder.pid") |^$NODE_BIN/|^$CP_BIN/" || true)"
    if kill -0 "$(cat "$RUN/holder.pid")" 2>/dev/null; then left+=" $(cat "$RUN/holder.pid")"; fi
    left="$(xargs <<<"$left")"
    if [[ -n "$left" ]]; then
        echo "processes left:"
        ps -o pid,ppid,stat,args -p "${left// /,}" | cut -c1-200
        problems=1
    fi
    return "$problems"
}
