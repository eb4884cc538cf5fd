#!/usr/bin/env bash
# Builds the binaries of a single Kubernetes node (runc, containerd, CNI plugins, kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS) and the pause image from
# source fetched through the Go module proxy, for e2e/node/run.sh on machines without
# Docker or direct internet access.
#
# Output goes to a cache directory outside the repository, keyed by every version that
# changes the result; a warm cache makes this script a fast no-op. The Kubernetes
# binaries are built through the same scratch module as e2e/control-plane/build.sh's
# kube-apiserver (e2e/lib/kube-module.sh), so they share Go's build cache with it.
# The last line on stdout is the cache directory (bin/ and images/ under it); progress
# goes to stderr.
#
# Needs: Go >= 1.26, gcc, libseccomp-dev (runc's seccomp support), umoci (the pause image).
#
# Environment:
#   NORSK_NODE_CACHE            cache root (default ~/.cache/norsk-auto-manager/node)
#   NORSK_CP_KUBE_VERSION       k8s.io/kubernetes version (as for the control plane)
#   NORSK_NODE_RUNC_VERSION, NORSK_NODE_CONTAINERD_VERSION, NORSK_NODE_CNI_VERSION,
#   NORSK_NODE_COREDNS_VERSION
#   GO                          go binary (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../lib/kube-module.sh
source "${HERE}/../lib/kube-module.sh"

KUBE_VERSION="${NORSK_CP_KUBE_VERSION:-v1.34.4}"
RUNC_VERSION="${NORSK_NODE_RUNC_VERSION:-v1.5.3}"
CONTAINERD_VERSION="${NORSK_NODE_CONTAINERD_VERSION:-v2.4.2}"
CNI_VERSION="${NORSK_NODE_CNI_VERSION:-v1.10.0}"
COREDNS_VERSION="${NORSK_NODE_COREDNS_VERSION:-v1.12.4}"
# The tag kubelet and containerd expect of the sandbox image for this Kubernetes release.
PAUSE_TAG=3.10.1
# Bump when the recipe below changes in a way that changes the output.
RECIPE=1

log() { printf 'node/build.sh: %s\n' "$*" >&2; }

GO="$(find_go)" || {
    log "no Go toolchain found (install Go >= 1.26 or set GO=/path/to/go)"
    exit 1
}
GO_VERSION="$("$GO" env GOVERSION)"
key="r${RECIPE}-${GO_VERSION}-kube-${KUBE_VERSION}-runc-${RUNC_VERSION}-containerd-${CONTAINERD_VERSION}-cni-${CNI_VERSION}-coredns-${COREDNS_VERSION}"
cache_root="${NORSK_NODE_CACHE:-${HOME}/.cache/norsk-auto-manager/node}"
dir="${cache_root}/${key}"
bin="${dir}/bin"
images="${dir}/images"
binaries=(runc containerd containerd-shim-runc-v2 ctr bridge host-local loopback portmap
    kubelet kube-controller-manager kube-scheduler kube-proxy coredns)

all_present() {
    local b
    for b in "${binaries[@]}"; do
        [[ -x "${bin}/${b}" ]] || return 1
    done
    [[ -f "${images}/pause.tar" ]]
}

if all_present; then
    echo "${dir}"
    exit 0
fi

mkdir -p "${bin}" "${images}" "${dir}/src"
# Two runs asking at once: the second waits for the first instead of building again.
exec 9>"${dir}/.lock"
flock 9
if all_present; then
    echo "${dir}"
    exit 0
fi

# Never let a newer go directive in a dependency trigger a toolchain download.
export GOTOOLCHAIN=local
export CGO_ENABLED=0
start=$SECONDS

