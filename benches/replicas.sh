#!/usr/bin/env bash
# Router replicas sharing state (docs/benchmarks.md, "Replicas sharing state"): a Mooncake
# trace replayed (time compressed) through 1, 2 and 4 sgl-router replicas (cache_aware, KV
# events) behind nginx as a round-robin load balancer (as a Kubernetes Service spreads
# connections), in front of 8 simulated engines publishing real KV events, each run against
# freshly started engines. The replicas run alone (each on its own view) and sharing state
# through one redis-server (--shared-state). One row per run: hit rate, TTFT mean/p50/p99
# (from the bench), and the hottest worker's share of the requests (max over mean).
#   bash benches/replicas.sh [TRACE] [REQUESTS] [SPEEDUP]
# ENGINE_SPEEDUP (default SPEEDUP): the engines' own speed-up; a trace replayed faster than
# the engines run saturates them (SPEEDUP=40 ENGINE_SPEEDUP=10: four times the load).
# MAX_OUTPUT (default 0: one token): generate the trace's output lengths up to N tokens, so
# that requests stay in flight long enough for the load to steer placements.
# TRACE=hot: a generated trace (written to a temporary file) in which every request shares one
# 16-block prefix and adds 4 blocks of its own, one every 10 ms: the hot prefix all replicas
# would send to its one holder (the herd).
# RUNS="1 4 4s": only these (N: N replicas alone, Ns: N replicas sharing).
# Needs nginx and redis-server (apt-get install nginx-light redis-server), curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
REQUESTS="${2:-1000}"
SPEEDUP="${3:-10}"
ENGINE_SPEEDUP="${ENGINE_SPEEDUP:-$SPEEDUP}"
WORKERS=8
REDIS="${REDIS:-$(command -v redis-server || echo /usr/bin/redis-server)}"
[ -x "$REDIS" ] || { echo "redis-server is not installed: apt-get install redis-server" >&2; exit 1; }
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
source benches/lib.sh
tmp=$(mktemp -d); tmpdirs+=("$tmp")
if [ "$TRACE" = hot ]; then
  TRACE=$(mktemp --suffix=.jsonl); generated=$TRACE
  python3 - "$REQUESTS" >"$TRACE" <<'PY'
import json, sys
n = int(sys.argv[1])
for i in range(n):
    hashes = list(range(16)) + [1000 + 4 * i + k for k in range(4)]
    print(json.dumps({"timestamp": 10 * i, "input_length": 512 * len(hashes), "output_length": 64, "hash_ids": hashes}))
PY
fi

runs=(1 2 2s 4 4s)
[ -z "${RUNS:-}" ] || read -r -a runs <<<"$RUNS"
header=1
for run in "${runs[@]}"; do
  n=${run%s}
  shared=()
  if [ "$run" != "$n" ]; then
    # A fresh backend each run: nothing carries over.
    "$REDIS" --port 32200 --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
    for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/32200) 2>/dev/null && break; sleep 0.1; done
    shared=(--shared-state redis://127.0.0.1:32200)
  fi
  urls=()
  for i in $(seq 1 "$WORKERS"); do
    port=$((32000 + i))
    "$BIN/sgl-mock-engine" --listen "127.0.0.1:$port" --capacity-tokens 400000 --speedup "$ENGINE_SPEEDUP" >/dev/null 2>&1 & pids+=($!)
    urls+=("http://127.0.0.1:$port")
  done
  for u in "${urls[@]}"; do ready "$u/health"; done
  servers=""
  for r in $(seq 1 "$n"); do
    port=$((32110 + r))
    "$BIN/sgl-router" --port "$port" --worker-urls "$(IFS=,; echo "${urls[*]}")" --policy cache_aware --kv-events \
      "${shared[@]}" >/dev/null 2>&1 & pids+=($!)
    ready "http://127.0.0.1:$port/readiness"
    servers+="server 127.0.0.1:$port; "
  done
  # Round robin over the replicas, connections kept open to each.
  nginx_conf "$tmp/lb$run" 32100 "upstream routers { $servers keepalive 256; keepalive_requests 100000; }" "
    location / {
      proxy_pass http://routers;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }"
  nginx_cmd "$tmp/lb$run"
  "${NGINX_CMD[@]}" & pids+=($!)
  ready http://127.0.0.1:32100/health
  name="$n replica$([ "$n" = 1 ] || echo s)$([ "$run" = "$n" ] || echo ", shared")"
  out=$("$BIN/sgl-router-bench" live --trace "$TRACE" --limit "$REQUESTS" --speedup "$SPEEDUP" \
    --max-output "${MAX_OUTPUT:-0}" --router "r$run=http://127.0.0.1:32100")
  # Each engine's requests served: the hottest one's share over the mean.
  counts=""
  for u in "${urls[@]}"; do counts+="$(curl -sf "$u/admin/state") "; done
  hot=$(python3 -c 'import json,sys; c=[json.loads(x)["requests"] for x in sys.argv[1:]]; print(f"{max(c)/(sum(c)/len(c)):.2f}")' $counts)
  if [ $header = 1 ]; then
    echo "$out" | head -1
    printf "%-20s %s %9s\n" "run" "$(echo "$out" | sed -n 2p | cut -c19-)" "hot/mean"
    header=0
  fi
  printf "%-20s %s %9s\n" "$name" "$(echo "$out" | tail -1 | cut -c19-)" "$hot"
  cleanup
  tmp=$(mktemp -d); tmpdirs+=("$tmp")
  sleep 0.5
done
[ -z "${generated:-}" ] || rm -f "$generated"
