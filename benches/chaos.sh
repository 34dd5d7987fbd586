#!/usr/bin/env bash
# The chaos run against ground truth (docs/reliability.md), with many seeds: simulated engines
# with real ZMQ publishers, a seeded random schedule of faults interleaved with traffic through
# the router, and after every round the router's index compared block for block with the
# engines' caches. CI runs 3 seeds on every commit (cargo test); this is the nightly size.
#   bash benches/chaos.sh [SEEDS] [ROUNDS] [SEED_BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
CHAOS_SEEDS="${1:-100}" CHAOS_ROUNDS="${2:-12}" CHAOS_SEED_BASE="${3:-1}" \
  cargo test --release --locked -q -p sgl-router --test chaos -- --nocapture
