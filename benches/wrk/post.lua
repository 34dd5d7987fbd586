-- wrk script for benches/overhead_wrk.sh: POSTs the JSON body in the file named by
-- $WRK_BODY_FILE (Content-Type: application/json) and, when the run is done, prints
--   RESULT rps=... p50_us=... p99_us=... requests=... errors=... status_errors=... socket_errors=... duration_us=...
-- on one line for the caller to parse. errors = responses with status >= 400
-- (wrk's summary.errors.status) plus connect/read/write errors and timeouts.
-- The request is static (no request() or response() hook), so wrk builds it once per
-- thread and does no Lua work per request: the load generator stays as cheap as it can be.
--   WRK_BODY_FILE=body.json wrk -t2 -c64 -d10s -s benches/wrk/post.lua http://HOST:PORT/v1/chat/completions

local file = os.getenv("WRK_BODY_FILE")
if file == nil or file == "" then
  error("WRK_BODY_FILE must name the file holding the request body")
end
local f = assert(io.open(file, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  local socket = e.connect + e.read + e.write + e.timeout
  local secs = summary.duration / 1e6
  local rps = 0
  if secs > 0 then rps = summary.requests / secs end
  io.write(string.format(
    "RESULT rps=%.1f p50_us=%d p99_us=%d requests=%d errors=%d status_errors=%d socket_errors=%d duration_us=%d\n",
    rps, latency:percentile(50), latency:percentile(99), summary.requests,
    e.status + socket, e.status, socket, summary.duration))
end
