#!/usr/bin/env bash
# Coverage-guided fuzzing of the router's hand-written decoders and parsers (fuzz/, libFuzzer
# on stable Rust: no sanitizer, which needs nightly). Each target runs
# SECONDS (default 30) from its committed corpus (fuzz/corpus/<target>); what it adds goes to a
# scratch directory, not the repository. A crash or a failed assertion fails the run and leaves
# the input in fuzz/artifacts/<target>/. Prints a table of executions, coverage and corpus.
#   bash tools/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_RUNS=N [FUZZ_SEED=S] bash tools/fuzz.sh 0 [TARGET...]   (deterministic: CI)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
each="${1:-30}"; shift || true
# The build `cargo fuzz build -s none` (cargo-fuzz 0.13.2) makes, without installing cargo-fuzz
# (its build was a fifth of this script's time in CI): its release profile with line tables,
# its coverage instrumentation and cfg, debug assertions and overflow checks (its default
# without -O), one codegen unit (the sancov pass blocks ThinLTO's imports across units), for
# the host target only (so that build scripts and proc macros are not instrumented). `cargo fuzz run -s none <target>` builds the same and still works.
triple="$(rustc -vV | sed -n 's/^host: //p')"
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cllvm-args=-sanitizer-coverage-stack-depth \
-Cdebug-assertions -Ccodegen-units=1 ${RUSTFLAGS:-}" \
  cargo build --locked --manifest-path Cargo.toml --target "$triple" --release \
  --config 'profile.release.debug="line-tables-only"' --bins
bin_dir="target/$triple/release"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cd fuzz_targets && ls -- *.rs | sed 's/\.rs$//')
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
  mkdir -p "artifacts/$t"
  if ! "$bin_dir/$t" -artifact_prefix="artifacts/$t/" "${budget[@]}" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=2048 "$scratch/$t" "corpus/$t" >"$log" 2>&1; then
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
