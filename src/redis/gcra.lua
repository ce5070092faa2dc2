-- GCRA for backpressure's RedisBucket; see src/redis/script.rs for the
-- arithmetic and the reply shapes. One key, a hash {t = tat, p = penalty}.
--
-- ARGV: op, period_us, burst, now_us ('' = use TIME), then op arguments:
--   take     n, max_wait_us, extra, give_back  -> {granted, wait_us, before, after}
--   cancel   before, after                     -> {1 | 0}
--   penalize retry_us, give_back               -> {1}
--   give     give_back                         -> {1}
--   available                                  -> {cells}
local key = KEYS[1]
local op = ARGV[1]
local period = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local expire = true
if now == nil then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  -- An explicit clock is not Redis's: an expiry in Redis's time would
  -- drop state the explicit clock still needs.
  expire = false
end
local tolerance = period * burst

-- Integers below 2^53 are exact in Lua numbers; '%.0f' writes them
-- without the 14-digit rounding of tostring.
local function save(t, p)
  redis.call('HSET', key, 't', string.format('%.0f', t), 'p', string.format('%.0f', p))
  if expire then
    -- Gone once full again (a key at or before `now` is a full bucket).
    redis.call('PEXPIRE', key, math.max(1, math.ceil((t - now) / 1000)))
  else
    redis.call('PERSIST', key)
  end
end

-- What this script writes: integers in [0, now + 2^52] (a tat is at most
-- now + max_wait + tolerance, a penalty now + retry + tolerance, each term
-- capped at 2^51). Anything else was written by someone else: 1e300 would
-- reply a wait that does not fit an integer (read as 0, a retry-now spin),
-- 'abc' or -1 would read as a full bucket; inf and nan parse too.
local function valid(v)
  return v ~= nil and v == v and v >= 0 and v <= now + 2^52 and v == math.floor(v)
end

local tat, pen, corrupt = 0, 0, false
local state = redis.pcall('HMGET', key, 't', 'p')
if state.err then
  -- Not a hash (WRONGTYPE).
  corrupt = true
else
  -- A missing field (false) is a fresh key: full, no penalty.
  if state[1] then
    local t = tonumber(state[1])
    if valid(t) then tat = t else corrupt = true end
  end
  if state[2] then
    local p = tonumber(state[2])
    if valid(p) then pen = p else corrupt = true end
  end
end
if corrupt then
  -- Repair on the safe side: an empty bucket refilling from now (as if a
  -- whole burst had just been taken), keeping whatever was still valid.
  redis.log(redis.LOG_WARNING, 'backpressure gcra: key ' .. key ..
    ' held values this script did not write; reset to an empty bucket')
  tat = math.max(tat, pen, now + tolerance)
  redis.call('DEL', key)
  save(tat, pen)
end

-- Unused leased cells back: never below now (the bucket is full there)
-- nor below a penalty.
local function give(m)
  if m > 0 then
    return math.max(tat - m * period, now, pen)
  end
  return tat
end

if op == 'take' then
  local n = tonumber(ARGV[5])
  local max_wait = tonumber(ARGV[6])
  local extra = tonumber(ARGV[7])
  local given = give(tonumber(ARGV[8]))
  local changed = given ~= tat
  tat = given
  local ready = math.max(tat - (tolerance - n * period), now)
  local wait = ready - now
  if wait > max_wait then
    if changed then
      save(tat, pen)
    end
    return {0, wait, 0, 0}
  end
  local granted = n
  local base = math.max(tat, now)
  if wait == 0 and extra > 0 then
    local fit = math.floor((tolerance - (base - now)) / period)
    granted = n + math.max(0, math.min(extra, fit - n))
  end
  local after = base + granted * period
  save(after, pen)
  return {granted, wait, tat, after}
elseif op == 'cancel' then
  local before = tonumber(ARGV[5])
  local after = tonumber(ARGV[6])
  if tat == after then
    save(math.max(before, pen), pen)
    return {1}
  end
  return {0}
elseif op == 'penalize' then
  tat = give(tonumber(ARGV[6]))
  local target = now + tonumber(ARGV[5]) + tolerance - period
  save(math.max(tat, target), math.max(pen, target))
  return {1}
elseif op == 'give' then
  local given = give(tonumber(ARGV[5]))
  if given ~= tat then
    save(given, pen)
  end
  return {1}
elseif op == 'available' then
  local debt = math.max(tat, now) - now
  return {math.floor(math.max(tolerance - debt, 0) / period)}
end
return redis.error_reply('backpressure gcra: unknown op ' .. tostring(op))
