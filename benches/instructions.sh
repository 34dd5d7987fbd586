#!/usr/bin/env bash
# Router work per request counted, not timed: what two builds do per proxied request, in figures
# that do not move with this machine's noise (a 2-core VM whose CPU time per request spreads by
# +-15 % between rounds of the same build, see docs/benchmarks.md).
#
# For each build, policy, body size and concurrency, against an nginx engine that answers a fixed
# chat completion (as benches/overhead_wrk.sh):
#   instr/req    user-space instructions the router executes per request (valgrind's callgrind,
#                counting only over the measured wrk window: `callgrind_control -i on/off`);
#   syscalls/req system calls the router makes per request (perf's raw_syscalls:sys_enter
#                tracepoint over a wrk window of the router running natively);
#   switches/req context switches of the router's threads per request (perf's context-switches,
#                the same window): with this VM's expensive switches, most of the kernel time.
# Ratios are this build against BASELINE, same run.
#
# Usage:
#   BASELINE=path/to/older/sgl-router bash benches/instructions.sh
# Environment:
#   BUILD=1            0: use target/release as it is
#   POLICIES="round_robin cache_aware"
#   BODIES="200 16384" CONCS="1 16"
#   DURATION=10        seconds of each measured wrk window (natively); under callgrind the window
#                      is VG_DURATION=20 seconds (it runs ~50x slower, so fewer requests)
#   EXTRA="..."        more flags for both builds (say the liveness features off)
#   KEEP=DIR           keep the callgrind profiles there (callgrind_annotate, function by function)
# Needs wrk, nginx, valgrind (callgrind_control), perf, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p sgl-router
BIN=target/release
source benches/lib.sh
trap 'exit 130' INT TERM
for tool in wrk valgrind callgrind_control perf curl; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
read -r -a POLICIES <<<"${POLICIES:-round_robin cache_aware}"
read -r -a BODIES <<<"${BODIES:-200 16384}"
read -r -a CONCS <<<"${CONCS:-1 16}"
read -r -a EXTRA <<<"${EXTRA:-}"
DURATION=${DURATION:-10}
VG_DURATION=${VG_DURATION:-20}
ENGINE_PORT=31001
PORT=31010
tmp=$(mktemp -d); tmpdirs+=("$tmp")

for b in "${BODIES[@]}"; do make_body "$b" "$tmp/body_$b.json"; done

