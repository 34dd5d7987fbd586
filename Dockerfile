# syntax=docker/dockerfile:1
# sgl-router: KV-cache-aware router for SGLang / vLLM replicas.
#   docker build -t sgl-router .
#   docker run --rm -p 30000:30000 sgl-router --host 0.0.0.0 --mock-workers 4 --policy cache_aware --kv-events

FROM rust:1-bookworm AS builder
WORKDIR /src
# The workspace: manifests, lock, crate sources and the patched zeromq (the test fixtures are not needed).
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY crates ./crates
COPY benches ./benches
COPY vendor ./vendor
# With the embedding model runtime (feature embed: candle, CPU) for embedding signals.
RUN cargo build --release --locked -p sgl-router -p mock-engine --features sgl-router/embed \
 && strip target/release/sgl-router target/release/sgl-mock-engine

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home router
COPY --from=builder /src/target/release/sgl-router /usr/local/bin/sgl-router
COPY --from=builder /src/target/release/sgl-mock-engine /usr/local/bin/sgl-mock-engine
USER router
EXPOSE 30000
ENTRYPOINT ["sgl-router"]
CMD ["--host", "0.0.0.0", "--help"]
