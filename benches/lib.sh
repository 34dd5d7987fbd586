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

# envoy_conf FILE LISTEN ADMIN EPP_PORT WORKER_URL...: Envoy's configuration, listening on LISTEN
# (admin on ADMIN; 0: any free port, read back from the admin's /listeners); with EPP_PORT (not
# ""), the ext_proc filter asks the endpoint picker there and an ORIGINAL_DST cluster sends where
# it says, as the Gateway API Inference Extension's gateways do; without, round robin over the
# workers. No access log. The picker's knobs, from the environment:
#   EPP_BODY=FULL_DUPLEX_STREAMED   request_body_mode (or BUFFERED)
#   EPP_RESPONSE_BODY               response_body_mode (default: FULL_DUPLEX_STREAMED with a full-duplex
#                                   request, else NONE); trailers are sent in the full-duplex modes
#   EPP_FAIL_OPEN=false             failure_mode_allow; true with WORKER_URLs given: a request the picker
#                                   did not place (it is down) goes round robin to them (a `fallback`
#                                   cluster routed when x-gateway-destination-endpoint is absent)
#   EPP_SUBSET="ip:port ..."        the subset hint set on every request (envoy.lb.subset_hint)
#   EPP_HEALTH_INTERVAL=0.2s        grpc.health.v1 checks of the picker (none by default)
# The router's tests (crates/router/tests/common/envoy.rs) run this same function.
# round_robin_cluster NAME ENDPOINTS: an Envoy STATIC cluster NAME, round robin over ENDPOINTS
# (`{endpoint: ...}, ` items), as YAML lines to append to `clusters:` (a newline first).
round_robin_cluster() {
  printf '\n  - name: %s\n    type: STATIC\n    lb_policy: ROUND_ROBIN\n    connect_timeout: 2s\n    load_assignment: {cluster_name: %s, endpoints: [{lb_endpoints: [%s]}]}' \
    "$1" "$1" "${2%, }"
}

envoy_conf() {
  local file=$1 listen=$2 admin=$3 epp=$4 filters cluster endpoints="" w trailers=SKIP response=NONE
  local body=${EPP_BODY:-FULL_DUPLEX_STREAMED} subset="" health="" e fallback="" route_cache=""
  local routes='[{match: {prefix: "/"}, route: {cluster: pool, timeout: 60s}}]'
  shift 4
  for w in "$@"; do
    w=${w#http://}
    endpoints+="{endpoint: {address: {socket_address: {address: ${w%:*}, port_value: ${w##*:}}}}}, "
  done
  if [ -n "$epp" ]; then
    [ "$body" = FULL_DUPLEX_STREAMED ] && { trailers=SEND; response=FULL_DUPLEX_STREAMED; }
    response=${EPP_RESPONSE_BODY:-$response}
    [ "$response" = FULL_DUPLEX_STREAMED ] && trailers=SEND
    if [ -n "${EPP_SUBSET:-}" ]; then
      for e in $EPP_SUBSET; do subset+="\"$e\", "; done
      subset="
          - name: envoy.filters.http.set_metadata
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata: [{metadata_namespace: envoy.lb.subset_hint, value: {x-gateway-destination-endpoint-subset: [${subset%, }]}}]"
    fi
    [ -z "${EPP_HEALTH_INTERVAL:-}" ] || health="
    health_checks: [{timeout: 1s, interval: $EPP_HEALTH_INTERVAL, unhealthy_threshold: 1, healthy_threshold: 1, grpc_health_check: {service_name: envoy.service.ext_proc.v3.ExternalProcessor}}]"
    if [ "${EPP_FAIL_OPEN:-false}" = true ] && [ -n "$endpoints" ]; then
      # Placed by the picker: where it says; not placed (the picker failed open): the pool's endpoints.
      routes='[{match: {prefix: "/", headers: [{name: x-gateway-destination-endpoint, present_match: true}]}, route: {cluster: pool, timeout: 60s}}, {match: {prefix: "/"}, route: {cluster: fallback, timeout: 60s}}]'
      route_cache="
              route_cache_action: CLEAR"
      fallback=$(round_robin_cluster fallback "$endpoints")
    fi
    filters="$subset
          - name: envoy.filters.http.ext_proc
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: epp}, timeout: 30s}
              failure_mode_allow: ${EPP_FAIL_OPEN:-false}
              message_timeout: 10s
              metadata_options: {forwarding_namespaces: {untyped: [envoy.lb.subset_hint]}}
              processing_mode: {request_header_mode: SEND, response_header_mode: SEND, request_body_mode: $body, response_body_mode: $response, request_trailer_mode: $trailers, response_trailer_mode: $trailers}$route_cache"
    cluster="
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config: {use_http_header: true, http_header_name: x-gateway-destination-endpoint}
  - name: epp
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}$health
    load_assignment: {cluster_name: epp, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $epp}}}}]}]}$fallback"
  else
    filters=""
    cluster=$(round_robin_cluster pool "$endpoints")
  fi
  cat >"$file" <<ENVOYCONF
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $listen}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config: {virtual_hosts: [{name: all, domains: ["*"], routes: $routes}]}
          http_filters:$(echo -e "$filters")
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:$(echo -e "$cluster")
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $admin}}}
ENVOYCONF
}

# nginx_conf DIR PORT HTTP_EXTRA SERVER_BODY: a private nginx (2 workers, its pid, logs and temp
# paths under DIR), keep-alive up to 100,000 requests a connection, no access log.
nginx_conf() {
  local dir=$1 port=$2 extra=$3 body=$4 user=""
  mkdir -p "$dir"/{client_body,proxy,fastcgi,uwsgi,scgi}_temp
  [ "$(id -u)" = 0 ] && user="user $(id -un);" # the workers can then use DIR (mode 700)
  cat >"$dir/nginx.conf" <<NGINX
$user
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000;
  keepalive_timeout 300s;
  client_max_body_size 16m;
  client_body_buffer_size 64k;
  client_body_temp_path $dir/client_body_temp;
  proxy_temp_path $dir/proxy_temp;
  fastcgi_temp_path $dir/fastcgi_temp;
  uwsgi_temp_path $dir/uwsgi_temp;
  scgi_temp_path $dir/scgi_temp;
  $extra
  server {
    listen 127.0.0.1:$port;
    $body
  }
}
NGINX
}
# nginx_cmd DIR: NGINX_CMD, the command line of the nginx of nginx_conf DIR ($NGINX, else the one on PATH).
nginx_cmd() { NGINX_CMD=("${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}" -p "$1" -e "$1/error.log" -c "$1/nginx.conf" -g "daemon off;"); }

# make_body SIZE FILE: a chat completion of SIZE bytes, a system prompt and a user message padding it
# (benches/overhead_wrk.sh, benches/instructions.sh).
make_body() { # SIZE FILE
  local size=$1 file=$2 head tail pad
  head='{"model":"bench","messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly."},{"role":"user","content":"'
  tail='"}],"max_tokens":8}'
  pad=$((size - ${#head} - ${#tail}))
  [ "$pad" -gt 0 ] || pad=1
  { printf '%s' "$head"
    awk -v n="$pad" 'BEGIN { s = ""; while (length(s) < n) s = s "the quick brown fox jumps over the lazy dog "; printf "%s", substr(s, 1, n) }'
    printf '%s' "$tail"; } >"$file"
}