COMPLETION='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok ok ok ok ok ok ok ok"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":16,"completion_tokens":8,"total_tokens":24}}'
nginx_conf "$tmp/engine" "$ENGINE_PORT" "" "
    location = /health { default_type text/plain; return 200 \"ok\"; }
    location = /v1/chat/completions { default_type application/json; return 200 '$COMPLETION'; }
    location / { return 404; }"
nginx_cmd "$tmp/engine"
"${NGINX_CMD[@]}" >"$tmp/engine.log" 2>&1 & pids+=($!)
ready_pid "http://127.0.0.1:$ENGINE_PORT/health" "$!" || { cat "$tmp/engine/error.log" >&2; exit 1; }

# run_wrk SECONDS CONC BODY: the requests wrk completed (all must be 200).
run_wrk() {
  local out threads=$(($2 > 1 ? 2 : 1))
  out=$(WRK_BODY_FILE="$tmp/body_$3.json" wrk -t"$threads" -c"$2" -d"$1s" --timeout 30s -s benches/wrk/post.lua \
    "http://127.0.0.1:$PORT/v1/chat/completions" | grep '^RESULT')
  local errors; errors=$(sed 's/.* errors=\([0-9]*\).*/\1/' <<<"$out")
  [ "$errors" = 0 ] || { echo "wrk: $out" >&2; exit 1; }
  sed 's/.* requests=\([0-9]*\).*/\1/' <<<"$out"
}

# start LABEL BINARY POLICY [WRAPPER...]: the router's pid in $router.
start() {
  local label=$1 bin=$2 policy=$3; shift 3
  "$@" "$bin" --worker-urls "http://127.0.0.1:$ENGINE_PORT" --policy "$policy" --port "$PORT" "${EXTRA[@]}" \
    >"$tmp/$label.log" 2>&1 &
  router=$!; pids+=("$router")
  ready_pid "http://127.0.0.1:$PORT/readiness" "$router" 1200 || { tail -20 "$tmp/$label.log" >&2; exit 1; }
}

# counted LABEL BINARY POLICY BODY CONC: "instr/req syscalls/req switches/req".
counted() {
  local label=$1 bin=$2 policy=$3 body=$4 conc=$5 reqs out ir perf_out sys cs
  # Natively: syscalls and context switches over one window.
  start "$label" "$bin" "$policy" env RUST_LOG=error
  run_wrk 2 "$conc" "$body" >/dev/null
  perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$router" -o "$tmp/perf.csv" &
  local perf_pid=$!
  sleep 0.2
  reqs=$(run_wrk "$DURATION" "$conc" "$body")
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  sys=$(awk -F, '/raw_syscalls/ { print $1 }' "$tmp/perf.csv")
  cs=$(awk -F, '/context-switches/ { print $1 }' "$tmp/perf.csv")
  stop_pid "$router"
  local per_sys per_cs
  per_sys=$(echo "scale=2; $sys / $reqs" | bc)
  per_cs=$(echo "scale=2; $cs / $reqs" | bc)
  # Under callgrind: instructions over one window, counted only while wrk runs.
  start "$label" "$bin" "$policy" env RUST_LOG=error valgrind -q --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$tmp/cg.$label.%p"
  run_wrk 3 "$conc" "$body" >/dev/null
  # callgrind_control waits a bounded time for the process to answer: ask until it does.
  local tries=0
  until callgrind_control -i on "$router" >/dev/null 2>&1; do
    tries=$((tries + 1)); [ "$tries" -lt 10 ] || { echo "callgrind_control -i on failed" >&2; exit 1; }
  done
  reqs=$(run_wrk "$VG_DURATION" "$conc" "$body")
  tries=0
  until callgrind_control -i off "$router" >/dev/null 2>&1; do
    tries=$((tries + 1)); [ "$tries" -lt 10 ] || { echo "callgrind_control -i off failed" >&2; exit 1; }
  done
  # The counts are written as the router exits (SIGTERM: a graceful stop), however long it takes.
  kill "$router"
  wait "$router" 2>/dev/null || true
  ir=$(cat "$tmp"/cg."$label".* | awk '/^(summary|totals):/ { s += $2 } END { printf "%.0f\n", s }')
  [ "$ir" -gt 0 ] || { echo "no instructions counted for $label" >&2; exit 1; }
  # KEEP=DIR keeps the profiles for a function-by-function diff (callgrind_annotate DIR/cg...).
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    for f in "$tmp"/cg."$label".*; do mv "$f" "$KEEP/cg.$label.$policy.$body.$conc.${f##*.}"; done
  fi
  rm -f "$tmp"/cg."$label".*
  echo "$(echo "$ir / $reqs" | bc) $per_sys $per_cs $reqs"
}

ratio() { echo "scale=3; $1 / $2" | bc | sed 's/^\./0./'; }
echo "Machine: $(nproc) cores, Linux $(uname -r); engine nginx (fixed chat completion); native windows ${DURATION} s, callgrind windows ${VG_DURATION} s; flags: --policy P ${EXTRA[*]}"
echo
echo "| policy | body | c | instr/req | syscalls/req | switches/req | instr/req, baseline | syscalls/req, baseline | switches/req, baseline | instr ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for policy in "${POLICIES[@]}"; do
  for body in "${BODIES[@]}"; do
    for conc in "${CONCS[@]}"; do
      read -r ir sys cs _ <<<"$(counted this "$BIN/sgl-router" "$policy" "$body" "$conc")"
      if [ -n "${BASELINE:-}" ]; then
        read -r bir bsys bcs _ <<<"$(counted base "$BASELINE" "$policy" "$body" "$conc")"
        echo "| $policy | $body | $conc | $ir | $sys | $cs | $bir | $bsys | $bcs | $(ratio "$ir" "$bir") |"
      else
        echo "| $policy | $body | $conc | $ir | $sys | $cs | | | | |"
      fi
    done
  done
done
