-- wrk script for benches/tree_memory.sh: chat POSTs of about BODY_BYTES (default 16384) bytes, 80 %
-- of the text a system prompt shared by one of 8 prefix groups, the rest a random suffix of its own,
-- so every request adds something new to a cache-aware router's text tree. Also
-- benches/overhead_wrk.sh's with LUA=benches/wrk/prefix_groups.lua (issue 29's conditions): it sets
-- BODY_BYTES per cell, and done() prints the RESULT line benches/wrk/post.lua prints.
--   BODY_BYTES=16384 wrk -t2 -c64 -d60s -s benches/wrk/prefix_groups.lua http://HOST:PORT/v1/chat/completions
local size = tonumber(os.getenv("BODY_BYTES") or "16384")
local model = os.getenv("MODEL") or "default"
local groups = 8
local prefixes = {}
for g = 1, groups do
  local unit = "group " .. g .. " shares this system prompt with its conversations. "
  prefixes[g] = string.rep(unit, math.floor(size * 0.8 / #unit))
end
local suffix_bytes = math.floor(size * 0.2)

local blocks, tag, counter = {}, 0, 0

function init(args)
  -- Each thread its own seed: a fresh table's address differs between the threads' Lua states.
  local addr = tonumber(tostring({}):match("0x(%x+)") or "0", 16) or 0
  math.randomseed(os.time() + addr % 1000003)
  tag = math.random(100000, 999999)
  -- 64 random suffixes made once: built per request, in Lua, they cost wrk some 70 us each
  -- at 16 KiB, a load generator as busy as the router it measures.
  for b = 1, 64 do
    local words, n = {}, 0
    while n < suffix_bytes do
      local w = tostring(math.random(100000, 999999))
      words[#words + 1] = w
      n = n + #w + 1
    end
    blocks[b] = table.concat(words, " ")
  end
end

request = function()
  local g = math.random(1, groups)
  -- Unique from its first bytes: this thread's tag and a counter, then one of the random blocks.
  counter = counter + 1
  local suffix = tag .. "-" .. counter .. " " .. blocks[math.random(1, #blocks)]
  local body = '{"model":"' .. model .. '","max_tokens":8,"messages":[{"role":"system","content":"' .. prefixes[g] ..
    '"},{"role":"user","content":"' .. suffix .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end

-- done(): the RESULT line, from result.lua beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")
