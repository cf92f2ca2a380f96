-- Anchor index insert of whole trajectories (orchestrator/anchors/redis_index.py,
-- RedisAnchorIndex.insert_trajectories): one record per trajectory and one per anchor group,
-- instead of one per step (insert.lua).
-- KEY.* and the field names come from the layout prelude (orchestrator/anchors/redis_layout.py).
-- ARGV: ttl_ms, expected_fence ('' = any),
-- new_fence, runs, groups, tasks. Records are separated by \x1e, fields by \x1f:
--   runs:   task, run, length, digest (16 hex digits)
--   groups: task, state, n, c, S1, S2 (the call's moments of the group, c its minimum; repr floats)
--   tasks:  the distinct tasks of the call, whose complete-run counts are returned.
-- A trajectory is stored as '<len>:<digest>' under task_field(task) .. run .. RUN_SUFFIX.digest next to the
-- RUN_SUFFIX.n, RUN_SUFFIX.len and RUN_SUFFIX.done fields insert.lua keeps, so both scripts see the same runs.
-- Moments are merged into the stored ones by re-basing both to the smaller minimum (the same
-- re-basing as insert.lua's, S2 += 2*delta*S1 + n*delta^2, S1 += n*delta), then adding.
-- Each task whose complete-run count grows gets one event (EVENT_TASK task, EVENT_DONE count) on the events
-- stream, which RedisAnchorIndex.wait_complete blocks on (XREAD BLOCK).
-- Returns {new trajectories, fence token, stream id after this call, {count of each task in ARGV[6]},
-- the stored moments of each group of ARGV[5] after the call: one string 'n c S1 S2 n c S1 S2 ...'};
-- errors: FENCE, BADRECORD, CONFLICT, and PARTIAL <0-based indices of the new trajectories>
-- when the call mixes stored and new trajectories (nothing written; the caller resends the new ones).
-- (fence.lua runs first: `fence` is the batch's fence token, checked against ARGV[2] or set to ARGV[3])
local function hset_chunked(key, kv)
  for lo = 1, #kv, 4000 do
    redis.call('HSET', key, unpack(kv, lo, math.min(lo + 3999, #kv)))
  end
end
local function hmget_chunked(key, fields)
  local out = {}
  for lo = 1, #fields, 4000 do
    local part = redis.call('HMGET', key, unpack(fields, lo, math.min(lo + 3999, #fields)))
    for k = 1, #part do out[lo + k - 1] = part[k] end
  end
  return out
end
local RT, RF, RV, RL = {}, {}, {}, {}
local nr = 0
local REC4 = record_pattern(4)
for rec in string.gmatch(ARGV[4], RECORDS) do
  local task, run, len, dig = string.match(rec, REC4)
  if not task then return redis.error_reply('BADRECORD ' .. rec) end
  nr = nr + 1
  RT[nr], RF[nr], RV[nr], RL[nr] = task, task_field(task) .. run, len .. ':' .. dig, tonumber(len)
end
local q = {}
for i = 1, nr do q[2 * i - 1] = RF[i] .. RUN_SUFFIX.digest; q[2 * i] = RF[i] .. RUN_SUFFIX.n end
local old = {}
if nr > 0 then old = hmget_chunked(KEY.runs, q) end
local new_idx = {}
for i = 1, nr do
  local d, n = old[2 * i - 1], old[2 * i]
  if d then
    if d ~= RV[i] then
      return redis.error_reply('CONFLICT trajectory ' .. RF[i] .. ' already stored as ' .. d .. ' (length:digest), got ' .. RV[i])
    end
  elseif n then
    return redis.error_reply('CONFLICT trajectory ' .. RF[i] .. ' already has ' .. n .. ' steps written one by one')
  else
    new_idx[#new_idx + 1] = i
  end
end
if #new_idx > 0 and #new_idx < nr then
  local idx = {}
  for k, i in ipairs(new_idx) do idx[k] = tostring(i - 1) end
  return redis.error_reply('PARTIAL ' .. table.concat(idx, ','))
end
local GF, GV = {}, {}
local ng = 0
local REC6 = record_pattern(6)
for rec in string.gmatch(ARGV[5], RECORDS) do
  local task, state, n, c, s1, s2 = string.match(rec, REC6)
  if not task then return redis.error_reply('BADRECORD ' .. rec) end
  ng = ng + 1
  GF[ng] = task_field(task) .. state
  GV[ng] = {tonumber(n), tonumber(c), tonumber(s1), tonumber(s2)}
end
local stored = {}  -- the groups' moments after this call, in ARGV[5] order
if #new_idx > 0 then
  if ng > 0 then
    local cur = hmget_chunked(KEY.groups, GF)
    local gkv = {}
    for k = 1, ng do
      local n, c, s1, s2 = GV[k][1], GV[k][2], GV[k][3], GV[k][4]
      if cur[k] then
        local sn, sc, ss1, ss2 = string.match(cur[k], '^(%S+) (%S+) (%S+) (%S+)$')
        local an, ac, as1, as2 = tonumber(sn), tonumber(sc), tonumber(ss1), tonumber(ss2)
        local m = ac
        if c < m then m = c end
        local da, db = ac - m, c - m
        as2 = as2 + 2 * da * as1 + an * da * da
        as1 = as1 + an * da
        s2 = s2 + 2 * db * s1 + n * db * db
        s1 = s1 + n * db
        n, c, s1, s2 = an + n, m, as1 + s1, as2 + s2
      end
      gkv[2 * k - 1] = GF[k]
      gkv[2 * k] = string.format('%d %.17g %.17g %.17g', n, c, s1, s2)
      stored[k] = gkv[2 * k]
    end
    hset_chunked(KEY.groups, gkv)
  end
  local rkv, inc, order, total = {}, {}, {}, 0
  for _, i in ipairs(new_idx) do
    rkv[#rkv + 1] = RF[i] .. RUN_SUFFIX.digest; rkv[#rkv + 1] = RV[i]
    rkv[#rkv + 1] = RF[i] .. RUN_SUFFIX.n; rkv[#rkv + 1] = RL[i]
    rkv[#rkv + 1] = RF[i] .. RUN_SUFFIX.len; rkv[#rkv + 1] = RL[i]
    rkv[#rkv + 1] = RF[i] .. RUN_SUFFIX.done; rkv[#rkv + 1] = '1'
    if not inc[RT[i]] then inc[RT[i]] = 0; order[#order + 1] = RT[i] end
    inc[RT[i]] = inc[RT[i]] + 1
    total = total + RL[i]
  end
  hset_chunked(KEY.runs, rkv)
  redis.call('HINCRBY', KEY.meta, RUN_STEPS_FIELD, total)
  for _, task in ipairs(order) do
    local d = redis.call('HINCRBY', KEY.done, task, inc[task])
    redis.call('XADD', KEY.events, 'MAXLEN', '~', '100000', '*', EVENT_TASK, task, EVENT_DONE, d)
  end
end
if #new_idx == 0 and ng > 0 then  -- nothing written: the stored moments as they are
  local cur = hmget_chunked(KEY.groups, GF)
  for k = 1, ng do stored[k] = cur[k] or 'nan nan nan nan' end
end
local tasks = {}
for t in string.gmatch(ARGV[6], RECORDS) do tasks[#tasks + 1] = t end
local done = {}
if #tasks > 0 then done = hmget_chunked(KEY.done, tasks) end
for k = 1, #tasks do done[k] = done[k] or '0' end
local last = redis.call('XREVRANGE', KEY.events, '+', '-', 'COUNT', 1)
local cursor = '0-0'
if last[1] then cursor = last[1][1] end
for _, key in pairs(KEY) do redis.call('PEXPIRE', key, tonumber(ARGV[1])) end
return {#new_idx, fence, cursor, done, table.concat(stored, ' ')}
