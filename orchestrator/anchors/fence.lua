-- Fence prelude of insert.lua and insert_runs.lua (orchestrator/anchors/redis_index.py joins it in
-- front of each, after the layout prelude): KEY.meta is the batch's meta hash, ARGV[2] the fence token the caller expects ('' = any),
-- ARGV[3] the fence token to set on a new batch. Defines `fence`; a lost batch state is a FENCE error.
-- The token is stored in the meta hash's field FENCE_FIELD ('epoch', its name before the rename, kept so that
-- batches written by earlier versions stay readable).
local fence = redis.call('HGET', KEY.meta, FENCE_FIELD)
if ARGV[2] ~= '' and fence ~= ARGV[2] then
  return redis.error_reply('FENCE batch state lost: expected fence token ' .. ARGV[2] .. ', found ' .. tostring(fence))
end
if not fence then
  fence = ARGV[3]
  redis.call('HSET', KEY.meta, FENCE_FIELD, fence)
end
