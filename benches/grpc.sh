#!/usr/bin/env bash
# gRPC workers against HTTP workers and against Shepherd Model Gateway over gRPC, in one run,
# with the simulated engine at its fastest (no simulated time) serving both its HTTP API and
# SGLang's gRPC scheduler service (`--grpc-listen`), Qwen3's tokenizer on every side:
#   direct      the engine's HTTP API, no router (the baseline)
#   sgl_http    sgl-router --policy cache_aware --kv-events, HTTP worker (events over ZMQ)
#   sgl_grpc    sgl-router --policy cache_aware --kv-events, gRPC worker (events over gRPC):
#               the router renders, tokenizes, detokenizes, cuts stop strings
#   sgl_grpc_vllm  the same against a second engine (same settings) serving vLLM's engine
#               service instead (`--grpc-service vllm`): vLLM's messages, converted at the wire
#   smg_grpc    smg 1.13 --policy cache_aware, gRPC worker (with SMG=path/to/smg:
#               `bash tests/smg/setup_venv.sh` makes one)
#   smg_grpc_vllm  smg 1.13 --backend vllm against the vLLM-service engine (with SMG)
# Two measurements: one-token chats (latency at c=1, req/s at c=64, 200 B and 16 KiB
# prompts), then streamed chats of STREAM_TOKENS tokens (time to the first token at c=1
# and c=64) with each router's CPU seconds per 1,000 streamed tokens.
#   bash benches/grpc.sh [REQUESTS] [STREAM_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${1:-2000}"
STREAM_TOKENS="${2:-256}"
SMG="${SMG:-}"
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=$PWD/target/release
TOK=$PWD/tests/fixtures/tokenizers/qwen3
source benches/lib.sh

# smg names the tokenizer by its --model-path and serves the model the engine reports: both
# "default", a link to the tokenizer in a directory of its own.
work=$(mktemp -d); tmpdirs+=("$work")
ln -s "$TOK" "$work/default"

"$BIN/sgl-mock-engine" --listen 127.0.0.1:31001 --grpc-listen 127.0.0.1:31002 --fast \
  --tokenizer-path "$TOK" --model-id default >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31001/health
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31004 --grpc-listen 127.0.0.1:31003 --grpc-service vllm --fast \
  --tokenizer-path "$TOK" --model-id default >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31004/health

names=(); urls=(); rpids=()
start() { # NAME PORT READY_PATH COMMAND...
  local name=$1 port=$2 path=$3; shift 3
  (cd "$work" && exec "$@") >/dev/null 2>&1 & pids+=($!)
  ready_pid "http://127.0.0.1:$port$path" $! 600
  names+=("$name"); urls+=("http://127.0.0.1:$port"); rpids+=($!)
}
common=(--policy cache_aware --kv-events --tokenizer-path "$TOK" --model-id default)
start sgl_http 31010 /readiness "$BIN/sgl-router" --port 31010 --worker-urls http://127.0.0.1:31001 "${common[@]}"
start sgl_grpc 31011 /readiness "$BIN/sgl-router" --port 31011 --worker-urls grpc://127.0.0.1:31002 "${common[@]}"
start sgl_grpc_vllm 31013 /readiness "$BIN/sgl-router" --port 31013 --worker-urls grpc://127.0.0.1:31003 "${common[@]}"
# smg 1.13 asks the Hugging Face Hub for the model's multimodal config on every chat (its cache
# keeps no failure), even with a local --model-path: offline, most asks fail at once and some
# wait out a 5 s DNS timeout, a stall that is this machine's, not smg's. Its hub is pointed at a
# closed local port: each ask is refused at once (a loopback connect a request, counted in its CPU).
smg_env=(env HF_ENDPOINT=http://127.0.0.1:9 HF_HUB_OFFLINE=1)
if [ -n "$SMG" ]; then
  start smg_grpc 31012 /health "${smg_env[@]}" "$SMG" launch --worker-urls grpc://127.0.0.1:31002 --model-path default \
    --policy cache_aware --port 31012 --prometheus-port 31112 --log-level error
  # Its tokenizer registers in the background: wait for a chat to be answered.
  for _ in $(seq 1 300); do
    curl -sf http://127.0.0.1:31012/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model":"default","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}' >/dev/null && break
    sleep 0.1
  done
  start smg_grpc_vllm 31014 /health "${smg_env[@]}" "$SMG" launch --backend vllm --worker-urls grpc://127.0.0.1:31003 \
    --model-path default --policy cache_aware --port 31014 --prometheus-port 31114 --log-level error
  for _ in $(seq 1 300); do
    curl -sf http://127.0.0.1:31014/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model":"default","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}' >/dev/null && break
    sleep 0.1
  done
fi

targets=$(for i in "${!names[@]}"; do printf '%s=%s,' "${names[$i]}" "${urls[$i]}"; done)
ROUNDS=10
echo "one-token chats ($REQUESTS requests per cell):"
"$BIN/sgl-router-bench" overhead --engine-url http://127.0.0.1:31001 --router "${targets%,}" \
  --requests "$REQUESTS" --rounds "$ROUNDS"

echo
echo "streamed chats of $STREAM_TOKENS tokens: the p50 column is the time to the first token ($((REQUESTS / 4)) requests per cell):"
before=(); for p in "${rpids[@]}"; do before+=("$(tree_ticks "$p")"); done
"$BIN/sgl-router-bench" overhead --engine-url http://127.0.0.1:31001 --router "${targets%,}" \
  --requests $((REQUESTS / 4)) --rounds "$ROUNDS" --body-bytes 200 --stream-tokens "$STREAM_TOKENS"
ticks=$(getconf CLK_TCK)
# Each router streamed (requests + up to 8 warm-up requests a round, at c=1 one) x STREAM_TOKENS at two concurrencies.
tokens=$(( (REQUESTS / 4 + ROUNDS * 1 + ROUNDS * 8) * STREAM_TOKENS ))
echo
echo "router CPU seconds per 1,000 streamed tokens:"
for i in "${!names[@]}"; do
  used=$(( $(tree_ticks "${rpids[$i]}") - ${before[$i]} ))
  printf '  %-10s %s\n' "${names[$i]}" "$(echo "scale=4; $used / $ticks * 1000 / $tokens" | bc)"
done
