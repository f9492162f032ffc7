-- tollgate: decide every limit of one request atomically.
--
-- The same integer arithmetic as src/limiter/algorithm.rs, step for step,
-- so a key decides alike on either store. Lua numbers are doubles, exact up
-- to 2^53; config validation keeps every product below that.
--
-- KEYS: the state of each check, request after request; one string
-- "<tag>:<n>:<n>..." whose tag names the algorithm (a state of another
-- algorithm reads as a new key).
-- ARGV[1]: the clock in ms, or 0 for Redis TIME (tests pin it); with
--   ":<version>" after it, the overrides version (see below).
-- ARGV[2...]: one per request, its checks "c;c;...", each check
--   "algorithm,p1,p2,p3,cost,peek,group,dry": algorithm 1-7 (F S L B G K Q),
--   peek 1 = decide but never charge, dry 1 = a dry-run group. A request
--   repeated n times in a row (the same keys, the same checks: one
--   client's burst) comes once, after an argument "*<n>", with its keys
--   once; it is decided n times, as n separate requests would be.
-- Consecutive checks of one group are all or nothing; when an enforced
-- group rejects, later groups of that request are not decided.
-- Returns one string of 8-byte big-endian integers (struct.pack, read back
-- in one pass by the client, where an array of integer replies costs a
-- parse per number): now, then per request: the number of checks decided,
-- and per decided check: its code (0 allowed, > 0 allowed after that delay
-- in ms, < 0 rejected: -1 - retry-after ms), remaining, reset ms.
-- Every write carries a TTL: after it the key decides like a new one.
--
-- Loaded two ways (src/limiter/redis/batch.rs), the same code either way:
-- as a Redis function library (Redis 7 and later), where `make` runs once,
-- at the first call, and what it returns decides every call after, so
-- the definitions below and the parsed specs are made once; or as an
-- EVALSHA script (older servers, clusters), which makes them each call.
-- The loader appends the few lines that differ.

local function make()
  local floor, max, min = math.floor, math.max, math.min
  -- The clock of the call, and its shortest TTL written (set per call).
  local now, min_ttl

  -- floor(a / b) for integers (b > 0), corrected for any rounding of the
  -- division. `a % b` is a - floor(a / b) * b in the VM itself, so this
  -- takes no call to math.floor; the product is exact below 2^53, so the
  -- difference divides exactly.
  local function idiv(a, b)
    local q = (a - a % b) / b
    if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
    return q
  end
  -- ceil(a / b), likewise (-floor(-a / b))
  local function cdiv(a, b)
    local q = (a + -a % b) / b
    if q * b < a then q = q + 1 elseif (q - 1) * b >= a then q = q - 1 end
    return q
  end
  local U32 = 4294967295

  -- States are stored as "<tag>:<n>:<n>[:<n>...]|<p1>,<p2>,<p3>" and decoded
  -- once per call into { tag, n, n, ..., p = { p1, p2, p3 } }: the numbers
  -- of the limit that wrote them, so a reload that changes them rescales the
  -- state instead of misreading it (a value without them, written before
  -- they were kept, is read under the current numbers). A state of another
  -- algorithm (a limit whose algorithm changed) decides like a new key.
  local match, format, tonumber = string.match, string.format, tonumber
  -- The numbers of every limit parsed ("p1,p2,p3" -> its table, see parse):
  -- a state written under a limit's current numbers reads them from here,
  -- without parsing them.
  local known = {}
  local function decode(v)
    if not v then return false end
    -- The usual state (two numbers: all but the sliding window and log),
    -- written under the numbers of a limit parsed: no parsing them.
    local tag, a, b, ps = match(v, '^(%u):(%d+):(%d+)|(.*)$')
    local p = tag and tag ~= 'L' and known[ps]
    if p then return { tag, tonumber(a), tonumber(b), p = p } end
    local body, params = match(v, '^([^|]*)|(.*)$')
    if not body then body = v end
    p = nil
    if params then
      local a, b, c = match(params, '^(%-?%d+),(%-?%d+),(%-?%d+)$')
      if a then p = { tonumber(a), tonumber(b), tonumber(c) } end
    end
    local tag = string.sub(body, 1, 1)
    if tag == 'L' then
      local s = { 'L', p = p }
      for n in string.gmatch(body, '%d+') do s[#s + 1] = tonumber(n) end
      return s
    end
    local a, b, c = match(body, '^%u:(%d+):(%d+):?(%d*)$')
    if not a then return false end
    return { tag, tonumber(a), tonumber(b), tonumber(c), p = p }
  end
  local function encode(s)
    local v
    if s[1] == 'S' or s[1] == 'Q' then v = format('%s:%d:%d:%d', s[1], s[2], s[3], s[4])
    elseif s[1] ~= 'L' then v = format('%s:%d:%d', s[1], s[2], s[3])
    else
      local parts = { 'L' }
      for k = 2, #s do parts[k] = format('%d', s[k]) end
      v = table.concat(parts, ':')
    end
    local p = s.p
    if p then v = v .. (p.s or format('|%d,%d,%d', p[1], p[2], p[3])) end
    return v
  end

  -- A state written under other numbers (a reload changed the limit): the
  -- client keeps the share of its budget it had used, rounded against it,
  -- as src/limiter/algorithm/rescale.rs does for the memory store.
  -- o: the numbers it was written under, n: the current ones.
  local function up(used, num, den) return cdiv(used * num, den) end
  local rescale = {}
  rescale.F = function(s, o, n)
    local start = idiv(now, o[2]) * o[2]
    local count = (s[2] == start) and s[3] or 0
    count = min(up(count, n[1], o[1]), U32)
    if n[2] ~= o[2] then start = idiv(now, n[2]) * n[2] end
    return { 'F', start, count }
  end
  rescale.S = function(s, o, n)
    local w0 = o[2]
    local start = idiv(now, w0) * w0
    local prev, curr = 0, 0
    if s[2] == start then prev, curr = s[3], s[4]
    elseif s[2] + w0 == start then prev = s[4] end
    if n[2] == w0 then
      return { 'S', start, min(up(prev, n[1], o[1]), U32), min(up(curr, n[1], o[1]), U32) }
    end
    local used = cdiv(prev * (start + w0 - now), w0) + curr
    return { 'S', idiv(now, n[2]) * n[2], 0, min(up(used, n[1], o[1]), U32) }
  end
  rescale.L = function(s, o, n)
    local out = { 'L' }
    for i = 2, #s, 2 do
      out[i] = s[i]
      out[i + 1] = min(up(s[i + 1], n[1], o[1]), U32)
    end
    return out
  end
  rescale.B = function(s, o, n)
    local capacity0 = o[3] * o[2]
    local level = min(s[2] + max(0, now - s[3]) * o[1], capacity0)
    return { 'B', floor(level * ((n[3] * n[2]) / capacity0)), now }
  end
  rescale.G = function(s, o, n)
    local d = 0
    if s[2] >= now then d = (s[2] - now) * o[1] + s[3] end
    local nd = math.ceil(d * ((n[3] * n[2]) / (o[3] * o[2])))
    local q = idiv(nd, n[1])
    return { 'G', now + q, nd - q * n[1] }
  end
  -- (a quota's numbers also hold its period, which moves: only a new
  -- limit scales the count)
  rescale.Q = function(s, o, n)
    if o[1] == n[1] then return { 'Q', s[2], s[3], s[4] } end
    return { 'Q', s[2], s[3], up(s[4], n[1], o[1]) }
  end
  rescale.K = function(s, o, n)
    local excess = max(0, s[2] - idiv(o[1] * max(0, now - s[3]), 1000))
    if excess > 0 then excess = max(0, up(excess + 1000, n[2] + 1, o[2] + 1) - 1000) end
    return { 'K', excess, now }
  end

  -- Each takes the decoded state (false for none), the limit's numbers and
  -- the cost, the numbers as one table (`par`, kept in the new state), and
  -- whether an admitted state is final (`mine`: see put). It returns its
  -- code (0 allowed, > 0 allowed after that delay in ms, < 0 rejected:
  -- -1 - retry-after ms), remaining, reset ms, and when admitted the new
  -- state and its TTL in ms.
  local algorithms = {}

  -- The new state <tag>:a:b[:c] of an admitted request. When it is final
  -- (its check is alone in its group and charges: no later verdict can
  -- take it back) and the old state is of the same algorithm, the old
  -- state's table is written over: every state table belongs to one key
  -- of one call (decoded, or made by the call), and a run of one client's
  -- requests would otherwise make and collect a table per request.
  local function put(s, mine, tag, a, b, par, c)
    if mine and s and s[1] == tag then
      s[2], s[3], s[4], s.p = a, b, c, par
      return s
    end
    return { tag, a, b, c, p = par }
  end

  algorithms.F = function(s, limit, w, _, cost, par, mine)
    local start = idiv(now, w) * w
    local count = (s and s[1] == 'F' and s[2] == start) and s[3] or 0
    local reset = start + w - now
    if count + cost <= limit then
      return 0, limit - count - cost, reset, put(s, mine, 'F', start, count + cost, par), reset
    end
    return -1 - reset, max(0, limit - count), reset
  end

  -- A calendar quota: limit per period, [start, stop) by the caller's
  -- clock. Redis's clock picks the period: the caller's, or the one before
  -- it (a caller whose clock is ahead) or after it (behind), whose other
  -- end the caller did not send (0 in the state: not known). A state
  -- "Q:start:end:count" counts in the period it names by either end, so
  -- replicas whose clocks straddle a boundary share one count. Its key
  -- lives to the period's end (when not known, the caller's period length
  -- and 4 days more: months differ by up to 3).
  algorithms.Q = function(s, limit, start, stop, cost, par, mine)
    local ps, pe = start, stop
    if now < start then ps, pe = 0, start elseif now >= stop then ps, pe = stop, 0 end
    local count = 0
    if s and s[1] == 'Q' and ((ps > 0 and s[2] == ps) or (pe > 0 and s[3] == pe)) then
      count = s[4]
      if ps == 0 then ps = s[2] end
      if pe == 0 then pe = s[3] end
    end
    local reset, ttl
    if pe > 0 then
      reset = max(pe - now, 1)
      ttl = reset
    else
      reset = max(ps + stop - start - now, 1)
      ttl = reset + 345600000
    end
    if count + cost <= limit then
      return 0, limit - count - cost, reset, put(s, mine, 'Q', ps, pe, par, count + cost), ttl
    end
    return -1 - reset, max(0, limit - count), reset
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

  algorithms.S = function(s, limit, w, _, cost, par, mine)
    local start = idiv(now, w) * w
    local prev, curr = 0, 0
    if s and s[1] == 'S' then
      if s[2] == start then prev, curr = s[3], s[4]
      elseif s[2] + w == start then prev = s[4] end
    end
    local elapsed = now - start
    local used = prev * (w - elapsed) + curr * w
    local reset = w - elapsed
    if used + cost * w <= limit * w then
      return 0, idiv(limit * w - used - cost * w, w), reset,
        put(s, mine, 'S', start, prev, par, min(curr + cost, U32)), start + 2 * w - now
    end
    return -1 - sliding_retry(prev, curr, elapsed, w, limit, cost),
      idiv(max(0, limit * w - used), w), reset
  end

  algorithms.L = function(s, limit, w, _, cost, par)
    if not (s and s[1] == 'L') then s = { 'L' } end
    -- (time, cost) pairs from s[2], oldest first; drop those out of the window
    local first, total = 2, 0
    while s[first] and s[first] + w <= now do first = first + 2 end
    for i = first, #s, 2 do total = total + s[i + 1] end
    local oldest = s[first] or now
    if total + cost <= limit then
      local kept = { 'L', p = par }
      for i = first, #s do kept[#kept + 1] = s[i] end
      if kept[#kept - 1] == now then
        kept[#kept] = min(kept[#kept] + cost, U32)
      else
        kept[#kept + 1] = now
        kept[#kept + 1] = cost
      end
      return 0, limit - total - cost, oldest + w - now, kept, w
    end
    local freed, retry = 0, w
    for i = first, #s, 2 do
      freed = freed + s[i + 1]
      if total - freed + cost <= limit then
        retry = s[i] + w - now
        break
      end
    end
    return -1 - retry, max(0, limit - total), oldest + w - now
  end

  algorithms.B = function(s, a, p, burst, cost, par, mine)
    local capacity = burst * p
    local level, debt = capacity, 0
    if s and s[1] == 'B' then
      local stored, last = s[2], s[3]
      local elapsed = max(0, now - last)
      if elapsed < cdiv(capacity - stored, a) then level = stored + elapsed * a end
      -- a settled cost past empty: refill starts after the debt
      if stored == 0 and last > now then debt = last - now end
    end
    local need = cost * p
    if level >= need and debt == 0 then
      local after = level - need
      local reset = cdiv(capacity - after, a)
      return 0, idiv(after, p), reset, put(s, mine, 'B', after, now, par), max(reset, 1)
    end
    return -1 - max(cdiv(need - level, a), 1) - debt, idiv(level, p), cdiv(capacity - level, a) + debt
  end

  algorithms.G = function(s, a, p, burst, cost, par, mine)
    -- tat kept as (whole ms, remainder in 1/a ms); d = tat - now, in 1/a ms
    local tolerance = burst * p
    local d = 0
    if s and s[1] == 'G' and s[2] >= now then d = (s[2] - now) * a + s[3] end
    local nd = d + cost * p
    if nd <= tolerance then
      local reset = cdiv(nd, a)
      local q = idiv(nd, a)
      return 0, idiv(tolerance - nd, p), reset, put(s, mine, 'G', now + q, nd - q * a, par), max(reset, 1)
    end
    return -1 - cdiv(nd - tolerance, a), idiv(max(0, tolerance - d), p), cdiv(d, a)
  end

  algorithms.K = function(s, rate, burst, delay, cost, par, mine)
    -- idiv and cdiv written out: this is nginx's limit_req, the usual zone
    local burst_m, cost_m = burst * 1000, 1000 * cost
    local stored, last
    if s and s[1] == 'K' then stored, last = s[2], s[3] end
    local excess, ms, q, x
    if stored then
      ms = now - last
      if ms <= 0 then
        -- no time since the last charge (a batch's requests share its
        -- clock): nothing drained, the divisions below would give that
        ms, excess = 0, stored + cost_m
      else
        -- past a full drain the result is 0 however long it was:
        -- ms <= cdiv((stored + cost_m) * 1000, rate)
        excess = 0
        x = (stored + cost_m) * 1000
        q = (x + -x % rate) / rate
        if q * rate < x then q = q + 1 elseif (q - 1) * rate >= x then q = q - 1 end
        if ms <= q then
          -- idiv(rate * ms, 1000)
          x = rate * ms
          q = (x - x % 1000) / 1000
          if q * 1000 > x then q = q - 1 elseif (q + 1) * 1000 <= x then q = q + 1 end
          excess = stored - q + cost_m
          if excess < 0 then excess = 0 end
        end
      end
    else
      excess, stored, ms = cost_m - 1000, 0, 0
    end
    if excess > burst_m then
      local total = cdiv((stored + cost_m - burst_m) * 1000, rate)
      return -1 - max(total - ms, 1), 0, cdiv(stored * 1000, rate)
    end
    local wait = 0
    if delay >= 0 and excess > delay * 1000 then
      wait = idiv((excess - delay * 1000) * 1000, rate)
    end
    if not (last and now <= last) then last = now end
    -- reset = cdiv(excess * 1000, rate), left = idiv(burst_m - excess, 1000)
    x = excess * 1000
    local reset = (x + -x % rate) / rate
    if reset * rate < x then reset = reset + 1 elseif (reset - 1) * rate >= x then reset = reset - 1 end
    x = burst_m - excess
    local left = (x - x % 1000) / 1000
    if left * 1000 > x then left = left - 1 elseif (left + 1) * 1000 <= x then left = left + 1 end
    local new
    if mine and s and s[1] == 'K' then
      -- (put, written out: calling it costs a run of 17 requests 5%)
      s[2], s[3], s.p = excess, last, par
      new = s
    else
      new = { 'K', excess, last, p = par }
    end
    return wait, left, reset, new, (reset > 60000) and reset or 60000
  end

  -- Several requests may come in one call (a batch): they are decided one
  -- after the other, as separate calls would, but each key is read once and
  -- written once, with the TTL of its last charge.
  local TAGS = { 'F', 'S', 'L', 'B', 'G', 'K', 'Q' }
  local cached, ttls = {}, {}
  -- The state of key `name` for check k of spec p: read once per call,
  -- and rescaled when it was written under other numbers of the same
  -- algorithm (a reload).
  local function current(name, p, k)
    local st = cached[name]
    if st == nil then
      st = decode(redis.call('GET', name))
      cached[name] = st
    end
    local was, par = st and st.p, p.par[k]
    if was and was ~= par and st[1] == p.tag[k]
        and (was[1] ~= par[1] or was[2] ~= par[2] or was[3] ~= par[3]) then
      st = rescale[st[1]](st, was, par)
      st.p = par
      cached[name] = st
    end
    return st
  end

  -- Requests on one route share their spec: each distinct spec is parsed
  -- once (once per call as a script; kept across calls as a function, up
  -- to 1000 of them: a reload brings new ones).
  local parsed, nparsed = {}, 0
  local function parse(spec)
    -- a run's count ("*<n>"; n is at most a batch, 64): kept like a spec
    local run = match(spec, '^%*(%d+)$')
    if run then
      run = { run = tonumber(run) }
      parsed[spec] = run
      return run
    end
    -- Per check, its fields; par: its numbers as one table, shared by every
    -- state it writes (never changed in place). Per group (consecutive
    -- checks with the same group number and dry-run flag): its first and
    -- last check, whether it is a dry run, and whether it is one check.
    if nparsed == 1000 then parsed, nparsed, known = {}, 0, {} end
    local p = { n = 0, tag = {}, alg = {}, p1 = {}, p2 = {}, p3 = {}, par = {}, cost = {}, peek = {},
      groups = 0, first = {}, last = {}, dry = {}, alone = {} }
    local group, dry
    for a, b, c, d, e, f, g, h in string.gmatch(spec,
        '(%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%d+),(%d),(%d+),(%d)') do
      local n = p.n + 1
      p.n = n
      p.tag[n] = TAGS[tonumber(a)]
      p.alg[n], p.p1[n], p.p2[n], p.p3[n], p.cost[n] =
        algorithms[p.tag[n]], tonumber(b), tonumber(c), tonumber(d), tonumber(e)
      p.peek[n] = f == '1'
      -- (s: as a state writes them, the same digits)
      local digits = b .. ',' .. c .. ',' .. d
      p.par[n] = { p.p1[n], p.p2[n], p.p3[n], s = '|' .. digits }
      known[digits] = p.par[n]
      if g ~= group or h ~= dry then
        group, dry = g, h
        p.groups = p.groups + 1
        p.first[p.groups], p.dry[p.groups] = n, h == '1'
      end
      p.last[p.groups] = n
    end
    -- mine: an admitted state is final (see put)
    p.mine = {}
    for g = 1, p.groups do
      p.alone[g] = p.first[g] == p.last[g]
      for k = p.first[g], p.last[g] do p.mine[k] = p.alone[g] and not p.peek[k] end
    end
    parsed[spec], nparsed = p, nparsed + 1
    return p
  end
  -- A group's writes, kept until it is known to be admitted (reused from
  -- group to group: only the first nw entries count).
  local wname, wstate, wttl = {}, {}, {}
  -- The answer is packed up to 200 numbers to a struct.pack call (Redis
  -- hashes every string a script makes, byte by byte: an answer that fits
  -- one call is returned as it is, not joined). Formats are made once.
  local pack, unpack, rep = struct.pack, unpack, string.rep
  local CHUNK = 200
  local fmts = {}
  local function packed(out, first, last)
    local n = last - first + 1
    local fmt = fmts[n]
    if not fmt then
      fmt = '>' .. rep('i8', n)
      fmts[n] = fmt
    end
    return pack(fmt, unpack(out, first, last))
  end

  -- The answer's numbers, kept from call to call (a table that grows
  -- anew each call costs Redis more than the decisions); entries past a
  -- call's count are left from earlier calls and never read.
  local out = {}
  -- reps requests of spec p in a row, its keys from KEYS[key + 1], their
  -- numbers appended to the answer after its o-th: returns the new o.
  -- Each request's checks, group after group.
  local function several(p, KEYS, key, reps, o)
    local alg, p1, p2, p3, cost = p.alg, p.p1, p.p2, p.p3, p.cost
    local par, peek, first, last = p.par, p.peek, p.first, p.last
    local dry, groups, alone, mine = p.dry, p.groups, p.alone, p.mine
    for _ = 1, reps do
      o = o + 1
      local count_at = o
      local decided = 0
      for g = 1, groups do
        local ok, nw, one = true, 0, alone[g]
        for k = first[g], last[g] do
          local name = KEYS[key + k]
          local st = cached[name]
          if st == nil or (st and st.p ~= par[k]) then st = current(name, p, k) end
          local code, remaining, reset, new, ttl =
            alg[k](st, p1[k], p2[k], p3[k], cost[k], par[k], mine[k])
          out[o + 1], out[o + 2], out[o + 3] = code, remaining, reset
          o = o + 3
          if code < 0 then ok = false
          elseif not peek[k] then
            if one then
              -- a group of one check: admitted is committed
              cached[name], ttls[name] = new, ttl
            else
              nw = nw + 1
              wname[nw], wstate[nw], wttl[nw] = name, new, ttl
            end
          end
        end
        decided = last[g]
        if ok then
          for w = 1, nw do
            cached[wname[w]] = wstate[w]
            ttls[wname[w]] = wttl[w]
          end
        elseif not dry[g] then
          break
        end
      end
      out[count_at] = decided
    end
    return o
  end
  -- The same for a spec of one check (a zone, or one limit, alone: one
  -- group, always decided), its numbers read once. After the first request
  -- its state is one this check wrote or read as current: never rescaled
  -- again.
  local function single(p, name, reps, o)
    -- (alone in its group, it charges exactly when it is `mine`)
    local alg, x1, x2, x3, c, par, mine = p.alg[1], p.p1[1], p.p2[1], p.p3[1], p.cost[1], p.par[1], p.mine[1]
    current(name, p, 1)
    for _ = 1, reps do
      local code, remaining, reset, new, ttl = alg(cached[name], x1, x2, x3, c, par, mine)
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, code, remaining, reset
      o = o + 4
      if code >= 0 and mine then cached[name], ttls[name] = new, ttl end
    end
    return o
  end

  return function(KEYS, ARGV)
    -- "<now>:<version>": the caller chose its numbers under that version
    -- of the overrides (the last key holds Redis's); a call made under an
    -- older one is refused with the single number -1, decided by nothing.
    local clock, version = match(ARGV[1], '^(%d+):(%d+)$')
    if clock then
      if (redis.call('GET', KEYS[#KEYS]) or '0') ~= version then
        return struct.pack('>i8', -1)
      end
      now = tonumber(clock)
    else
      now = tonumber(ARGV[1])
    end
    -- A pinned clock (tests replaying traces) is not Redis's: a key must
    -- not expire on Redis's own clock while the trace's time still needs
    -- it, so pinned runs keep keys an hour (a key kept past its TTL
    -- decides exactly like a new one).
    min_ttl = 3600000
    if now == 0 then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
      min_ttl = 1
    end
    cached, ttls = {}, {}
    local o = 1 -- numbers in the answer so far
    out[1] = now
    local key = 0 -- KEYS used so far
    local r, nargs = 2, #ARGV
    while r <= nargs do
      -- "*<n>": the next request comes n times in a row, its keys once
      local p = parsed[ARGV[r]] or parse(ARGV[r])
      local reps = p.run
      if reps then
        r = r + 1
        p = parsed[ARGV[r]] or parse(ARGV[r])
      else
        reps = 1
      end
      if p.n == 1 then
        o = single(p, KEYS[key + 1], reps, o)
      else
        o = several(p, KEYS, key, reps, o)
      end
      key = key + p.n
      r = r + 1
    end
    for name, ttl in pairs(ttls) do
      redis.call('SET', name, encode(cached[name]), 'PX', max(min_ttl, ttl))
    end
    if o <= CHUNK then return packed(out, 1, o) end
    local pieces = {}
    for first = 1, o, CHUNK do
      pieces[#pieces + 1] = packed(out, first, min(first + CHUNK - 1, o))
    end
    return table.concat(pieces)
  end
end
