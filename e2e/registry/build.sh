#!/usr/bin/env bash
# Builds crane (go-containerregistry) from the Go module proxy: its `crane registry serve`
# is the loopback OCI registry the chart's publishing test pushes to and installs from.
#
# Output goes to a cache directory outside the repository, keyed by the versions that
# change the result; a warm cache makes this a fast no-op. The last line on stdout is the
# bin directory; progress goes to stderr.
#
# Environment:
#   NORSK_CRANE_CACHE    cache root (default ~/.cache/norsk-auto-manager/crane)
#   NORSK_CRANE_VERSION  github.com/google/go-containerregistry version
#   GO                   go binary (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

# shellcheck source=../lib/kube-module.sh
source "$(cd "$(dirname "$0")" && pwd)/../lib/kube-module.sh"

VERSION="${NORSK_CRANE_VERSION:-v0.22.1}"
log() { printf 'registry/build.sh: %s\n' "$*" >&2; }

GO="$(find_go)" || {
    log "no Go toolchain found (install Go >= 1.26 or set GO=/path/to/go)"
    exit 1
}
key="$("$GO" env GOVERSION)-crane-${VERSION}"
dir="${NORSK_CRANE_CACHE:-${HOME}/.cache/norsk-auto-manager/crane}/${key}"
bin="${dir}/bin"
if [[ -x "${bin}/crane" ]]; then
    echo "${bin}"
    exit 0
fi
mkdir -p "${bin}"
# Tests running at once wait for one build instead of starting their own.
exec 9>"${dir}/.lock"
flock 9
if [[ ! -x "${bin}/crane" ]]; then
    start=$SECONDS
    log "building crane ${VERSION}"
    GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="${dir}/tmp" \
        "$GO" install -trimpath -ldflags "-s -w" "github.com/google/go-containerregistry/cmd/crane@${VERSION}" >&2
    mv -f "${dir}/tmp/crane" "${bin}/crane"
    log "crane built in $((SECONDS - start)) s"
fi
echo "${bin}"
