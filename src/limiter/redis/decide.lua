-- tollgate: decide every limit of one request atomically.
--
-- The same integer arithmetic as src/limiter/algorithm.rs, step for step,
-- so a key decides alike on either store. Lua numbers are doubles, exact up
-- to 2^53; config validation keeps every product below that.
--
-- KEYS[i]: the state of check i, one string "<tag>:<n>:<n>..." whose tag
-- names the algorithm (a state of another algorithm reads as a new key).
-- ARGV[1]: the clock in ms, or 0 for Redis TIME (tests pin it).
-- ARGV[2 + 8(i-1) ...]: per check: algorithm tag, p1, p2, p3, cost,
--   peek (1 = decide, never charge), group, dry run (1/0).
-- Consecutive checks of one group are all or nothing; when an enforced
-- group rejects, later groups are not decided.
-- Returns: now, then per decided check: verdict (0 allow, 1 delay,
-- 2 reject), delay ms, remaining, reset ms, retry-after ms.
-- Every write carries a TTL: after it the key decides like a new one.

if redis.replicate_commands then redis.replicate_commands() end

local floor, max, min = math.floor, math.max, math.min
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end

-- floor(a / b) for integers, corrected for any rounding of the division
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -idiv(-a, b) end
local U32 = 4294967295

local function fields(v, tag)
  if not v or string.sub(v, 1, 1) ~= tag then return nil end
  local out = {}
  for n in string.gmatch(v, ':(%-?%d+)') do out[#out + 1] = tonumber(n) end
  return out
end

local function enc_list(tag, list)
  local parts = { tag }
  for k = 1, #list do parts[k + 1] = string.format('%d', list[k]) end
  return table.concat(parts, ':')
end
local function enc(tag, ...) return enc_list(tag, { ... }) end

-- Each returns verdict, delay, remaining, reset, retry, new state, ttl ms.
local algorithms = {}

algorithms.F = function(v, limit, w, _, cost)
  local start = idiv(now, w) * w
  local s = fields(v, 'F')
  local count = (s and s[1] == start) and s[2] or 0
  local reset = start + w - now
  if count + cost <= limit then
    return 0, 0, limit - count - cost, reset, 0, enc('F', start, count + cost), reset
  end
  return 2, 0, max(0, limit - count), reset, reset
end

local function sliding_retry(prev, curr, elapsed, w, l, c)
  if curr + c <= l and prev > 0 then
    local t = cdiv(prev * (w - elapsed) + (curr + c) * w - l * w, prev)
    if t < w - elapsed then return max(t, 1) end
  end
  local to_next = w - elapsed
  if c > l then return to_next + w end
  if curr == 0 or curr + c <= l then return max(to_next, 1) end
  local u = w - min(idiv((l - c) * w, curr), w)
  if curr * (w - u) + c * w > l * w then u = u + 1 end
  return to_next + min(u, w)
end

algorithms.S = function(v, limit, w, _, cost)
  local start = idiv(now, w) * w
  local s = fields(v, 'S')
  local prev, curr = 0, 0
  if s and s[1] == start then prev, curr = s[2], s[3]
  elseif s and s[1] + w == start then prev = s[3] end
  local elapsed = now - start
  local used = prev * (w - elapsed) + curr * w
  local reset = w - elapsed
  if used + cost * w <= limit * w then
    return 0, 0, idiv(limit * w - used - cost * w, w), reset, 0,
      enc('S', start, prev, min(curr + cost, U32)), start + 2 * w - now
  end
  return 2, 0, idiv(max(0, limit * w - used), w), reset,
    sliding_retry(prev, curr, elapsed, w, limit, cost)
end

algorithms.L = function(v, limit, w, _, cost)
  local s = fields(v, 'L') or {}
  -- (time, cost) pairs, oldest first; drop those out of the window
  local first, total = 1, 0
  while s[first] and s[first] + w <= now do first = first + 2 end
  for i = first, #s, 2 do total = total + s[i + 1] end
  local oldest = s[first] or now
  if total + cost <= limit then
    local kept = {}
    for i = first, #s do kept[#kept + 1] = s[i] end
    if kept[#kept - 1] == now then
      kept[#kept] = min(kept[#kept] + cost, U32)
    else
      kept[#kept + 1] = now
      kept[#kept + 1] = cost
    end
    return 0, 0, limit - total - cost, oldest + w - now, 0, enc_list('L', kept), w
  end
  local freed, retry = 0, w
  for i = first, #s, 2 do
    freed = freed + s[i + 1]
    if total - freed + cost <= limit then
      retry = s[i] + w - now
      break
    end
  end
  return 2, 0, max(0, limit - total), oldest + w - now, retry
end

algorithms.B = function(v, a, p, burst, cost)
  local capacity = burst * p
  local s = fields(v, 'B')
  local level = capacity
  if s then
    local elapsed = max(0, now - s[2])
    if elapsed < cdiv(capacity - s[1], a) then level = s[1] + elapsed * a end
  end
  local need = cost * p
  if level >= need then
    local after = level - need
    local reset = cdiv(capacity - after, a)
    return 0, 0, idiv(after, p), reset, 0, enc('B', after, now), max(reset, 1)
  end
  return 2, 0, idiv(level, p), cdiv(capacity - level, a), cdiv(need - level, a)
end

algorithms.G = function(v, a, p, burst, cost)
  -- tat kept as (whole ms, remainder in 1/a ms); d = tat - now, in 1/a ms
  local tolerance = burst * p
  local s = fields(v, 'G')
  local d = 0
  if s and s[1] >= now then d = (s[1] - now) * a + s[2] end
  local nd = d + cost * p
  if nd <= tolerance then
    local reset = cdiv(nd, a)
    local q = idiv(nd, a)
    return 0, 0, idiv(tolerance - nd, p), reset, 0, enc('G', now + q, nd - q * a), max(reset, 1)
  end
  return 2, 0, idiv(max(0, tolerance - d), p), cdiv(d, a), cdiv(nd - tolerance, a)
end

algorithms.K = function(v, rate, burst, delay, cost)
  local burst_m, cost_m = burst * 1000, 1000 * cost
  local s = fields(v, 'K')
  local excess, stored, ms
  if s then
    ms = max(0, now - s[2])
    stored = s[1]
    -- past a full drain the result is 0 however long it was
    if ms > cdiv((stored + cost_m) * 1000, rate) then
      excess = 0
    else
      excess = max(0, stored - idiv(rate * ms, 1000) + cost_m)
    end
  else
    excess, stored, ms = cost_m - 1000, 0, 0
  end
  if excess > burst_m then
    local total = cdiv((stored + cost_m - burst_m) * 1000, rate)
    return 2, 0, 0, cdiv(stored * 1000, rate), max(total - ms, 1)
  end
  local wait = 0
  if delay >= 0 and excess > delay * 1000 then
    wait = idiv((excess - delay * 1000) * 1000, rate)
  end
  local last = now
  if s and now <= s[2] then last = s[2] end
  local reset = cdiv(excess * 1000, rate)
  return (wait > 0) and 1 or 0, wait, idiv(burst_m - excess, 1000), reset, 0,
    enc('K', excess, last), max(60000, reset)
end

local out = { now }
local n = #KEYS
local i = 1
while i <= n do
  local group = ARGV[2 + 8 * (i - 1) + 6]
  local dry = ARGV[2 + 8 * (i - 1) + 7] == '1'
  local j = i
  while j < n and ARGV[2 + 8 * j + 6] == group and (ARGV[2 + 8 * j + 7] == '1') == dry do
    j = j + 1
  end
  local ok = true
  local writes = {}
  for k = i, j do
    local b = 2 + 8 * (k - 1)
    local f = algorithms[ARGV[b]]
    local verdict, wait, remaining, reset, retry, state, ttl = f(redis.call('GET', KEYS[k]),
      tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]))
    out[#out + 1] = verdict
    out[#out + 1] = wait
    out[#out + 1] = remaining
    out[#out + 1] = reset
    out[#out + 1] = retry
    if verdict == 2 then ok = false
    elseif ARGV[b + 5] ~= '1' then writes[#writes + 1] = { KEYS[k], state, ttl } end
  end
  if ok then
    for _, w in ipairs(writes) do redis.call('SET', w[1], w[2], 'PX', max(1, w[3])) end
  end
  if not ok and not dry then break end
  i = j + 1
end
return out
