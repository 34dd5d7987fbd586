#!/usr/bin/env bash
# Every table of docs/benchmarks.md, in one run: routing quality in simulation
# (and its SVG charts in docs/img), live HTTP replay of both Mooncake traces,
# router overhead, and with --criterion the microbenchmarks. Peers join when
# installed: SMG=path/to/smg VLLM_ROUTER=path/to/vllm-router (pip install
# sglang-router vllm-router) and nginx (apt-get install nginx-light); with
# BASELINE=path/to/older/sgl-router (and valgrind, perf, wrk) the work per request
# counted against it (benches/instructions.sh).
# Each part's output goes to target/bench-report/<part>.txt and to stdout.
#   bash benches/report.sh [--criterion] [TRACE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
CRITERION=0
if [ "${1:-}" = "--criterion" ]; then CRITERION=1; shift; fi
TRACES="${1:-../shared/traces/mooncake}"
OUT=target/bench-report
mkdir -p "$OUT"
part() { # NAME COMMAND...
  local name=$1; shift
  echo "## $name"
  "$@" 2>&1 | tee "$OUT/$name.txt"
  echo
}
part routing_quality bash benches/routing_quality.sh "$TRACES"
part live_conversation bash benches/live.sh "$TRACES/conversation_trace.jsonl" 1000 5
part live_synthetic bash benches/live.sh "$TRACES/synthetic_trace.jsonl" 1000 5
part overhead bash benches/overhead.sh 2000
part replica_conversation bash benches/replica.sh "$TRACES/conversation_trace.jsonl"
part replica_synthetic bash benches/replica.sh "$TRACES/synthetic_trace.jsonl"
part overload bash benches/overload.sh
# Instructions, system calls and context switches per request against an older build.
if [ -n "${BASELINE:-}" ] && command -v valgrind >/dev/null && command -v perf >/dev/null; then
  part instructions bash benches/instructions.sh
fi
if [ "$CRITERION" = 1 ]; then
  for b in renderer tree_lookup wire policy_select; do
    part "criterion_$b" cargo bench -q -p sgl-router-benches --bench "$b"
  done
fi
echo "reports in $OUT/"
