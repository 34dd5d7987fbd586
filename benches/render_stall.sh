#!/usr/bin/env bash
# One huge prompt against small ones on a single serving thread: how long a
# 2-token chat waits while a ~4.5 MB chat is parsed, rendered, tokenized and
# hashed (cache_aware with KV events renders every chat). Before admission and
# the render pool, the small chat waited for the whole render on the one
# serving thread; now the render runs off it. With
#   BASELINE=path/to/an/older/sgl-router
# that build is measured in the same run. Prints a table.
#   bash benches/render_stall.sh [SMALL_REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL="${1:-5}"
cargo build --release -q -p sgl-router
BIN=target/release
source benches/lib.sh

work=$(mktemp -d)
python3 - "$work" <<'PY'
import json, sys
d = sys.argv[1]
json.dump({"messages": [{"role": "user", "content": "many words in a long prompt " * 160_000}], "max_tokens": 1},
          open(f"{d}/big.json", "w"))
json.dump({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}, open(f"{d}/small.json", "w"))
PY
echo "big body: $(wc -c < "$work/big.json") bytes"

measure() { # NAME BINARY PORT
  local name=$1 bin=$2 port=$3 url="http://127.0.0.1:$3"
  "$bin" --port "$port" --mock-workers 1 --policy cache_aware --kv-events --serve-threads 1 \
    --max-body-bytes 8388608 >/dev/null 2>&1 &
  local pid=$!
  pids+=("$pid")
  ready "$url/readiness"
  # Warm: one small chat, so connections and caches are in place.
  curl -s -o /dev/null "$url/v1/chat/completions" -H 'content-type: application/json' --data-binary @"$work/small.json"
  local t0 big_s
  t0=$(date +%s.%N)
  curl -s -o /dev/null -w '%{time_total}\n' "$url/v1/chat/completions" -H 'content-type: application/json' \
    --data-binary @"$work/big.json" > "$work/big_$name" &
  local big=$!
  sleep 0.3 # the huge body is sent and rendering
  local worst=0 t
  for _ in $(seq "$SMALL"); do
    t=$(curl -s -o /dev/null -w '%{time_total}' "$url/v1/chat/completions" -H 'content-type: application/json' \
      --data-binary @"$work/small.json")
    worst=$(echo "if ($t > $worst) $t else $worst" | bc)
  done
  wait "$big"
  big_s=$(cat "$work/big_$name")
  printf '| %-22s | %10.3f | %10.3f |\n' "$name" "$(echo "$worst * 1000" | bc)" "$(echo "$big_s * 1000" | bc)"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

echo
echo "| build                  | worst small (ms) | huge chat (ms) |"
echo "|---|---:|---:|"
[ -n "${BASELINE:-}" ] && measure baseline "$BASELINE" 31061
measure this "$BIN/sgl-router" 31060
rm -rf "$work"
