-- GCRA for backpressure's RedisBucket; see src/redis/script.rs for the
-- arithmetic, the bounds and the reply shapes. One key, a hash {t = tat,
-- p = penalty} plus, once a quota was set at run time, {qt = period_us,
-- qb = burst}.
--
-- ARGV: op, period_us, burst (the caller's own quota), min_period_us,
-- max_period_us, max_burst, window_us (the bounds a stored quota is
-- taken within), now_us ('' = use TIME), nref, then nref refund triples
-- (before, after, n; highest `after` first), writer, nset, then nset
-- settle pairs (seq, cells: + debt, - given back), then the op arguments:
--   take      n, max_wait_us, extra, give_back, not_before_us
--                                              -> {granted, wait_us, before, after}
--   cancel    before, after                    -> {1 | 0}
--   penalize  retry_us, give_back              -> {1}
--   give      give_back                        -> {1}
--   available                                  -> {cells}
--   set_quota period_us, burst                 -> {1}
--   reset                                      -> {1}
-- Every reply is prefixed with {refunded cells, period_us, burst in force,
-- stored period_us, stored burst} (0, 0 when the key states no quota).
local key = KEYS[1]
local op = ARGV[1]
local period = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local min_period = tonumber(ARGV[4])
local max_period = tonumber(ARGV[5])
local max_burst = tonumber(ARGV[6])
local window = tonumber(ARGV[7])
local now = tonumber(ARGV[8])
local nref = tonumber(ARGV[9])
local settle_arg = 10 + 3 * nref
local nset = tonumber(ARGV[settle_arg + 1])
local base_arg = settle_arg + 1 + 2 * nset
local function arg(i)
  return tonumber(ARGV[base_arg + i])
end
local expire = true
if now == nil then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  -- An explicit clock is not Redis's: an expiry in Redis's time gets a
  -- margin (`expire_from`), so as not to drop state that clock still
  -- needs.
  expire = false
end

-- Integers below 2^53 are exact in Lua numbers; '%.0f' writes them
-- without the 14-digit rounding of tostring.
local function int(v)
  return string.format('%.0f', v)
end

-- What this script writes: integers in [0, now + 2^52] (a tat is at most
-- now + max_wait + tolerance, a penalty now + retry + tolerance, each term
-- capped at 2^51). Anything else was written by someone else: 1e300 would
-- reply a wait that does not fit an integer (read as 0, a retry-now spin),
-- 'abc' or -1 would read as a full bucket; inf and nan parse too.
local function valid(v)
  return v ~= nil and v == v and v >= 0 and v <= now + 2^52 and v == math.floor(v)
end

-- A stored quota as this caller takes it: advice within the bounds it
-- sent, never an order (see "Bounds" in script.rs). The period within
-- [min_period, max_period] (never faster than the caller's ceiling,
-- never slower than its floor); the burst at most max_burst and at most
-- what that period gives in the window (at least one cell). Integers
-- below 2^53 divide exactly enough for `floor`.
local function bounded(qt, qb)
  local p = math.min(math.max(qt, min_period), max_period)
  local b = math.min(qb, max_burst, math.max(1, math.floor(window / p)))
  return p, b
end

local tat, pen, corrupt = 0, 0, false
local stored, found = false, false
-- The stored quota as written (0, 0 for none): replied, and compared by
-- `set_quota`, which stores only a change.
local stored_period, stored_burst = 0, 0
local state = redis.pcall('HMGET', key, 't', 'p', 'qt', 'qb')
if state.err then
  -- Not a hash (WRONGTYPE).
  corrupt = true
else
  -- A missing field (false) is a fresh key: full, no penalty.
  if state[1] then
    found = true
    local t = tonumber(state[1])
    if valid(t) then tat = t else corrupt = true end
  end
  if state[2] then
    found = true
    local p = tonumber(state[2])
    if valid(p) then pen = p else corrupt = true end
  end
  if state[3] or state[4] then
    found = true
    local qt, qb = tonumber(state[3]), tonumber(state[4])
    -- Any positive integer is a quota (bounded below); anything else was
    -- not written by this script.
    if qt and qb and qt >= 1 and qb >= 1 and qt <= 2^53 and qb <= 2^53
        and qt == math.floor(qt) and qb == math.floor(qb) then
      stored_period, stored_burst, stored = qt, qb, true
      period, burst = bounded(qt, qb)
    else
      corrupt = true
    end
  end
end
local tolerance = period * burst

-- Every write leaves the key an expiry, in milliseconds from now: until
-- the bucket is full again (a key at or before `now` is a full bucket),
-- plus, when it states a quota, that quota's window (its tolerance in
-- force) and a minute, so that a process starting meanwhile still
-- learns it; plus an hour on an explicit clock, whose time is not
-- Redis's (the state it still needs must outlast any real pause).
local KEEP_MS = 60000
local EXPLICIT_MS = 3600000
local function expire_from(t)
  local ms = math.ceil(math.max(t - now, 0) / 1000)
  if stored then
    ms = ms + math.ceil(tolerance / 1000) + KEEP_MS
  end
  if not expire then
    ms = ms + EXPLICIT_MS
  end
  redis.call('PEXPIRE', key, int(math.max(1, ms)))
