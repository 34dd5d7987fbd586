-- wrk script for benches/tree_memory.sh: chat POSTs of about BODY_BYTES (default 16384) bytes, 80 %
-- of the text a system prompt shared by one of 8 prefix groups, the rest a random suffix of its own,
-- so every request adds something new to a cache-aware router's text tree. Also
-- benches/overhead_wrk.sh's with LUA=benches/wrk/prefix_groups.lua (issue 29's conditions): it sets
-- BODY_BYTES per cell, and done() prints the RESULT line benches/wrk/post.lua prints.
-- With ROUTE=generate the requests are SGLang `/generate` POSTs with `input_ids` instead (the same
-- sizes and shares: 80 % of the ids a group's, the rest random), to the path /generate. With
-- ROUTE=messages they are Anthropic Messages POSTs to /v1/messages (the group's prompt as a
-- `system` text block, as Claude Code sends it; the suffix a user text block).
--   BODY_BYTES=16384 wrk -t2 -c64 -d60s -s benches/wrk/prefix_groups.lua http://HOST:PORT/v1/chat/completions
local size = tonumber(os.getenv("BODY_BYTES") or "16384")
local model = os.getenv("MODEL") or "default"
local generate = os.getenv("ROUTE") == "generate"
local messages = os.getenv("ROUTE") == "messages"
local groups = 8
local prefixes = {}
for g = 1, groups do
  if generate then
    -- Ids of six digits and a comma: seven bytes each.
    local ids = {}
    for i = 1, math.floor(size * 0.8 / 7) do ids[i] = tostring(100000 + (g * 7919 + i * 104729) % 50000) end
    prefixes[g] = table.concat(ids, ",")
  else
    local unit = "group " .. g .. " shares this system prompt with its conversations. "
    prefixes[g] = string.rep(unit, math.floor(size * 0.8 / #unit))
  end
end
local suffix_bytes = math.floor(size * 0.2)
local separator = generate and "," or " "

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
      local w = tostring(math.random(100000, 149999))
      words[#words + 1] = w
      n = n + #w + 1
    end
    blocks[b] = table.concat(words, separator)
  end
end

request = function()
  local g = math.random(1, groups)
  -- Unique from its first bytes: this thread's tag and a counter, then one of the random blocks.
  counter = counter + 1
  if generate then
    -- Unique from the first id after the group's: this thread's tag and the counter as ids.
    -- (ids under 150,000: within a real vocabulary, say Qwen3's 151,643).
    local unique = (100000 + tag % 50000) .. "," .. (100000 + counter % 50000) .. "," .. (100000 + math.floor(counter / 50000) % 50000)
    local ids = prefixes[g] .. "," .. unique .. "," .. blocks[math.random(1, #blocks)]
    local body = '{"input_ids":[' .. ids .. '],"sampling_params":{"max_new_tokens":8}}'
    return wrk.format("POST", "/generate", {["Content-Type"] = "application/json"}, body)
  end
  local suffix = tag .. "-" .. counter .. " " .. blocks[math.random(1, #blocks)]
  if messages then
    local body = '{"model":"' .. model .. '","max_tokens":8,"system":[{"type":"text","text":"' .. prefixes[g] ..
      '"}],"messages":[{"role":"user","content":[{"type":"text","text":"' .. suffix .. '"}]}]}'
    return wrk.format("POST", "/v1/messages", {["Content-Type"] = "application/json"}, body)
  end
  local body = '{"model":"' .. model .. '","max_tokens":8,"messages":[{"role":"system","content":"' .. prefixes[g] ..
    '"},{"role":"user","content":"' .. suffix .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end

-- done(): the RESULT line, from result.lua beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "result.lua")
