#!/usr/bin/env bash
# Router overhead against a fast simulated engine (no simulated time), in one run:
# direct, through sgl-router round_robin, and through sgl-router cache_aware
# (KV events, chats with a repeated 16 KiB system prompt: tokenization included).
# Also the router's CPU seconds per 1,000 requests. Prints the table of
# docs/benchmarks.md ("Router overhead").
#   bash benches/overhead.sh [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${1:-2000}"
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$BIN/sgl-mock-engine" --listen 127.0.0.1:31001 --fast >/dev/null 2>&1 & pids+=($!)
sleep 1
"$BIN/sgl-router" --port 31010 --worker-urls http://127.0.0.1:31001 --policy round_robin >/dev/null 2>&1 & rr=$!; pids+=($rr)
"$BIN/sgl-router" --port 31011 --worker-urls http://127.0.0.1:31001 --policy cache_aware --kv-events >/dev/null 2>&1 & ca=$!; pids+=($ca)
for port in 31010 31011; do
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readiness" >/dev/null && break; sleep 0.1; done
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before_rr=$(cpu "$rr"); before_ca=$(cpu "$ca")
"$BIN/sgl-router-bench" overhead --engine-url http://127.0.0.1:31001 \
  --router round_robin=http://127.0.0.1:31010,cache_aware=http://127.0.0.1:31011 --requests "$REQUESTS"
after_rr=$(cpu "$rr"); after_ca=$(cpu "$ca")
ticks=$(getconf CLK_TCK)
# Each router served (warm-up + REQUESTS) x 4 configurations.
served=$(( (REQUESTS + 8) * 4 ))
echo
echo "router CPU per 1,000 requests: round_robin $(echo "scale=3; ($after_rr - $before_rr) / $ticks * 1000 / $served" | bc) s," \
     "cache_aware $(echo "scale=3; ($after_ca - $before_ca) / $ticks * 1000 / $served" | bc) s"
