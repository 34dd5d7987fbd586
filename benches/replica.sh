#!/usr/bin/env bash
# Router replicas that catch up (docs/benchmarks.md, "Replica catch-up"): simulated engines
# with small replay buffers serve the first part of a Mooncake trace through router A; then
# router B starts cold and router B' starts from A's index snapshot (--index-peers A), and
# over the next part of the trace each request is explained by all three and sent through
# them in turn. Prints each router's hit rate against what the engines really hold; exits
# non-zero when B' is not within CHECK (default 0.02) of A.
#   bash benches/replica.sh [TRACE] [CHECK]
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
CHECK="${2:-0.02}"
cargo build --release -q -p sgl-router -p bench
target/release/sgl-router-bench replica --trace "$TRACE" --router-bin target/release/sgl-router --check "$CHECK"
