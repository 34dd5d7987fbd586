-- The done() hook of the wrk scripts benches/overhead_wrk.sh runs (post.lua, prefix_groups.lua):
-- when the run is done it prints
--   RESULT rps=... p50_us=... p99_us=... requests=... errors=... status_errors=... socket_errors=... duration_us=...
-- on one line for the caller to parse. errors = responses with status >= 400
-- (wrk's summary.errors.status) plus connect/read/write errors and timeouts.
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
