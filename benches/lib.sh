# Shared by the benchmark scripts (source it): the processes they start, waiting
# for one to answer, and the peer routers' command lines.

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; pids=(); }
trap cleanup EXIT

# ready URL: waits up to 30 s for URL to answer 2xx.
ready() { for _ in $(seq 1 300); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; return 1; }

# peer_command KIND POLICY PORT WORKER_URL...: sets PEER to the command line of a peer router,
# KIND smg ($SMG, SGLang Model Gateway) or vllm ($VLLM_ROUTER, vllm-router). Each gets its own
# Prometheus port (both default to one fixed port, so two at once would clash).
peer_command() {
  local kind=$1 policy=$2 port=$3; shift 3
  local common=(--worker-urls "$@" --policy "$policy" --port "$port" --prometheus-port $((port + 100)) --log-level error)
  case "$kind" in
    smg) PEER=("$SMG" launch "${common[@]}") ;;
    vllm) PEER=("$VLLM_ROUTER" "${common[@]}") ;;
    *) echo "unknown peer $kind" >&2; return 1 ;;
  esac
}