end

local function save(t, p)
  redis.call('HSET', key, 't', int(t), 'p', int(p))
  expire_from(t)
end

local function store_quota(new_period, new_burst)
  redis.call('HSET', key, 'qt', int(new_period), 'qb', int(new_burst))
  stored_period, stored_burst = new_period, new_burst
end

if corrupt then
  -- Repair on the safe side: an empty bucket refilling from now (as if a
  -- whole burst had just been taken), keeping whatever was still valid.
  redis.log(redis.LOG_WARNING, 'backpressure gcra: key ' .. key ..
    ' held values this script did not write; reset to an empty bucket')
  tat = math.max(tat, pen, now + tolerance)
  redis.call('DEL', key)
  if stored then store_quota(stored_period, stored_burst) end
  save(tat, pen)
elseif found and redis.call('PTTL', key) == -1 then
  -- A key without an expiry: written by hand, or by a version that
  -- persisted keys with a quota. It gets one now, read or written.
  expire_from(math.max(tat, pen))
end

-- Refunds of reservations dropped unused: each one still on top goes.
local refunded = 0
if nref > 0 then
  local before_refunds = tat
  for i = 0, nref - 1 do
    local before = tonumber(ARGV[10 + 3 * i])
    local after = tonumber(ARGV[11 + 3 * i])
    if tat == after and tat > now then
      tat = math.max(before, pen)
      refunded = refunded + tonumber(ARGV[12 + 3 * i])
    end
  end
  if tat ~= before_refunds then
    save(tat, pen)
  end
end

