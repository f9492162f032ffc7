-- tollgate: give back what decide.lua charged, for a request that one part
-- of a Redis Cluster admitted and another part refused (its keys live in
-- different slots, so no one script could decide them all).
--
-- KEYS[i]: the state of check i. ARGV[1]: the clock decide.lua charged at.
-- ARGV[2 + 5(i-1) ...]: algorithm (1-7: F S L B G K Q), p1, p2, p3, cost.
-- Only the charge made at that instant is taken back; TTLs are kept.

local floor, max, min = math.floor, math.max, math.min
local now = tonumber(ARGV[1])
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
-- The numbers a state was written under ("|p1,p2,p3", see decide.lua)
-- are kept as they are.
local params = ''
local function fields(v, tag)
  if not v or string.sub(v, 1, 1) ~= tag then return nil end
  local body, rest = string.match(v, '^([^|]*)(.*)$')
  params = rest
  local out = {}
  for n in string.gmatch(body, ':(%-?%d+)') do out[#out + 1] = tonumber(n) end
  return out
end
local function put(key, tag, list)
  local parts = { tag }
  for k = 1, #list do parts[k + 1] = string.format('%d', list[k]) end
  redis.call('SET', key, table.concat(parts, ':') .. params, 'KEEPTTL')
end

local TAGS = { 'F', 'S', 'L', 'B', 'G', 'K', 'Q' }
for i = 1, #KEYS do
  local b = 2 + 5 * (i - 1)
  local tag = TAGS[tonumber(ARGV[b])]
  local p1, p2, p3, cost = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
    tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local key = KEYS[i]
  local s = fields(redis.call('GET', key), tag)
  if s then
    if tag == 'F' then
      if s[1] == idiv(now, p2) * p2 then put(key, 'F', { s[1], max(0, s[2] - cost) }) end
    elseif tag == 'S' then
      if s[1] == idiv(now, p2) * p2 then put(key, 'S', { s[1], s[2], max(0, s[3] - cost) }) end
    elseif tag == 'L' then
      local kept = {}
      for k = 1, #s, 2 do
        local c = s[k + 1]
        if s[k] == now then c = c - cost end
        if c > 0 then kept[#kept + 1] = s[k]; kept[#kept + 1] = c end
      end
      put(key, 'L', kept)
    elseif tag == 'B' then
      put(key, 'B', { min(p3 * p2, s[1] + cost * p2), s[2] })
    elseif tag == 'G' then
      local d = (s[1] - now) * p1 + s[2] - cost * p2
      if d <= 0 then redis.call('DEL', key)
      else
        local q = idiv(d, p1)
        put(key, 'G', { now + q, d - q * p1 })
      end
    elseif tag == 'Q' then
      -- only into the period that was charged
      if s[1] <= now and (s[2] == 0 or now < s[2]) then
        put(key, 'Q', { s[1], s[2], max(0, s[3] - cost) })
      end
    elseif tag == 'K' then
      put(key, 'K', { max(0, s[1] - 1000 * cost), s[2] })
    end
  end
end
return #KEYS