# `go install` into a scratch GOBIN, then move into place: an interrupted build never
# leaves a truncated binary that the presence check above would accept.
go_install() {
    local gobin="${dir}/src/gobin"
    mkdir -p "${gobin}"
    (cd "${dir}/src" && GOBIN="${gobin}" GOFLAGS="" "$GO" install -trimpath -ldflags "-s -w" "$@")
    local f
    for f in "${gobin}"/*; do
        mv -f "${f}" "${bin}/$(basename "${f}")"
    done
}

build_runc() {
    [[ -x "${bin}/runc" ]] && return 0
    log "building runc ${RUNC_VERSION}"
    # runc needs cgo for seccomp (Debian's libseccomp-dev). Upstream's default libpathrs
    # tag needs a Rust library that is not packaged here: leave it out.
    CGO_ENABLED=1 go_install -tags "seccomp urfave_cli_no_docs" \
        "github.com/opencontainers/runc@${RUNC_VERSION}"
}

build_containerd() {
    [[ -x "${bin}/containerd" && -x "${bin}/containerd-shim-runc-v2" && -x "${bin}/ctr" ]] && return 0
    log "building containerd ${CONTAINERD_VERSION}"
    local m="github.com/containerd/containerd/v2"
    go_install "${m}/cmd/containerd@${CONTAINERD_VERSION}" \
        "${m}/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}" \
        "${m}/cmd/ctr@${CONTAINERD_VERSION}"
}

build_cni() {
    [[ -x "${bin}/bridge" && -x "${bin}/host-local" && -x "${bin}/loopback" && -x "${bin}/portmap" ]] && return 0
    log "building CNI plugins ${CNI_VERSION}"
    local m="github.com/containernetworking/plugins/plugins"
    go_install "${m}/main/bridge@${CNI_VERSION}" "${m}/ipam/host-local@${CNI_VERSION}" \
        "${m}/main/loopback@${CNI_VERSION}" "${m}/meta/portmap@${CNI_VERSION}"
}

build_coredns() {
    [[ -x "${bin}/coredns" ]] && return 0
    log "building CoreDNS ${COREDNS_VERSION}"
    go_install "github.com/coredns/coredns@${COREDNS_VERSION}"
}

build_kube() {
    local want=(kubelet kube-controller-manager kube-scheduler kube-proxy) b missing=0
    for b in "${want[@]}"; do [[ -x "${bin}/${b}" ]] || missing=1; done
    ((missing)) || return 0
    log "building ${want[*]} ${KUBE_VERSION}"
    local src="${dir}/src/kube"
    write_kube_module "$GO" "${KUBE_VERSION}" "${src}"
    (
        cd "${src}"
        mkdir -p out
        GOFLAGS="-mod=mod" "$GO" build -trimpath -ldflags "-s -w$(kube_version_ldflags "${src}" "${KUBE_VERSION}")" \
            -o out/ k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
    )
    for b in "${want[@]}"; do mv -f "${src}/out/${b}" "${bin}/${b}"; done
}

# The sandbox ("pause") image: Kubernetes' own pause.c from the module cache, linked
# statically, packed as a one-layer OCI image with umoci and archived for `ctr images import`.
build_pause() {
    [[ -f "${images}/pause.tar" ]] && return 0
    log "building the pause image ${PAUSE_TAG}"
    local src="${dir}/src/kube"
    [[ -f "${src}/kubernetes.json" ]] || write_kube_module "$GO" "${KUBE_VERSION}" "${src}"
    local kube_dir
    kube_dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' "${src}/kubernetes.json")"
    local work="${dir}/src/pause"
    rm -rf "${work}" && mkdir -p "${work}/rootfs"
    gcc -Os -static -DVERSION="v${PAUSE_TAG}" -o "${work}/pause" "${kube_dir}/build/pause/linux/pause.c"
    strip "${work}/pause"
    oci_image_from_dir "${work}/layout" "pause:${PAUSE_TAG}" "${work}" pause \
        --config.entrypoint /pause --config.user 65535:65535
    (cd "${work}/layout" && tar -cf "${images}/pause.tar.tmp" .)
    echo registry.k8s.io/pause >"${images}/pause.tar.name"
    mv -f "${images}/pause.tar.tmp" "${images}/pause.tar"
}

# oci_image_from_dir LAYOUT REF SRC FILE... -- UMOCI-CONFIG-ARGS: a scratch image holding the
# named files of SRC at the root.
oci_image_from_dir() {
    local layout="$1" ref="$2" src="$3"
    shift 3
    local files=()
    while (($#)) && [[ "$1" != --* ]]; do files+=("$1"); shift; done
    umoci init --layout "${layout}"
    umoci new --image "${layout}:${ref#*:}"
    umoci unpack --image "${layout}:${ref#*:}" "${layout}.bundle" >/dev/null
    local f
    for f in "${files[@]}"; do cp -a "${src}/${f}" "${layout}.bundle/rootfs/${f}"; done
    umoci repack --image "${layout}:${ref#*:}" "${layout}.bundle"
    umoci config --image "${layout}:${ref#*:}" "$@"
    umoci gc --layout "${layout}"
    rm -rf "${layout}.bundle"
}

build_runc
build_containerd
build_cni
build_coredns
build_kube
build_pause

all_present || {
    log "build finished but outputs are missing in ${dir}"
    exit 1
}
log "built in $((SECONDS - start))s into ${dir}"
echo "${dir}"
