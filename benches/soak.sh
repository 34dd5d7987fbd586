#!/usr/bin/env bash
# Soak (docs/reliability.md, "Soak"): a router process under mixed streamed and whole traffic,
# worker churn and KV-event faults, its memory, descriptors, threads, tasks and index sampled
# every minute; exits non-zero unless each levels off. Writes soak.csv and soak.svg to OUT.
# Every bounded cache is given a bound this traffic fills within the first quarter of an hour,
# so that the second half shows whether anything else grows: the page-hash memo 16,384 pages
# (1 MiB), the tokenizer's segment cache 1,024 segments and its word cache 1 MiB. At the
# defaults (32 MiB, 16,384 segments, 16 MiB) they fill after 3 to 6 hours at this rate:
# `bash benches/soak.sh SECONDS OUT defaults` runs with them (the long nightly soak).
#   bash benches/soak.sh [SECONDS] [OUT] [small|defaults]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${2:-target/soak}"
mkdir -p "$out"
bounds=(--router-arg=--page-hash-memo-pages=16384 --router-arg=--tokenizer-cache-segments=1024
        --router-arg=--tokenizer-cache-word-bytes=1048576)
[ "${3:-small}" = defaults ] && bounds=()
cargo build --release --locked -q -p sgl-router -p bench
target/release/sgl-router-bench soak --router-bin target/release/sgl-router --duration-secs "${1:-3600}" \
  "${bounds[@]}" --csv "$out/soak.csv" --plot "$out/soak.svg" --check
