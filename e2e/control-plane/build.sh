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

# shellcheck source=../lib/kube-module.sh
source "$(cd "$(dirname "$0")" && pwd)/../lib/kube-module.sh"

ETCD_VERSION="${NORSK_CP_ETCD_VERSION:-v3.6.16}"
KUBE_VERSION="${NORSK_CP_KUBE_VERSION:-v1.34.4}"
# Helm 3.19 is built against the Kubernetes 1.34 client libraries, matching the server.
HELM_VERSION="${NORSK_CP_HELM_VERSION:-v3.19.5}"
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE=1

log() { printf 'control-plane/build.sh: %s\n' "$*" >&2; }

GO="$(find_go)" || {
    log "no Go toolchain found (install Go >= 1.26 or set GO=/path/to/go)"
    exit 1
}
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
    write_kube_module "$GO" "${KUBE_VERSION}" "${src}"
    (
        cd "${src}"
        mkdir -p out
        "$GO" build -trimpath -ldflags "${ldflags_common}$(kube_version_ldflags "${src}" "${KUBE_VERSION}")" -o out/ \
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
