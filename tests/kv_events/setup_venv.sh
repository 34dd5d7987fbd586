#!/usr/bin/env bash
# Create a venv with SGLang's and vLLM's real KV-event publishers (no torch).
#
#   bash tests/kv_events/setup_venv.sh [VENV_DIR]      # default /tmp/sgl-router-kv-venv
#
# Prints the venv's python path as the last line of stdout; use it as
#   "$PY" tests/kv_events/publisher.py --engine sglang|vllm ...
#   "$PY" tests/kv_events/selftest.py
# Needs python3.11 (override with KV_EVENTS_PYTHON) and PyPI access.
# The vllm wheel is ~340 MB (its compiled kernels come along; they are never loaded).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${1:-/tmp/sgl-router-kv-venv}"
PY="${KV_EVENTS_PYTHON:-python3.11}"

case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/" in
  "$REPO"/*) echo "the venv must live outside the repo: $VENV" >&2; exit 1;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
# --no-deps for everything: requirements.txt pins the complete set.
"$VENV/bin/python" -m pip install -q --no-compile --no-deps -r "$HERE/requirements.txt" >&2
# Smoke test: both engines' event modules import with the stubs.
"$VENV/bin/python" - "$HERE" >&2 <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import engine_events
s = engine_events.SGLang()
v = engine_events.VLLM()
print(f"sglang {s.version} / vllm {v.version}: KV-event modules import OK", file=sys.stderr)
PYEOF
echo "$VENV/bin/python"
