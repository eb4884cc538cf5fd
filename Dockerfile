# syntax=docker/dockerfile:1
# One image for the operator (`operator`, the default) and the Manager simulator (`sim`):
# a statically linked binary on distroless/static, running as non-root.
#
#   docker build -t norsk-auto-manager:dev .
#   docker run --rm norsk-auto-manager:dev sim --listen 0.0.0.0:6789
#
# e2e/image/build.sh assembles the same image without a Docker daemon (the end-to-end run's
# image) and e2e/image/check.py fails when it and this file's final stage disagree.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src

# Dependencies only: this layer is rebuilt when Cargo.toml, Cargo.lock or proto/ change,
# not on every source change. Placeholder sources stand in for the crate's own.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY benches benches
RUN mkdir -p src/bin \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/kubectl-norsk.rs \
 && touch src/lib.rs \
 && cargo build --release --locked --target "$(uname -m)-unknown-linux-musl" --bin norsk-auto-manager \
 && rm -rf src

# The release build. COPY keeps the files' times, which may be older than the placeholder
# build: touch them so cargo rebuilds the crate. The image has no .git: the commit that
# `--version` and `norsk_automanager_build_info` report comes from REVISION.
ARG REVISION=unknown
COPY src src
RUN find src -name '*.rs' -exec touch {} + \
 && NORSK_REVISION="$REVISION" cargo build --release --locked --target "$(uname -m)-unknown-linux-musl" --bin norsk-auto-manager \
 && cp "target/$(uname -m)-unknown-linux-musl/release/norsk-auto-manager" /norsk-auto-manager

FROM gcr.io/distroless/static-debian12:nonroot
# Set by a release build: --build-arg VERSION=... --build-arg REVISION="$(git rev-parse HEAD)".
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://norsk.video
LABEL org.opencontainers.image.title="norsk-auto-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /norsk-auto-manager /usr/local/bin/norsk-auto-manager
# distroless's nonroot user; the chart sets the same in the pod's securityContext.
USER 65532:65532
EXPOSE 8080 6789
ENTRYPOINT ["/usr/local/bin/norsk-auto-manager"]
CMD ["operator"]
