#!/usr/bin/env bash
# Coverage-guided fuzzing of the router's hand-written decoders and parsers (fuzz/, cargo fuzz
# with libFuzzer on stable Rust: `-s none`, no sanitizer, which needs nightly). Each target runs
# SECONDS (default 30) from its committed corpus (fuzz/corpus/<target>); what it adds goes to a
# scratch directory, not the repository. A crash or a failed assertion fails the run and leaves
# the input in fuzz/artifacts/<target>/. Prints a table of executions, coverage and corpus.
#   bash tools/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_RUNS=N [FUZZ_SEED=S] bash tools/fuzz.sh 0 [TARGET...]   (deterministic: CI)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
each="${1:-30}"; shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version 0.13.2
fi
cargo fuzz build -s none
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
scratch="$(mktemp -d)"; trap 'rm -rf "$scratch"' EXIT
rows=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "corpus/$t"
  log="$scratch/$t.log"
  if [ -n "${FUZZ_RUNS:-}" ]; then
    # A fixed number of inputs from a fixed seed (what CI uses): a budget that does not depend
    # on the machine's speed, and nearly the same inputs each time (hash seeds still vary the
    # coverage a little); SECONDS is then unused.
    budget=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}")
  else
    budget=(-max_total_time="$each")
  fi
  if ! cargo fuzz run -s none "$t" "$scratch/$t" "corpus/$t" -- \
      "${budget[@]}" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz target $t FAILED: its input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  secs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' || echo "$each")
  [ "$secs" -gt 0 ] 2>/dev/null || secs=1
  speed='?'; [ "$runs" != '?' ] && speed=$((runs / secs))
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
  cov=$(echo "$last" | grep -oE 'cov: [0-9]+' | grep -oE '[0-9]+' || echo '?')
  ft=$(echo "$last" | grep -oE 'ft: [0-9]+' | grep -oE '[0-9]+' || echo '?')
  corp=$(echo "$last" | grep -oE 'corp: [0-9]+' | grep -oE '[0-9]+' || echo '?')
  rows+=("| $t | ${secs} s | $runs | $speed | $cov | $ft | $corp | 0 |")
done
echo
echo "| target | time | executions | exec/s | edges (cov) | features (ft) | corpus | crashes |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
