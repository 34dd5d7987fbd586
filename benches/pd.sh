#!/usr/bin/env bash
# Prefill/decode disaggregation on simulated engines, in one run:
#
# 1. The same Mooncake trace slice (same requests, same arrival times) through
#      aggregated  4 regular engines,                 cache_aware
#      sglang_pd   2 prefill + 2 decode (SGLang),      cache_aware prefill, power_of_two decode
#      vllm_pd     2 prefill + 2 decode (vLLM, NIXL),  cache_aware prefill, power_of_two decode
#      vllm_pd_skip  the same, with conditional disaggregation: a request of which the decode worker
#                  would prefill fewer than $SKIP_BELOW tokens itself (by its KV events) skips the
#                  prefill leg (--pd-skip-prefill-uncached-tokens), decode chosen by cache_aware
#    each against fresh engines, answers streamed with the trace's output lengths (capped):
#    TTFT (first event) mean/p50/p99, whole-answer mean, generated tokens per second.
# 2. The router's own cost on each path: engines with no simulated time (--fast), latency
#    through the router against straight to one engine, at concurrency 1 and 64; the aggregated
#    path also through the hyper front end (--no-fast-proxy). The PD paths are compared with
#    direct_sglang_pd / direct_vllm_pd: the bench client driving one prefill and one decode
#    engine of that setup itself, as the router's PD dispatch does (SGLang: both legs at once in
#    one bootstrap room; vLLM: prefill, then decode with its kv_transfer_params), so their +p50
#    is the router's own cost, the second engine and the rendezvous excluded.
#
#   bash benches/pd.sh [TRACE] [REQUESTS] [SPEEDUP] [MAX_OUTPUT]
# OVERHEAD_REQUESTS (2000) and ROUNDS (10) tune part 2; SKIP_TRACE=1 or SKIP_OVERHEAD=1 skip one.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
REQUESTS="${2:-400}"
SPEEDUP="${3:-10}"
MAX_OUTPUT="${4:-64}"
OVERHEAD_REQUESTS="${OVERHEAD_REQUESTS:-2000}"
ROUNDS="${ROUNDS:-10}"
SKIP_BELOW="${SKIP_BELOW:-2048}"
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
source benches/lib.sh

# engine PORT [ROLE FLAVOR] [EXTRA...]: starts a simulated engine on PORT.
engine() {
  local port=$1 role=${2:-regular} flavor=${3:-sglang}; shift 3 || shift $#
  "$BIN/sgl-mock-engine" --listen "127.0.0.1:$port" --role "$role" --flavor "$flavor" "$@" >/dev/null 2>&1 &
  pids+=($!)
  ready "http://127.0.0.1:$port/health"
}

# router PORT ARGS...: starts sgl-router on PORT and waits until it routes.
router() {
  local port=$1; shift
  "$BIN/sgl-router" --port "$port" --log-level error "$@" >/dev/null 2>&1 & pids+=($!)
  ROUTER_PID=${pids[-1]}
  ready_pid "http://127.0.0.1:$port/readiness" "$ROUTER_PID"
}

# setup NAME BASE EXTRA...: the engines and router of one configuration, engines on BASE+1..,
# the router on BASE.
setup() {
  local name=$1 base=$2; shift 2
  case "$name" in
    aggregated|aggregated_hyper)
      local urls=() front=()
      [ "$name" = aggregated_hyper ] && front=(--no-fast-proxy)
      for i in 1 2 3 4; do engine $((base + i)) regular sglang "$@"; urls+=("http://127.0.0.1:$((base + i))"); done
      router "$base" --worker-urls "${urls[@]}" --policy cache_aware "${front[@]}" ;;
    sglang_pd|vllm_pd|vllm_pd_skip)
      local flavor=${name%%_*} mode=--pd-disaggregation decode_events=(--no-kv-events) skip=(--decode-policy power_of_two)
      [ "$flavor" = vllm ] && mode=--vllm-pd-disaggregation
      # Conditional disaggregation reads what the decode workers hold from their own events.
      [ "$name" = vllm_pd_skip ] && decode_events=() \
        && skip=(--pd-skip-prefill-uncached-tokens "$SKIP_BELOW" --decode-policy cache_aware --kv-events)
      engine $((base + 1)) prefill "$flavor" "$@"; engine $((base + 2)) prefill "$flavor" "$@"
      engine $((base + 3)) decode "$flavor" "${decode_events[@]}" "$@"
      engine $((base + 4)) decode "$flavor" "${decode_events[@]}" "$@"
      router "$base" "$mode" --prefill "http://127.0.0.1:$((base + 1))" --prefill "http://127.0.0.1:$((base + 2))" \
        --decode "http://127.0.0.1:$((base + 3))" "http://127.0.0.1:$((base + 4))" \
        --prefill-policy cache_aware "${skip[@]}" ;;
  esac
}

