#!/usr/bin/env bash
# Live routing quality: replays a Mooncake trace as real HTTP requests (time
# compressed) through sgl-router in front of 8 simulated engines, once per
# policy, each against freshly started engines (the engines' caches must not
# carry over from one policy to the next). Reads cached_tokens from the
# engines' responses. Prints one table row per policy.
#   bash benches/live.sh [TRACE] [REQUESTS] [SPEEDUP]
# Another router (a peer) is measured the same way: start it on the engines'
# URLs, then run `sgl-router-bench live --trace T --router NAME=URL`.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
REQUESTS="${2:-1000}"
SPEEDUP="${3:-10}"
WORKERS=8
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; pids=(); }
trap cleanup EXIT

ready() { for _ in $(seq 1 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; return 1; }

header=1
for policy in round_robin power_of_two approx_tree cache_aware; do
  urls=()
  for i in $(seq 1 "$WORKERS"); do
    port=$((32000 + i))
    "$BIN/sgl-mock-engine" --listen "127.0.0.1:$port" --capacity-tokens 400000 --speedup "$SPEEDUP" >/dev/null 2>&1 & pids+=($!)
    urls+=("http://127.0.0.1:$port")
  done
  for u in "${urls[@]}"; do ready "$u/health"; done
  extra=()
  [ "$policy" = cache_aware ] && extra=(--kv-events)
  "$BIN/sgl-router" --port 32100 --worker-urls "$(IFS=,; echo "${urls[*]}")" --policy "$policy" "${extra[@]}" \
    >/dev/null 2>&1 & pids+=($!)
  ready http://127.0.0.1:32100/readiness
  out=$("$BIN/sgl-router-bench" live --trace "$TRACE" --limit "$REQUESTS" --speedup "$SPEEDUP" \
    --router "$policy=http://127.0.0.1:32100")
  if [ $header = 1 ]; then echo "$out" | head -2; header=0; fi
  echo "$out" | tail -1
  cleanup
  sleep 0.5
done
