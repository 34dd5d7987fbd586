#!/usr/bin/env bash
# Embeddings run off the serving threads (docs/benchmarks.md, "Embeddings and the serving
# threads"): one simulated engine, the router with the embedding model and
# benches/data/embedding_isolation.yaml in front of it. Small explicit-model requests (no
# embedding) are measured straight to the engine and through the router, first alone, then
# while CLIENTS more clients keep the embedding pool busy with `model: "auto"` requests whose
# texts are all new. The router's added p50 (+p50 ms, against the engine in the same run) is
# the figure: embeddings must not hold up the serving threads.
#   bash benches/embedding_isolation.sh [CLIENTS] [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS="${1:-4}"
REQUESTS="${2:-4000}"
cargo build --release -q --locked -p sgl-router --features embed -p mock-engine -p bench
BIN=target/release
source benches/lib.sh
eval "$(bash tools/embed_eval/fetch.sh "${TMPDIR:-/tmp}/sgl-router-embed")"
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31201 --model-id default --fast >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31201/health
work=$(mktemp -d); tmpdirs+=("$work")
sed 's|^    served_model: default|    served_model: default\n    workers: [http://127.0.0.1:31201]|' \
  benches/data/embedding_isolation.yaml >"$work/routing.yaml"
"$BIN/sgl-router" --port 31200 --routing-config "$work/routing.yaml" \
  --embedding-model-path "$SGL_ROUTER_EMBED_MODEL" --log-level warn >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31200/readiness
common=(--engine-url http://127.0.0.1:31201 --router router=http://127.0.0.1:31200
        --concurrency 1,16 --body-bytes 200 --requests "$REQUESTS")
echo "== alone"
"$BIN/sgl-router-bench" overhead "${common[@]}"
echo "== with $CLIENTS clients keeping the embedding pool busy"
"$BIN/sgl-router-bench" overhead "${common[@]}" --background-url http://127.0.0.1:31200 --background-clients "$CLIENTS"
