#!/usr/bin/env bash
# Builds the container image without a Docker daemon, following the Dockerfile's recipe:
# the static musl release binary as the build stage makes it, then the runtime image
# assembled with umoci as an OCI layout (the distroless/static nonroot base's contents:
# users, CA certificates, /tmp, /home/nonroot). e2e/image/check.py then holds the result
# against the Dockerfile's final stage, so the Dockerfile cannot drift from what the
# end-to-end run proves.
#
#   e2e/image/build.sh OUT_DIR      # OUT_DIR/norsk-auto-manager.tar (+ .name), OUT_DIR/layout
#
# Also leaves kubectl-norsk beside the image's binary, built in the same cargo run, in
# target/x86_64-unknown-linux-musl/release. The last line on stdout is that directory.
#
# Needs: rustup's x86_64-unknown-linux-musl target, musl-tools, umoci, ca-certificates,
# python3 (the check).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: e2e/image/build.sh OUT_DIR}"
TARGET=x86_64-unknown-linux-musl
TAG="${IMAGE_TAG:-e2e}"
log() { printf 'image/build.sh: %s\n' "$*" >&2; }

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
SOURCE="$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)"
[[ "$SOURCE" == https://* ]] || SOURCE=https://norsk.video

start=$SECONDS
log "building the static release binaries ($TARGET)"
# As the Dockerfile's build stage: cargo build --release --locked --target <arch>-unknown-linux-musl.
# The commit goes in as the Dockerfile passes it (REVISION), so the binary's build_info and
# --version name the commit the image's label names.
(cd "$ROOT" && NORSK_REVISION="$REVISION" cargo build --release --locked --target "$TARGET" --bin norsk-auto-manager --bin kubectl-norsk)
release="$ROOT/target/$TARGET/release"
log "binaries built in $((SECONDS - start))s"

rm -rf "$OUT/layout" "$OUT/bundle"
mkdir -p "$OUT"
echo "$REVISION" >"$OUT/revision"
umoci init --layout "$OUT/layout"
umoci new --image "$OUT/layout:$TAG"
umoci unpack --image "$OUT/layout:$TAG" "$OUT/bundle" >/dev/null
rootfs="$OUT/bundle/rootfs"

# What distroless/static-debian12:nonroot provides and the binary relies on.
install -d -m 0755 "$rootfs/etc" "$rootfs/etc/ssl/certs" "$rootfs/usr/local/bin"
install -d -m 1777 "$rootfs/tmp"
install -d -m 0700 -o 65532 -g 65532 "$rootfs/home/nonroot"
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
tty:x:5:
staff:x:50:
nobody:x:65534:
nonroot:x:65532:
GROUP
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
# Manager over TLS verifies against the system roots (tonic's native roots).
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# COPY --from=build /norsk-auto-manager /usr/local/bin/norsk-auto-manager
install -m 0755 "$release/norsk-auto-manager" "$rootfs/usr/local/bin/norsk-auto-manager"

umoci repack --image "$OUT/layout:$TAG" "$OUT/bundle"
rm -rf "$OUT/bundle"
# The final stage's metadata, written out here and checked against the Dockerfile below.
umoci config --image "$OUT/layout:$TAG" \
    --config.user 65532:65532 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --config.exposedports 8080/tcp --config.exposedports 6789/tcp \
    --config.entrypoint /usr/local/bin/norsk-auto-manager \
    --config.cmd operator \
    --config.label "org.opencontainers.image.title=norsk-auto-manager" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.revision=$REVISION" \
    --config.label "org.opencontainers.image.source=$SOURCE" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0" \
    --history.created_by "e2e/image/build.sh"
umoci gc --layout "$OUT/layout"

python3 "$ROOT/e2e/image/check.py" "$ROOT/Dockerfile" "$OUT/layout" "$TAG" \
    "VERSION=$VERSION" "REVISION=$REVISION" "SOURCE=$SOURCE"

(cd "$OUT/layout" && tar -cf "$OUT/norsk-auto-manager.tar.tmp" .)
mv -f "$OUT/norsk-auto-manager.tar.tmp" "$OUT/norsk-auto-manager.tar"
# Pods name the image `norsk-auto-manager:TAG`, which the runtime reads as docker.io/library/...
echo docker.io/library/norsk-auto-manager >"$OUT/norsk-auto-manager.tar.name"
log "image norsk-auto-manager:$TAG in $OUT ($((SECONDS - start))s)"
echo "$release"
