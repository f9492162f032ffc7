-- tollgate: settle costs reserved by decide.lua, once the answer told the
-- real cost (src/limiter/algorithm/settle.rs, step for step).
--
-- The same for a sliding log: a refund from the entries at or before the
-- reservation (within 5 ms, the two clocks' slack), an extra as a new entry.
-- KEYS[i]: the state of check i. ARGV[1]: how long ago (ms) the costs
-- were reserved. ARGV[2 + 5(i-1) ...]: algorithm (1-6: F S L B G K), p1,
-- p2, p3, delta (7: Q, a calendar quota: its state "Q:start:end:count"): units more than reserved (fewer when negative). A state
-- keeps the numbers it was written under ("|p1,p2,p3"); those are used
-- when present. Clocked by Redis TIME; the TTL is kept or lengthened so
-- a debt outlives its wait. Returns the number of keys settled.

local floor, max, min = math.floor, math.max, math.min
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local at = now - tonumber(ARGV[1])
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -idiv(-a, b) end
local TAGS = { 'F', 'S', 'L', 'B', 'G', 'K', 'Q' }
local settled = 0
for i = 1, #KEYS do
  local b = 2 + 5 * (i - 1)
  local tag = TAGS[tonumber(ARGV[b])]
  local p = { tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]) }
  local delta = tonumber(ARGV[b + 4])
  local key = KEYS[i]
  local v = redis.call('GET', key)
  local s, params = {}, nil
  if v and string.sub(v, 1, 1) == tag then
    local body, rest = string.match(v, '^([^|]*)(.*)$')
    for n in string.gmatch(body, ':(%-?%d+)') do s[#s + 1] = tonumber(n) end
    local a, bb, c = string.match(rest, '^|(%-?%d+),(%-?%d+),(%-?%d+)$')
    if a then p, params = { tonumber(a), tonumber(bb), tonumber(c) }, rest end
  else
    s = nil
  end
  params = params or string.format('|%d,%d,%d', p[1], p[2], p[3])
  local out, ttl
  if tag == 'F' then
    local w = p[2]
    local start = idiv(now, w) * w
    if delta > 0 then
      local count = (s and s[1] == start) and s[2] or 0
      out, ttl = { start, count + delta }, start + w - now
    elseif s and s[1] == idiv(at, w) * w then
      out = { s[1], max(0, s[2] + delta) }
    end
  elseif tag == 'S' then
    local w = p[2]
    local start = idiv(now, w) * w
    if delta > 0 then
      local prev, curr = 0, 0
      if s and s[1] == start then prev, curr = s[2], s[3]
      elseif s and s[1] + w == start then prev = s[3] end
      out, ttl = { start, prev, min(curr + delta, 4294967295) }, start + 2 * w - now
    elseif s then
      local reserved_in = idiv(at, w) * w
      if s[1] == reserved_in then out = { s[1], s[2], max(0, s[3] + delta) }
      elseif s[1] == reserved_in + w then out = { s[1], max(0, s[2] + delta), s[3] } end
    end
  elseif tag == 'B' then
    local a, per, burst = p[1], p[2], p[3]
    local capacity = burst * per
    local balance = capacity
    if s then
      if s[1] == 0 and s[2] > now then balance = -(s[2] - now) * a
      else balance = min(s[1] + (now - s[2]) * a, capacity) end
    end
    if s or delta > 0 then
      balance = min(balance - delta * per, capacity)
      if balance >= 0 then out = { balance, now }
      else out = { 0, now + cdiv(-balance, a) } end
      ttl = max(out[2] - now, 0) + cdiv(capacity - out[1], a)
    end
  elseif tag == 'L' then
    -- (time, cost) pairs, oldest first
    if delta > 0 then
      out = s or {}
      if out[#out - 1] == now then out[#out] = out[#out] + delta
      else out[#out + 1] = now; out[#out + 1] = delta end
      ttl = p[2]
    elseif s then
      local left = -delta
      for k = #s - 1, 1, -2 do
        if left == 0 then break end
        if s[k] <= at + 5 then
          local take = min(left, s[k + 1])
          s[k + 1] = s[k + 1] - take
          left = left - take
        end
      end
      out = {}
      for k = 1, #s - 1, 2 do
        if s[k + 1] > 0 then out[#out + 1] = s[k]; out[#out + 1] = s[k + 1] end
      end
    end
  elseif tag == 'Q' then
    -- within the state's period (its end unknown: 0): an extra is added,
    -- a refund taken back when reserved in it; past it, nothing
    if s and (s[2] == 0 or now < s[2]) and (delta > 0 or at >= s[1]) then
      out = { s[1], s[2], max(0, s[3] + delta) }
    end
  elseif tag == 'G' then
    local a, per = p[1], p[2]
    -- (whole ms, remainder in 1/a ms) as decide.lua keeps it
    local d = 0
    if s and s[1] >= now then d = (s[1] - now) * a + s[2] end
    if s or delta > 0 then
      d = max(0, d + delta * per)
      local q = idiv(d, a)
      out, ttl = { now + q, d - q * a }, max(cdiv(d, a), 1)
    end
  end
  if out then
    local parts = { tag }
    for k = 1, #out do parts[k + 1] = string.format('%d', out[k]) end
    local value = table.concat(parts, ':') .. params
    local left = redis.call('PTTL', key)
    if ttl and ttl > left then
      redis.call('SET', key, value, 'PX', max(ttl, 1))
    elseif left > 0 then
      redis.call('SET', key, value, 'KEEPTTL')
    else
      redis.call('SET', key, value, 'PX', max(ttl or 1000, 1))
    end
    settled = settled + 1
  end
end
return settled
