#!/usr/bin/env bash
# Builds the binaries of a throwaway Kubernetes control plane (etcd, kube-apiserver,
# kubectl, helm) from source fetched through the Go module proxy, so tests can run
# against a real API server on machines without Docker or direct internet access.
#
# Output goes to a cache directory outside the repository, keyed by every version
# that changes the result, and a warm cache makes this script a fast no-op.
# The last line on stdout is the bin directory; progress goes to stderr.
#
# Environment:
#   NORSK_CP_CACHE          cache root (default ~/.cache/norsk-auto-manager/control-plane)
#   NORSK_CP_ETCD_VERSION   go.etcd.io/etcd/server/v3 version
#   NORSK_CP_KUBE_VERSION   k8s.io/kubernetes version (kube-apiserver, kubectl)
#   NORSK_CP_HELM_VERSION   helm.sh/helm/v3 version
#   GO                      go binary (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

ETCD_VERSION="${NORSK_CP_ETCD_VERSION:-v3.6.16}"
KUBE_VERSION="${NORSK_CP_KUBE_VERSION:-v1.34.4}"
# Helm 3.19 is built against the Kubernetes 1.34 client libraries, matching the server.
HELM_VERSION="${NORSK_CP_HELM_VERSION:-v3.19.5}"
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE=1

log() { printf 'control-plane/build.sh: %s\n' "$*" >&2; }

if [[ -z "${GO:-}" ]]; then
    if command -v go >/dev/null 2>&1; then
        GO="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then
        GO=/usr/local/go/bin/go
    else
        log "no Go toolchain found (install Go >= 1.26 or set GO=/path/to/go)"
        exit 1
    fi
fi

GO_VERSION="$("$GO" env GOVERSION)"
key="r${RECIPE}-${GO_VERSION}-etcd-${ETCD_VERSION}-kube-${KUBE_VERSION}-helm-${HELM_VERSION}"
cache_root="${NORSK_CP_CACHE:-${HOME}/.cache/norsk-auto-manager/control-plane}"
dir="${cache_root}/${key}"
bin="${dir}/bin"
binaries=(etcd kube-apiserver kubectl helm)

all_present() {
    local b
    for b in "${binaries[@]}"; do
        [[ -x "${bin}/${b}" ]] || return 1
    done
}

if all_present; then
    echo "${bin}"
    exit 0
fi

mkdir -p "${bin}" "${dir}/src"
# Test binaries run in parallel and may all ask for the binaries at once: the lock
# makes the second caller wait for the first build instead of starting its own.
exec 9>"${dir}/.lock"
flock 9
if all_present; then
    echo "${bin}"
    exit 0
fi

# Never let a newer go directive in a dependency trigger a toolchain download.
export GOTOOLCHAIN=local
export CGO_ENABLED=0
# Scratch modules have no go.sum checked in: let the go command resolve and record it.
export GOFLAGS="-mod=mod ${GOFLAGS:-}"
ldflags_common="-s -w"
start=$SECONDS

# Writes the binary to a temporary name first so an interrupted build never leaves a
# truncated file that the presence check above would accept.
install_bin() {
    local name="$1" built="$2"
    chmod +x "${built}"
    mv -f "${built}" "${bin}/${name}"
}

build_etcd() {
    [[ -x "${bin}/etcd" ]] && return 0
    log "building etcd ${ETCD_VERSION}"
    local src="${dir}/src/etcd"
    rm -rf "${src}" && mkdir -p "${src}"
    # `go install pkg@version` refuses modules whose go.mod has replace directives (etcd's
    # does), hence a scratch module that requires the server module and builds its main.
    cat >"${src}/go.mod" <<EOF
module norsk.local/control-plane/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
EOF
    (
        cd "${src}"
        "$GO" mod download go.etcd.io/etcd/server/v3
        "$GO" build -trimpath -ldflags "${ldflags_common}" -o "${bin}/.etcd.tmp" go.etcd.io/etcd/server/v3
    )
    install_bin etcd "${bin}/.etcd.tmp"
}

build_kube() {
    [[ -x "${bin}/kube-apiserver" && -x "${bin}/kubectl" ]] && return 0
    log "building kube-apiserver and kubectl ${KUBE_VERSION}"
    local src="${dir}/src/kube"
    rm -rf "${src}" && mkdir -p "${src}"
    local staging_version="v0.${KUBE_VERSION#v1.}"

    # The kubernetes module requires its staging modules (k8s.io/api, k8s.io/apimachinery,
    # ...) at v0.0.0 and points them at ./staging with replace directives, which are
    # ignored for a dependency. Read that list from the module's own go.mod and pin each
    # to the published v0.X.Y that was cut from the same release.
    "$GO" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" >"${src}/kubernetes.json"
    local kube_mod
    kube_mod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' "${src}/kubernetes.json")"
    if [[ ! -f "${kube_mod}" ]]; then
        log "cannot find go.mod of k8s.io/kubernetes@${KUBE_VERSION} (${kube_mod})"
        exit 1
    fi
    local staging
    staging="$(
        {
            awk '$2 == "v0.0.0" && $1 ~ /^k8s\.io\// { print $1 }' "${kube_mod}"
            awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "${kube_mod}"
        } | sort -u
    )"
    if [[ -z "${staging}" ]]; then
        log "found no staging modules in ${kube_mod}"
        exit 1
    fi
    # Run-time defaults (GODEBUG) follow the main module, so carry over kubernetes' own.
    local go_line godebug_line
    go_line="$(grep -m1 '^go ' "${kube_mod}")"
    godebug_line="$(grep -m1 '^godebug ' "${kube_mod}" || true)"
    {
        echo "module norsk.local/control-plane/kube"
        echo
        echo "${go_line}"
        [[ -n "${godebug_line}" ]] && echo "${godebug_line}"
        echo
        echo "require k8s.io/kubernetes ${KUBE_VERSION}"
        echo
        echo "replace ("
        local m
        for m in ${staging}; do
            printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_version}"
        done
        echo ")"
    } >"${src}/go.mod"

    # Stamp the version the way kubernetes' hack/lib/version.sh does, so /version and
    # `kubectl version` report the release instead of v0.0.0-master.
    local minor="${KUBE_VERSION#v1.}"
    minor="${minor%%.*}"
    local build_date
    build_date="$(sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p' "${src}/kubernetes.json")"
    local x="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        x+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
        x+=" -X ${pkg}.gitMajor=1"
        x+=" -X ${pkg}.gitMinor=${minor}"
        x+=" -X ${pkg}.gitTreeState=archive"
        x+=" -X ${pkg}.buildDate=${build_date:-1970-01-01T00:00:00Z}"
    done
    (
        cd "${src}"
        mkdir -p out
        "$GO" build -trimpath -ldflags "${ldflags_common}${x}" -o out/ \
            k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
    )
    install_bin kube-apiserver "${src}/out/kube-apiserver"
    install_bin kubectl "${src}/out/kubectl"
}

build_helm() {
    [[ -x "${bin}/helm" ]] && return 0
    log "building helm ${HELM_VERSION}"
    local gobin="${dir}/src/helm-bin"
    rm -rf "${gobin}" && mkdir -p "${gobin}"
    (
        cd "${dir}/src"
        GOBIN="${gobin}" GOFLAGS="" "$GO" install -trimpath \
            -ldflags "${ldflags_common} -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
            "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
    )
    install_bin helm "${gobin}/helm"
}

build_etcd
build_kube
build_helm

all_present || {
    log "build finished but binaries are missing in ${bin}"
    exit 1
}
log "built in $((SECONDS - start))s into ${bin}"
echo "${bin}"
