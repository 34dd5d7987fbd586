#!/usr/bin/env bash
# Same engines, two KV routers: NVIDIA Dynamo 1.6.1's frontend in KV mode against sgl-router
# cache_aware, over the same simulated engines (Dynamo's mocker, vLLM-format KV events on ZMQ).
#   bash benches/dynamo.sh [TRACE] [REQUESTS] [SPEEDUP]
# - dynamo_kv: one mocker process of $WORKERS workers, `python -m dynamo.frontend --router-mode kv`
#   in front (its own KV indexer over the mockers' events; file discovery, TCP request plane).
# - sgl_cache_aware: $WORKERS mocker processes, each behind its own Dynamo frontend in
#   round-robin mode over that one engine (its HTTP front), sgl-router --policy cache_aware
#   over the fronts, following each mocker's ZMQ events (--kv-events-endpoint).
# Each run starts fresh engines. Hit rate from the engines' own cached_tokens; router CPU (the
# Dynamo frontend's, or sgl-router's: the per-engine fronts are the engines' side) per 1,000
# requests and its peak RSS from /proc. Needs the venv of tests/dynamo/setup_venv.sh
# (DYN_PY, default /tmp/sgl-router-dynamo-venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
REQUESTS="${2:-500}"
SPEEDUP="${3:-10}"
WORKERS="${WORKERS:-4}"
DYN_PY="${DYN_PY:-/tmp/sgl-router-dynamo-venv/bin/python}"
# The mockers' own time scale (their prefill and decode model is divided by it).
ENGINE_SPEEDUP="${ENGINE_SPEEDUP:-10}"
# KV capacity per worker, in 16-token blocks (400,000 tokens, as benches/live.sh's engines).
BLOCKS="${BLOCKS:-25000}"
PROMPT="${PROMPT:-tokens}"
[ -x "$DYN_PY" ] || { echo "no Dynamo venv at $DYN_PY: bash tests/dynamo/setup_venv.sh" >&2; exit 1; }
cargo build --release -q -p sgl-router -p bench
BIN=target/release
source benches/lib.sh

# The model directory outlives each run's cleanup; the logs are kept.
model=$(mktemp -d)
trap 'cleanup; rm -rf "$model"' EXIT
logs=$(mktemp -d /tmp/sgl-router-dynamo-bench-XXXX)
cp tests/fixtures/tokenizers/qwen3/tokenizer.json tests/fixtures/tokenizers/qwen3/tokenizer_config.json "$model/"
cat >"$model/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 131072,
 "vocab_size": 151936, "eos_token_id": 151645, "bos_token_id": 151643}
JSON
export DYN_DISCOVERY_BACKEND=file DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq DYN_HTTP_HOST=127.0.0.1 \
  DYN_TCP_RPC_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1 DYN_LOG=error
mocker() { # NAMESPACE EVENT_PORTS REPLAY_PORTS NUM_WORKERS
  "$DYN_PY" -m dynamo.mocker --model-path "$model" --model-name default --endpoint "dyn://$1.backend.generate" \
    --block-size 16 --num-gpu-blocks-override "$BLOCKS" --speedup-ratio "$ENGINE_SPEEDUP" --num-workers "$4" \
    --zmq-kv-events-ports "$2" --zmq-replay-ports "$3" >"$logs/mocker-$1.log" 2>&1 & pids+=($!)
}
frontend() { # NAMESPACE PORT MODE
  "$DYN_PY" -m dynamo.frontend --http-port "$2" --namespace "$1" --router-mode "$3" --kv-cache-block-size 16 \
    >/dev/null 2>&1 & pids+=($!)
  FRONT_PID=$!
}
listed() { for _ in $(seq 1 900); do curl -sf "$1/v1/models" | grep -q '"default"' && return 0; sleep 0.1; done; echo "no model at $1" >&2; return 1; }
rss_peak_mib() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }

header=1
for run in ${RUNS:-dynamo_kv sgl_cache_aware}; do
  kv=$(mktemp -d); tmpdirs+=("$kv"); export DYN_FILE_KV="$kv"
  metrics=()
  if [ "$run" = dynamo_kv ]; then
    # One base port per worker (each worker's ranks at base + rank): spaced apart.
    ev=$(for i in $(seq 0 $((WORKERS - 1))); do printf '%s,' $((35001 + i * 10)); done); ev=${ev%,}
    rp=$(for i in $(seq 0 $((WORKERS - 1))); do printf '%s,' $((35101 + i * 10)); done); rp=${rp%,}
    mocker bench "$ev" "$rp" "$WORKERS"
    frontend bench 32100 kv
    router_pid=$FRONT_PID
    listed http://127.0.0.1:32100
  else
    fronts=(); flags=()
    for i in $(seq 1 "$WORKERS"); do
      mocker "w$i" $((36000 + i)) $((36100 + i)) 1
      frontend "w$i" $((32200 + i)) round-robin
      u="http://127.0.0.1:$((32200 + i))"; fronts+=("$u")
      flags+=(--kv-events-endpoint "$u=tcp://127.0.0.1:$((36000 + i))" --kv-events-replay-endpoint "$u=tcp://127.0.0.1:$((36100 + i))")
    done
    for u in "${fronts[@]}"; do listed "$u"; done
    "$BIN/sgl-router" --port 32100 --worker-urls "$(IFS=,; echo "${fronts[*]}")" --policy cache_aware --kv-events \
      "${flags[@]}" --tokenizer-path "$model" --backend vllm --model-id default --prometheus-port 32109 \
      --request-timeout-secs 300 >/dev/null 2>&1 & pids+=($!)
    router_pid=$!
    ready http://127.0.0.1:32100/readiness
    metrics=(--metrics http://127.0.0.1:32109)
  fi
  ticks0=$(tree_ticks "$router_pid")
  out=$("$BIN/sgl-router-bench" live --trace "$TRACE" --limit "$REQUESTS" --speedup "$SPEEDUP" --prompt "$PROMPT" \
    --timeout-secs 300 --router "$run=http://127.0.0.1:32100" "${metrics[@]}")
  ticks=$(( $(tree_ticks "$router_pid") - ticks0 ))
  cpu=$(awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v n="$REQUESTS" 'BEGIN {printf "%.3f", t / hz / n * 1000}')
  rss=$(rss_peak_mib "$router_pid")
  if [ $header = 1 ]; then echo "$out" | head -2 | sed '2s/$/  router CPU s\/1k req  peak RSS MiB/'; header=0; fi
  echo "$(echo "$out" | tail -1)  $cpu  $rss"
  cleanup
  sleep 1
done