if [ -z "${SKIP_TRACE:-}" ]; then
  echo "== 1. $(basename "$TRACE"), first $REQUESTS requests, ${SPEEDUP}x, outputs up to $MAX_OUTPUT tokens, streamed"
  header=1
  for name in ${TRACE_RUNS:-aggregated sglang_pd vllm_pd vllm_pd_skip}; do
    setup "$name" 31100 --speedup "$SPEEDUP" --capacity-tokens 400000
    out=$("$BIN/sgl-router-bench" live --trace "$TRACE" --limit "$REQUESTS" --speedup "$SPEEDUP" \
      --max-output "$MAX_OUTPUT" --stream --router "$name=http://127.0.0.1:31100")
    if [ $header = 1 ]; then echo "$out" | sed -n 2p; header=0; fi
    echo "$out" | tail -1
    cleanup
    sleep 0.5
  done
fi

if [ -z "${SKIP_OVERHEAD:-}" ]; then
  echo "== 2. the router's own cost: engines without simulated time, $OVERHEAD_REQUESTS requests, $ROUNDS rounds"
  engine 31201 regular sglang --fast
  declare -A router_pid ticks0
  for name in aggregated aggregated_hyper sglang_pd vllm_pd; do
    case $name in aggregated) base=31300;; aggregated_hyper) base=31600;; sglang_pd) base=31400;; vllm_pd) base=31500;; esac
    setup "$name" "$base" --fast
    router_pid[$name]=$ROUTER_PID
  done
  for name in "${!router_pid[@]}"; do ticks0[$name]=$(tree_ticks "${router_pid[$name]}"); done
  # aggregated_hyper: the aggregated path through the front end PD requests take (hyper, not the fast path).
  "$BIN/sgl-router-bench" overhead --engine-url http://127.0.0.1:31201 \
    --router aggregated=http://127.0.0.1:31300,aggregated_hyper=http://127.0.0.1:31600,sglang_pd=http://127.0.0.1:31400,vllm_pd=http://127.0.0.1:31500 \
    --direct-pd "direct_sglang_pd=sglang:http://127.0.0.1:31401|http://127.0.0.1:31403,direct_vllm_pd=vllm:http://127.0.0.1:31501|http://127.0.0.1:31503" \
    --requests "$OVERHEAD_REQUESTS" --rounds "$ROUNDS" --concurrency 1,64 --body-bytes 200
  # Each router served only its own requests: 2 concurrencies x OVERHEAD_REQUESTS (and the warm-up).
  hz=$(getconf CLK_TCK)
  echo "router CPU per 1000 requests (its process, over the whole run of $((2 * OVERHEAD_REQUESTS)) requests):"
  for name in aggregated aggregated_hyper sglang_pd vllm_pd; do
    t=$(( $(tree_ticks "${router_pid[$name]}") - ${ticks0[$name]} ))
    awk -v n="$name" -v t="$t" -v hz="$hz" -v r=$((2 * OVERHEAD_REQUESTS)) 'BEGIN { printf "  %-18s %.3f s\n", n, t / hz / r * 1000 }'
  done
  cleanup
fi