local function reply(r)
  local out = {refunded, period, burst, stored_period, stored_burst}
  for _, v in ipairs(r) do out[#out + 1] = v end
  return out
end

-- Unused leased cells back: never below now (the bucket is full there)
-- nor below a penalty.
local function give(m)
  if m > 0 then
    return math.max(tat - m * period, now, pen)
  end
  return tat
end

-- Settles, each sequence number of a writer applied once (a resend after
-- a lost reply is skipped); the highest applied is kept at least a minute.
if nset > 0 then
  local field = 'w' .. ARGV[settle_arg]
  local last = tonumber(redis.call('HGET', key, field)) or 0
  -- This script never stored more than the newest sequence a call carries
  -- (a writer's queue is sent whole, newest last): a higher one was
  -- written by someone else, and would make every settle skipped.
  if last > tonumber(ARGV[settle_arg + 2 * nset]) then
    last = 0
  end
  local before_settles = tat
  for i = 0, nset - 1 do
    local seq = tonumber(ARGV[settle_arg + 2 + 2 * i])
    local d = tonumber(ARGV[settle_arg + 3 + 2 * i])
    if seq > last then
      if d > 0 then
        tat = math.min(math.max(tat, now) + d * period, now + 2^51)
      else
        tat = give(-d)
      end
      last = seq
    end
  end
  redis.call('HSET', key, field, int(last))
  if tat ~= before_settles then save(tat, pen) end
  if redis.call('PTTL', key) < KEEP_MS then
    redis.call('PEXPIRE', key, KEEP_MS)
  end
end

-- `d` of debt under the quota in force as cells, in time at new_period:
-- ceil(d * new_period / period), exact while below 2^53 (one more
-- microsecond when `r * new_period` is not: more debt is the safe side).
local function cells(d, new_period)
  local q = math.floor(d / period)
  local r = d - q * period
  local part = r * new_period
  local frac = math.ceil(part / period)
  if part > 2^53 then
    frac = frac + 1
  end
  return q * new_period + frac
end

-- A tat under the quota in force, converted to (new_period, new_burst)
-- (bucket/gcra.rs convert): the wait a running penalty explains (up to
-- its end, `pen - (tolerance - period)`) kept as time, with the bucket
-- drained behind it; every other debt (cells taken or reserved) kept in
-- cells, none forgiven. Capped at 2^51 us ahead, inside what `valid`
-- accepts.
local function convert(t, new_period, new_burst)
  local debt = t - now
  if debt <= 0 then
    return t
  end
  local next_old = tolerance - period
  local next_new = new_period * new_burst - new_period
  local hold = math.max(pen - next_old - now, 0)
  local kept
  if hold > 0 and debt > next_old then
    local wait = debt - next_old
    local held = math.min(wait, hold)
    kept = next_new + held + cells(wait - held, new_period)
  else
    kept = cells(debt, new_period)
  end
  return now + math.min(kept, 2^51)
end

if op == 'take' then
  local n = arg(1)
  local max_wait = arg(2)
  local extra = arg(3)
  local given = give(arg(4))
  -- The cells are taken as of `at`: the call goes no earlier (another
  -- quota holds it until then), so the refill before `at` that a full
  -- bucket would lose is not counted.
  local at = now + (arg(5) or 0)
  local changed = given ~= tat
  tat = given
  if n > burst then
    -- More than the burst in force: never fits. {0, 0} says so.
    if changed then save(tat, pen) end
    return reply({0, 0, 0, 0})
  end
  local ready = math.max(tat - (tolerance - n * period), at)
  local wait = ready - now
  if wait > max_wait then
    if changed then
      save(tat, pen)
    end
    return reply({0, wait, 0, 0})
  end
  local granted = n
  local base = math.max(tat, at)
  if wait == 0 and extra > 0 then
    local fit = math.floor((tolerance - (base - now)) / period)
    granted = n + math.max(0, math.min(extra, fit - n))
  end
  local after = base + granted * period
  save(after, pen)
  return reply({granted, wait, tat, after})
elseif op == 'cancel' then
  local before = arg(1)
  local after = arg(2)
  if tat == after then
    save(math.max(before, pen), pen)
    return reply({1})
  end
  return reply({0})
elseif op == 'penalize' then
  tat = give(arg(2))
  local target = now + arg(1) + tolerance - period
  save(math.max(tat, target), math.max(pen, target))
  return reply({1})
elseif op == 'give' then
  local given = give(arg(1))
  if given ~= tat then
    save(given, pen)
  end
  return reply({1})
elseif op == 'available' then
  local debt = math.max(tat, now) - now
  return reply({math.floor(math.max(tolerance - debt, 0) / period)})
elseif op == 'set_quota' then
  -- The caller's new own quota: stored as given, and in force for the
  -- caller as it is (the bounds sent are those it had: the state converts
  -- from the quota in force under them); each other process takes it
  -- within its own bounds.
  local new_period, new_burst = arg(1), arg(2)
  if not stored or new_period ~= stored_period or new_burst ~= stored_burst then
    store_quota(new_period, new_burst)
    local t = convert(tat, new_period, new_burst)
    -- A penalty keeps its wait (its first cell at the same instant), but
    -- never floors refunds above the converted tat: convert is not
    -- monotonic across the burst (a hold past it keeps its wait in time,
    -- a debt within it in cells), and the floor must not hold back more
    -- than the bucket itself.
    local p = 0
    if pen > now then
      p = math.min(pen - (tolerance - period) + (new_period * new_burst - new_period), t)
    end
    period, burst, tolerance = new_period, new_burst, new_period * new_burst
    stored = true
    save(t, p)
  end
  return reply({1})
elseif op == 'reset' then
  redis.call('HDEL', key, 't', 'p')
  if stored then
    -- The quota stays, for its window and the margin.
    expire_from(now)
  end
  return reply({1})
end
return redis.error_reply('backpressure gcra: unknown op ' .. tostring(op))
