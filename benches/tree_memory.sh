#!/usr/bin/env bash
# The cache-aware router's memory under long prompts with unique suffixes (issue 29's conditions):
# wrk -t2 -c64 for DURATION s with benches/wrk/prefix_groups.lua (BODY_BYTES-byte chats, 80 % of
# the text shared by one of 8 prefix groups, a random suffix of its own), through
# `sgl-router --policy cache_aware` with no tokenizer (as an `smg` user starts it) to 4 simulated
# engines without KV events (`sgl-mock-engine --fast --no-kv-events`): the text tree judges every
# worker and learns every request. Every STEP s it prints the router's requests per second over the
# step, its RSS and peak RSS (/proc/PID/status VmRSS, VmHWM), and the bytes its text tree holds
# (`router_policy_tree_bytes`); at the end its CPU seconds per 1,000 requests.
#
#   bash benches/tree_memory.sh [ROUTER_BIN ...]        (default: target/release/sgl-router)
# Environment: DURATION=60, STEP=5, BODY_BYTES=16384, EXTRA="" (more router flags, say
# "--approx-max-tree-bytes 33554432"). Needs wrk, curl. Ports: 31700-31710.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-60}"
STEP="${STEP:-5}"
export BODY_BYTES="${BODY_BYTES:-16384}"
read -r -a extra <<<"${EXTRA:-}"
command -v wrk >/dev/null || { echo "wrk is not installed: apt-get install wrk" >&2; exit 1; }
[ "${BUILD:-1}" = 1 ] && cargo build --release -q -p sgl-router -p mock-engine
source benches/lib.sh
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/sgl-router)

urls=()
for i in 1 2 3 4; do
  target/release/sgl-mock-engine --listen "127.0.0.1:$((31700 + i))" --fast --no-kv-events >/dev/null 2>&1 &
  pids+=($!)
  ready "http://127.0.0.1:$((31700 + i))/health"
  urls+=("http://127.0.0.1:$((31700 + i))")
done
metric_sum() { curl -sf "http://127.0.0.1:31710/metrics" | awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { printf "%d", s }'; }
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$2/status"; }

echo "== cache_aware, ${BODY_BYTES}-byte prompts with unique suffixes, wrk -t2 -c64, ${DURATION} s"
for bin in "${bins[@]}"; do
  "$bin" --port 31700 --prometheus-port 31710 --log-level error --policy "${POLICY:-cache_aware}" --worker-urls "${urls[@]}" "${extra[@]}" >/dev/null 2>&1 &
  router=$!
  pids+=("$router")
  ready_pid "http://127.0.0.1:31700/readiness" "$router"
  echo "-- $bin ${extra[*]}"
  printf "%6s %10s %10s %10s %12s\n" "t s" "req/s" "RSS MiB" "peak MiB" "tree MiB"
  wrk -t2 -c64 -d"${DURATION}s" -s benches/wrk/prefix_groups.lua "http://127.0.0.1:31700/v1/chat/completions" >/dev/null 2>&1 &
  load=$!
  t0=$(tree_ticks "$router")
  n0=$(metric_sum router_http_requests_total)
  start=$n0
  for t in $(seq "$STEP" "$STEP" "$DURATION"); do
    sleep "$STEP"
    n=$(metric_sum router_http_requests_total)
    tree=$(metric_sum router_policy_tree_bytes)
    printf "%6d %10d %10d %10d %12.1f\n" "$t" $(((n - n0) / STEP)) $(($(kib VmRSS "$router") / 1024)) \
      $(($(kib VmHWM "$router") / 1024)) "$(echo "$tree / 1048576" | bc -l)"
    n0=$n
  done
  wait "$load" || true
  total=$(( $(metric_sum router_http_requests_total) - start ))
  awk -v t="$(( $(tree_ticks "$router") - t0 ))" -v hz="$(getconf CLK_TCK)" -v n="$total" \
    'BEGIN { printf "requests %d, router CPU %.3f s per 1,000 requests\n", n, t / hz / n * 1000 }'
  stop_pid "$router"
done
cleanup
