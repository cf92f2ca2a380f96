-- Anchor index insert (orchestrator/anchors/redis_index.py, RedisAnchorIndex.insert).
-- KEY.* and the field names come from the layout prelude (orchestrator/anchors/redis_layout.py);
-- this script touches KEY.meta, steps, groups, runs and done.  ARGV: ttl_ms, expected_fence ('' = any),
-- new_fence, records: one string, records separated by \x1e, fields by \x1f: task, run,
-- step, state, return (repr, exact), last ('1'/'0'). Hash fields are built here
-- (task_field of the prelude). Reads and writes are batched per call (one HMGET /
-- HSET per hash); group moments are updated in arrival order with the same operations as
-- MemoryAnchorIndex (_add_moment).
-- (fence.lua runs first: `fence` is the batch's fence token, checked against ARGV[2] or set to ARGV[3])
local T, RUN, STEP, H, V, LAST, SF, GF, RF = {}, {}, {}, {}, {}, {}, {}, {}, {}
local count = 0
local REC = record_pattern(6)
for rec in string.gmatch(ARGV[4], RECORDS) do
  local task, run, step, state, ret, last = string.match(rec, REC)
  if not task then return redis.error_reply('BADRECORD ' .. rec) end
  count = count + 1
  local tp = task_field(task)
  T[count], RUN[count], STEP[count], H[count], V[count], LAST[count] = task, run, step, state, ret, last
  SF[count] = tp .. run .. '|' .. step
  GF[count] = tp .. state
  RF[count] = tp .. run
end
if count == 0 then return {0, fence} end
-- a run stored whole by insert_runs.lua cannot take steps one by one (it would count them twice)
local whole, wseen = {}, {}
for i = 1, count do
  if not wseen[RF[i]] then wseen[RF[i]] = true; whole[#whole + 1] = RF[i] .. RUN_SUFFIX.digest end
end
local wd = redis.call('HMGET', KEY.runs, unpack(whole))
for k = 1, #whole do
  if wd[k] then
    return redis.error_reply('CONFLICT run ' .. string.sub(whole[k], 1, -(#RUN_SUFFIX.digest + 1)) .. ' was stored whole; its steps cannot be added one by one')
  end
end
local olds = redis.call('HMGET', KEY.steps, unpack(SF))
-- validation: refuse the whole call on a conflicting duplicate, before any write
local pending, new_rows, is_new = {}, {}, {}
for i = 1, count do
  local payload = H[i] .. FS .. V[i]
  local old = olds[i]
  if not old then old = pending[SF[i]] end
  if old then
    if old ~= payload then
      return redis.error_reply('CONFLICT step ' .. SF[i] .. ' already stored as ' .. old .. ', got ' .. payload)
    end
  else
    pending[SF[i]] = payload
    new_rows[#new_rows + 1] = i
    is_new[i] = true
  end
end
if #new_rows > 0 then
  local kv = {}
  for _, i in ipairs(new_rows) do
    kv[#kv + 1] = SF[i]
    kv[#kv + 1] = H[i] .. FS .. V[i]
  end
  redis.call('HSET', KEY.steps, unpack(kv))
  -- anchor-group moments [n, c, S1, S2], c = group minimum
  local gfields, gseen, gstate = {}, {}, {}
  for _, i in ipairs(new_rows) do
    if not gseen[GF[i]] then gseen[GF[i]] = true; gfields[#gfields + 1] = GF[i] end
  end
  local cur = redis.call('HMGET', KEY.groups, unpack(gfields))
  for k, gf in ipairs(gfields) do
    if cur[k] then
      local sn, sc, ss1, ss2 = string.match(cur[k], '^(%S+) (%S+) (%S+) (%S+)$')
      gstate[gf] = {tonumber(sn), tonumber(sc), tonumber(ss1), tonumber(ss2)}
    end
  end
  for _, i in ipairs(new_rows) do
    local r = tonumber(V[i])
    local g = gstate[GF[i]]
    if not g then
      gstate[GF[i]] = {1, r, 0, 0}
    else
      local n, c, s1, s2 = g[1], g[2], g[3], g[4]
      if r < c then
        local delta = c - r
        s2 = s2 + 2 * delta * s1 + n * delta * delta
        s1 = s1 + n * delta
        c = r
      end
      local d = r - c
      g[1], g[2], g[3], g[4] = n + 1, c, s1 + d, s2 + d * d
    end
  end
  local gkv = {}
  for _, gf in ipairs(gfields) do
    local g = gstate[gf]
    gkv[#gkv + 1] = gf
    gkv[#gkv + 1] = string.format('%d %.17g %.17g %.17g', g[1], g[2], g[3], g[4])
  end
  redis.call('HSET', KEY.groups, unpack(gkv))
end
-- run completion: #n stored steps, #len from the last step, #done once complete
local rfields, rstate = {}, {}
for i = 1, count do
  if not rstate[RF[i]] then rfields[#rfields + 1] = RF[i]; rstate[RF[i]] = {task = T[i]} end
end
local q = {}
for _, rf in ipairs(rfields) do
  q[#q + 1] = rf .. RUN_SUFFIX.n; q[#q + 1] = rf .. RUN_SUFFIX.len; q[#q + 1] = rf .. RUN_SUFFIX.done
end
local rc = redis.call('HMGET', KEY.runs, unpack(q))
for k, rf in ipairs(rfields) do
  local st = rstate[rf]
  st.n = tonumber(rc[3 * k - 2] or '0')
  st.len = rc[3 * k - 1] and tonumber(rc[3 * k - 1]) or false
  st.done = rc[3 * k] and true or false
end
for i = 1, count do
  local st = rstate[RF[i]]
  if is_new[i] then st.n = st.n + 1 end
  if LAST[i] == '1' then st.len = tonumber(STEP[i]) + 1 end
end
local rkv, done_inc = {}, {}
for _, rf in ipairs(rfields) do
  local st = rstate[rf]
  rkv[#rkv + 1] = rf .. RUN_SUFFIX.n; rkv[#rkv + 1] = st.n
  if st.len then
    rkv[#rkv + 1] = rf .. RUN_SUFFIX.len; rkv[#rkv + 1] = st.len
    if not st.done and st.n == st.len then
      rkv[#rkv + 1] = rf .. RUN_SUFFIX.done; rkv[#rkv + 1] = '1'
      done_inc[st.task] = (done_inc[st.task] or 0) + 1
    end
  end
end
redis.call('HSET', KEY.runs, unpack(rkv))
for task, k in pairs(done_inc) do redis.call('HINCRBY', KEY.done, task, k) end
for _, key in ipairs({KEY.meta, KEY.steps, KEY.groups, KEY.runs, KEY.done}) do redis.call('PEXPIRE', key, tonumber(ARGV[1])) end
return {#new_rows, fence}
