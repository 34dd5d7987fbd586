# syntax=docker/dockerfile:1
# sgl-router: KV-cache-aware router for SGLang / vLLM replicas.
#   docker build -t sgl-router --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --rm -p 30000:30000 sgl-router --host 0.0.0.0 --mock-workers 4 --policy cache_aware --kv-events
# Without a registry or a Docker engine, tools/image/build.sh builds the same layout from
# Debian's packages as an OCI archive (docs/deploy.md).

FROM debian:bookworm-slim AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home router

FROM rust:1-bookworm AS builder
WORKDIR /src
# The workspace: manifests, lock, crate sources and the patched zeromq (the test fixtures are not needed).
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY crates ./crates
COPY benches ./benches
COPY vendor ./vendor
COPY tools/image/sbom.py ./tools/image/sbom.py
# With the embedding model runtime (feature embed: candle, CPU) for embedding signals.
RUN cargo build --release --locked -p sgl-router --features embed \
 && cargo build --release --locked -p mock-engine \
 && strip target/release/sgl-router target/release/sgl-mock-engine
# The SBOM: the crates linked in and the Debian packages of the base.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE_DATE_EPOCH=0
COPY --from=base /var/lib/dpkg /base/var/lib/dpkg
RUN python3 tools/image/sbom.py --repo /src --root /base --features sgl-router/embed \
      --packages sgl-router,mock-engine --name sgl-router --version "$VERSION" \
      --revision "$REVISION" --created "$SOURCE_DATE_EPOCH" --out /src/sbom.spdx.json

FROM base
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sgl-router" \
      org.opencontainers.image.description="KV-cache-aware router for SGLang and vLLM replicas" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.source="https://github.com/sgl-router/sgl-router" \
      org.opencontainers.image.url="https://github.com/sgl-router/sgl-router" \
      org.opencontainers.image.documentation="https://github.com/sgl-router/sgl-router/blob/main/docs/deploy.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
COPY --from=builder /src/target/release/sgl-router /usr/local/bin/sgl-router
COPY --from=builder /src/target/release/sgl-mock-engine /usr/local/bin/sgl-mock-engine
COPY --from=builder /src/sbom.spdx.json /usr/share/doc/sgl-router/sbom.spdx.json
USER router
WORKDIR /
EXPOSE 30000
ENTRYPOINT ["sgl-router"]
CMD ["--host", "0.0.0.0", "--help"]
