# Shared by e2e/control-plane/build.sh and e2e/node/build.sh: the scratch Go module that
# builds binaries of k8s.io/kubernetes, and the version stamp they carry. Both scripts
# write the same go.mod, so their builds share Go's build cache.

# find_go: prints the go binary to use ($GO, else go on PATH, else /usr/local/go/bin/go).
find_go() {
    if [[ -n "${GO:-}" ]]; then
        echo "${GO}"
    elif command -v go >/dev/null 2>&1; then
        command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then
        echo /usr/local/go/bin/go
    else
        return 1
    fi
}

# write_kube_module GO KUBE_VERSION SRC_DIR: a module in SRC_DIR that requires
# k8s.io/kubernetes at KUBE_VERSION, with its staging modules pinned; also leaves the
# module's download metadata in SRC_DIR/kubernetes.json.
#
# The kubernetes module requires its staging modules (k8s.io/api, k8s.io/apimachinery,
# ...) at v0.0.0 and points them at ./staging with replace directives, which are ignored
# for a dependency. The list is read from the module's own go.mod and each is pinned to
# the published v0.X.Y cut from the same release.
write_kube_module() {
    local go="$1" version="$2" src="$3"
    rm -rf "${src}" && mkdir -p "${src}"
    local staging_version="v0.${version#v1.}"
    GOFLAGS="" GOTOOLCHAIN=local "${go}" mod download -json "k8s.io/kubernetes@${version}" >"${src}/kubernetes.json"
    local kube_mod
    kube_mod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' "${src}/kubernetes.json")"
    if [[ ! -f "${kube_mod}" ]]; then
        echo "cannot find go.mod of k8s.io/kubernetes@${version} (${kube_mod})" >&2
        return 1
    fi
    local staging
    staging="$(
        {
            awk '$2 == "v0.0.0" && $1 ~ /^k8s\.io\// { print $1 }' "${kube_mod}"
            awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "${kube_mod}"
        } | sort -u
    )"
    if [[ -z "${staging}" ]]; then
        echo "found no staging modules in ${kube_mod}" >&2
        return 1
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
        echo "require k8s.io/kubernetes ${version}"
        echo
        echo "replace ("
        local m
        for m in ${staging}; do
            printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_version}"
        done
        echo ")"
    } >"${src}/go.mod"
}

# kube_version_ldflags SRC_DIR KUBE_VERSION: the -X flags that stamp the version the way
# kubernetes' hack/lib/version.sh does, so /version and `kubectl version` report the
# release instead of v0.0.0-master (and kubelet's version skew checks pass).
kube_version_ldflags() {
    local src="$1" version="$2"
    local minor="${version#v1.}"
    minor="${minor%%.*}"
    local build_date
    build_date="$(sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p' "${src}/kubernetes.json")"
    local x="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        x+=" -X ${pkg}.gitVersion=${version}"
        x+=" -X ${pkg}.gitMajor=1"
        x+=" -X ${pkg}.gitMinor=${minor}"
        x+=" -X ${pkg}.gitTreeState=archive"
        x+=" -X ${pkg}.buildDate=${build_date:-1970-01-01T00:00:00Z}"
    done
    printf '%s' "${x}"
}
