#!/usr/bin/env bash
# Routing quality on the Mooncake traces: every policy and the oracle bounds,
# one router (with an SVG chart per trace); then two routers with 500 ms of
# event lag; then a load sweep (slower prefill = busier fleet). Prints the
# tables of docs/benchmarks.md ("Routing quality").
#   bash benches/routing_quality.sh [TRACE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
TRACES="${1:-../shared/traces/mooncake}"
cargo build --release -q -p bench
BIN=target/release/sgl-router-bench
mkdir -p docs/img
for t in synthetic conversation; do
  echo "## $t trace"
  "$BIN" sim --trace "$TRACES/${t}_trace.jsonl" --plot "docs/img/sim_${t}.svg" \
    --policy round_robin,power_of_two,least_load,approx_tree,cache_aware,min_ttft,oracle_pooled_lru,oracle_belady,oracle_infinite
  echo
  "$BIN" sim --trace "$TRACES/${t}_trace.jsonl" --policy cache_aware,min_ttft,approx_tree --routers 2 --event-lag-ms 500
  echo
  for speed in 12000 9000; do
    "$BIN" sim --trace "$TRACES/${t}_trace.jsonl" --speed "$speed" \
      --policy round_robin,cache_aware,min_ttft,oracle_pooled_lru
    echo
  done
done
