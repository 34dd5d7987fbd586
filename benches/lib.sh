# Shared by the benchmark scripts (source it): the processes they start, waiting
# for one to answer, and the peer routers' command lines.

pids=()
tmpdirs=() # directories removed on exit, after the processes are gone
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; pids=()
  for d in "${tmpdirs[@]}"; do rm -rf "$d"; done; tmpdirs=()
}
trap cleanup EXIT

# ready URL: waits up to 30 s for URL to answer 2xx.
ready() { for _ in $(seq 1 300); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not ready: $1" >&2; return 1; }

# peer_command KIND POLICY PORT WORKER_URL...: sets PEER to the command line of a peer router,
# KIND smg ($SMG, SGLang Model Gateway) or vllm ($VLLM_ROUTER, vllm-router). Each gets its own
# Prometheus port (both default to one fixed port, so two at once would clash): PORT + 100, or
# PORT + $PEER_PROMETHEUS_OFFSET when that is set.
peer_command() {
  local kind=$1 policy=$2 port=$3; shift 3
  local common=(--worker-urls "$@" --policy "$policy" --port "$port" --prometheus-port $((port + ${PEER_PROMETHEUS_OFFSET:-100})) --log-level error)
  case "$kind" in
    smg) PEER=("$SMG" launch "${common[@]}") ;;
    vllm) PEER=("$VLLM_ROUTER" "${common[@]}") ;;
    *) echo "unknown peer $kind" >&2; return 1 ;;
  esac
}

# ready_pid URL PID [TRIES]: waits (TRIES x 0.1 s, default 300) for URL to answer 2xx while
# process PID lives; fails at once when PID exits (a command that rejects its flags).
ready_pid() {
  local url=$1 pid=$2 tries=${3:-300}
  for _ in $(seq 1 "$tries"); do
    kill -0 "$pid" 2>/dev/null || { echo "exited before ready: $url" >&2; return 1; }
    curl -sf "$url" >/dev/null && return 0
    sleep 0.1
  done
  echo "not ready: $url" >&2; return 1
}

# descendants PID: the process ids of PID's children, their children, and so on.
descendants() { local c; for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done; }

# tree_ticks PID: CPU clock ticks (utime + stime, /proc/PID/stat fields 14 and 15, all
# threads) of PID and its descendants; a process gone meanwhile counts 0.
tree_ticks() {
  local total=0 p s f
  for p in "$1" $(descendants "$1"); do
    s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    s=${s##*) } # after "pid (comm) ": the comm may hold spaces; field 3 is now field 1
    read -r -a f <<<"$s"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

# stop_pid PID: stops PID and its descendants (TERM, KILL after 10 s), waits for PID and
# drops it from pids.
stop_pid() {
  local pid=$1 kids p rest=()
  kids=$(descendants "$pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  for p in $kids; do kill -9 "$p" 2>/dev/null || true; done
  wait "$pid" 2>/dev/null || true
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
  pids=("${rest[@]}")
}
