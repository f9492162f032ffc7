-- tollgate: the penalty box's strike (src/limiter/penalty.rs, step for
-- step): records a refusal of one key and starts a ban when it is the
-- `after`-th within `within` ms.
--
-- KEYS[1]: the key's record "strikes:since:level:until".
-- ARGV: now in ms (0: Redis TIME), after, within ms, forgive ms, then the
-- ban lengths in ms, one per repeat (the last repeated).
-- Returns { until, level, started }: the ban in force (until 0: none) and
-- 1 when this strike started it. The record lives as long as it can
-- still change a decision.

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local after, within, forgive = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local bans = {}
for i = 5, #ARGV do bans[#bans + 1] = tonumber(ARGV[i]) end

local strikes, since, level, untl = 0, 0, 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local a, b, c, d = string.match(v, '^(%d+):(%d+):(%d+):(%d+)$')
  if a then strikes, since, level, untl = tonumber(a), tonumber(b), tonumber(c), tonumber(d) end
end
if untl > now then return { untl, level, 0 } end
if strikes == 0 or now - since >= within then strikes, since = 0, now end
strikes = strikes + 1
local started = 0
if strikes >= after then
  if untl > 0 and forgive > 0 then
    level = math.max(0, level - math.floor((now - untl) / forgive))
  end
  untl = now + bans[math.min(level + 1, #bans)]
  level, strikes, started = level + 1, 0, 1
end
local keep = math.max(since + within - now, untl + forgive * level - now, 1)
redis.call('SET', KEYS[1], string.format('%d:%d:%d:%d', strikes, since, level, untl), 'PX', keep)
if started == 1 then return { untl, level, 1 } end
return { 0, level, 0 }
