-- tollgate: `max_conn` shared by every replica (max_conn_lease). A key's
-- requests in flight are a sorted set: member = one request's slot
-- ("<replica>:<n>"), score = when its lease ends, on Redis TIME. A replica
-- renews the leases of its requests still running; a replica that died
-- stops renewing, and its slots end with their leases.
--
-- KEYS[1]: the set. ARGV[1]: "take" | "renew" | "free"; ARGV[2]: max;
-- ARGV[3]: lease ms; ARGV[4...]: members.
-- take: drops ended leases, then adds ARGV[4] if fewer than max are held:
--   1, or 0 when full. renew: the members still held get a new lease end;
--   returns how many. free: removes them. Every call is idempotent (a
--   member is one request's), so a retried call changes nothing more; the
--   set's TTL is its last lease's end, so no key outlives its slots.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, op, max, lease = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if op == 'take' then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZSCORE', key, ARGV[4]) then return 1 end
  if redis.call('ZCARD', key) >= max then return 0 end
  redis.call('ZADD', key, now + lease, ARGV[4])
  redis.call('PEXPIRE', key, lease)
  return 1
elseif op == 'renew' then
  local kept = 0
  for i = 4, #ARGV do
    local ends = redis.call('ZSCORE', key, ARGV[i])
    if ends and tonumber(ends) > now then
      redis.call('ZADD', key, now + lease, ARGV[i])
      kept = kept + 1
    end
  end
  if kept > 0 and redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
  return kept
else
  for i = 4, #ARGV do redis.call('ZREM', key, ARGV[i]) end
  return 0
end
