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

-- done(): the RESULT line, from result.lua beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")
