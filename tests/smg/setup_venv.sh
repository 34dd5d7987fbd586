#!/usr/bin/env bash
# Create a venv with Shepherd Model Gateway 1.13.0 (`pip install smg`), the peer the gRPC
# tests drive: `smg launch --worker-urls grpc://...` in front of the simulated engine.
#
#   bash tests/smg/setup_venv.sh [VENV_DIR]      # default /tmp/sgl-router-smg-venv
#
# Prints the venv's `smg` path as the last line of stdout (the router's tests read it from
# SGL_ROUTER_SMG). Needs python3 and PyPI access; the smg wheel is ~37 MB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${1:-/tmp/sgl-router-smg-venv}"
PY="${SMG_PYTHON:-python3}"

case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/" in
  "$REPO"/*) echo "the venv must live outside the repo: $VENV" >&2; exit 1;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2
fi
# --no-deps: requirements.txt pins the complete set.
"$VENV/bin/python" -m pip install -q --no-compile --no-deps -r "$HERE/requirements.txt" >&2
# Smoke test: the launcher parses its flags.
"$VENV/bin/smg" launch --help >/dev/null
echo "smg $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))'): launch OK" >&2
echo "$VENV/bin/smg"
