#!/usr/bin/env bash
# Overload (docs/reliability.md, "Overload"): ten times the admitted concurrency against slow
# simulated engines, then the same with clients that hang up after the first chunk. Exits
# non-zero unless every admitted request succeeds, every other is refused with 429/503 within
# REFUSAL_MS (default 200), and every hung-up stream is cancelled at its engine.
#   bash benches/overload.sh [ADMITTED] [FACTOR] [REFUSAL_MS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p sgl-router -p bench
target/release/sgl-router-bench overload --router-bin target/release/sgl-router \
  --admitted "${1:-16}" --factor "${2:-10}" --check-refusal-ms "${3:-200}"
