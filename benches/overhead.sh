#!/usr/bin/env bash
# Router overhead against a fast simulated engine (no simulated time), in one run:
# direct, through sgl-router round_robin, through sgl-router cache_aware (KV
# events, chats with a repeated system prompt: tokenization included), and
# round_robin again with `--no-fast-proxy` (axum and hyper only); with
# the peers in the same run when they are installed:
#   SMG=path/to/smg                 SGLang Model Gateway (`pip install sglang-router`)
#   VLLM_ROUTER=path/to/vllm-router vllm-router (`pip install vllm-router`)
# each as round_robin and cache_aware (their approximate text tree); and, when
# nginx is installed (`apt-get install nginx-light`), nginx as a plain reverse
# proxy with upstream keep-alive: the floor a proxy hop costs on this machine.
# Also each router's CPU seconds per 1,000 requests. Prints the tables of
# docs/benchmarks.md ("Router overhead"). With
#   BASELINE=path/to/an/older/sgl-router
# that build runs round_robin in the same run too (`round_robin_baseline`), so a
# change is measured against the build before it, not against last week's numbers.
# With PENDING_TTL_MS=MS, cache_aware with `--cache-pending-prefix-ttl-ms MS` runs too
# (`cache_aware_pending`, and `cache_aware_pending_baseline` with BASELINE).
#   bash benches/overhead.sh [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${1:-2000}"
SMG="${SMG:-}"
VLLM_ROUTER="${VLLM_ROUTER:-}"
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
ENGINE=http://127.0.0.1:31001
source benches/lib.sh

"$BIN/sgl-mock-engine" --listen 127.0.0.1:31001 --fast >/dev/null 2>&1 & pids+=($!)
ready "$ENGINE/health"

names=(); urls=(); rpids=()
start() { # NAME PORT READY_PATH COMMAND...
  local name=$1 port=$2 path=$3; shift 3
  "$@" >/dev/null 2>&1 & pids+=($!)
  ready "http://127.0.0.1:$port$path"
  names+=("$name"); urls+=("http://127.0.0.1:$port"); rpids+=($!)
}
start round_robin 31010 /readiness "$BIN/sgl-router" --port 31010 --worker-urls "$ENGINE" --policy round_robin
start cache_aware 31011 /readiness "$BIN/sgl-router" --port 31011 --worker-urls "$ENGINE" --policy cache_aware --kv-events
if [ -n "${BASELINE:-}" ]; then
  start round_robin_baseline 31013 /readiness "$BASELINE" --port 31013 --worker-urls "$ENGINE" --policy round_robin
fi
# With PENDING_TTL_MS: cache_aware crediting pending prefixes too (each plan then takes the
# credit lock), and with BASELINE that build the same way.
if [ -n "${PENDING_TTL_MS:-}" ]; then
  start cache_aware_pending 31014 /readiness "$BIN/sgl-router" --port 31014 --worker-urls "$ENGINE" --policy cache_aware --kv-events --cache-pending-prefix-ttl-ms "$PENDING_TTL_MS"
  if [ -n "${BASELINE:-}" ]; then
    start cache_aware_pending_baseline 31015 /readiness "$BASELINE" --port 31015 --worker-urls "$ENGINE" --policy cache_aware --kv-events --cache-pending-prefix-ttl-ms "$PENDING_TTL_MS"
  fi
fi
# The same router with its HTTP/1.1 fast path off (axum and hyper serve every request): what the fast path buys.
start round_robin_no_fast 31012 /readiness "$BIN/sgl-router" --port 31012 --worker-urls "$ENGINE" --policy round_robin --no-fast-proxy
for kind in smg vllm; do
  [ "$kind" = smg ] && [ -z "$SMG" ] && continue
  [ "$kind" = vllm ] && [ -z "$VLLM_ROUTER" ] && continue
  for p in round_robin cache_aware; do
    port=$((31020 + ${#names[@]}))
    peer_command "$kind" "$p" "$port" "$ENGINE"
    start "${kind/vllm/vllm_router}_$p" "$port" /health "${PEER[@]}"
  done
done

if command -v nginx >/dev/null; then
  conf=$(mktemp -d)
  cat > "$conf/nginx.conf" <<NGINX
worker_processes 2;
pid $conf/nginx.pid;
error_log $conf/error.log error;
events { worker_connections 1024; }
http {
  access_log off;
  upstream engine { server 127.0.0.1:31001; keepalive 128; }
  server {
    listen 127.0.0.1:31040;
    client_body_buffer_size 64k;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
  start nginx_proxy 31040 /health nginx -c "$conf/nginx.conf" -g "daemon off;"
fi

# CPU ticks of a process and its children (nginx's workers).
cpu() {
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}
before=(); for p in "${rpids[@]}"; do before+=("$(cpu "$p")"); done
targets=$(for i in "${!names[@]}"; do printf '%s=%s,' "${names[$i]}" "${urls[$i]}"; done)
ROUNDS=10 # the targets take turns, each round a slice of the requests
"$BIN/sgl-router-bench" overhead --engine-url "$ENGINE" --router "${targets%,}" --requests "$REQUESTS" --rounds "$ROUNDS"
ticks=$(getconf CLK_TCK)
# Each router served (REQUESTS + 8 warm-up requests a round) x 4 configurations.
served=$(( (REQUESTS + 8 * ROUNDS) * 4 ))
echo
echo "router CPU seconds per 1,000 requests:"
for i in "${!names[@]}"; do
  used=$(( $(cpu "${rpids[$i]}") - ${before[$i]} ))
  printf '  %-26s %s\n' "${names[$i]}" "$(echo "scale=3; $used / $ticks * 1000 / $served" | bc)"
done
