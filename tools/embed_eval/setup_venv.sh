#!/usr/bin/env bash
# Creates a virtualenv for tools/embed_eval/reference.py with pinned numpy,
# safetensors and tokenizers (wheels from PyPI; Python 3.11) and prints its python last.
#   bash tools/embed_eval/setup_venv.sh VENV        (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 VENV" >&2
  exit 2
fi
PY="${PYTHON:-python3}"
VENV="$1"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_venv: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# tokenizers declares huggingface_hub (used only by Tokenizer.from_pretrained, which
# downloads); the reference reads tokenizer.json from disk, so it is installed without it.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
  numpy==2.4.6 safetensors==0.8.0 >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: --no-deps \
  tokenizers==0.23.2 >&2
"$VENV/bin/python" -c 'import numpy, safetensors.numpy, tokenizers
print("setup_venv: numpy", numpy.__version__, "safetensors", safetensors.__version__, "tokenizers", tokenizers.__version__)' >&2
echo "$(cd "$VENV" && pwd -P)/bin/python"
