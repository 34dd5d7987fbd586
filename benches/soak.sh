#!/usr/bin/env bash
# Soak (docs/reliability.md, "Soak"): a router process under mixed streamed and whole traffic,
# worker churn and KV-event faults, its memory, descriptors, threads, tasks and index sampled
# every minute; exits non-zero unless each levels off. Writes soak.csv and soak.svg to OUT.
# The page-hash memo is given 65,536 pages (4 MiB) so that it fills within the hour; at the
# default (524,288 pages, 32 MiB) it fills after about 90 minutes at this rate.
#   bash benches/soak.sh [SECONDS] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${2:-target/soak}"
mkdir -p "$out"
cargo build --release --locked -q -p sgl-router -p bench
target/release/sgl-router-bench soak --router-bin target/release/sgl-router --duration-secs "${1:-3600}" \
  --router-arg=--page-hash-memo-pages=65536 --csv "$out/soak.csv" --plot "$out/soak.svg" --check
