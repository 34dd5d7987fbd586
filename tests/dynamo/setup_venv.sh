#!/usr/bin/env bash
# Create a venv with NVIDIA Dynamo 1.6.1's simulated engines (`python -m dynamo.mocker`)
# and its OpenAI frontend (`python -m dynamo.frontend`), both on CPU, no GPU stack.
#
#   bash tests/dynamo/setup_venv.sh [VENV_DIR]      # default /tmp/sgl-router-dynamo-venv
#
# Prints the venv's python path as the last line of stdout (the router's tests read it from
# SGL_ROUTER_DYNAMO_PYTHON). Needs python3.11 (override with DYNAMO_PYTHON) and PyPI access;
# the ai-dynamo-runtime wheel is ~75 MB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${1:-/tmp/sgl-router-dynamo-venv}"
PY="${DYNAMO_PYTHON:-python3.11}"

case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/" in
  "$REPO"/*) echo "the venv must live outside the repo: $VENV" >&2; exit 1;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
# --no-deps for everything: requirements.txt pins the complete set.
"$VENV/bin/python" -m pip install -q --no-compile --no-deps -r "$HERE/requirements.txt" >&2
# Smoke test: the mocker and the frontend parse their flags.
"$VENV/bin/python" -m dynamo.mocker --help >/dev/null
"$VENV/bin/python" -m dynamo.frontend --help >/dev/null
echo "dynamo $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("ai-dynamo"))'): mocker and frontend OK" >&2
echo "$VENV/bin/python"
