-- Prelude of insert.lua and insert_runs.lua (orchestrator/anchors/redis_index.py joins it in front
-- of each): KEYS[1] is the batch's meta hash, ARGV[2] the epoch the caller expects ('' = any),
-- ARGV[3] the epoch to set on a new batch. Defines `epoch`; a lost batch state is an EPOCH error.
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if ARGV[2] ~= '' and epoch ~= ARGV[2] then
  return redis.error_reply('EPOCH batch state lost: expected epoch ' .. ARGV[2] .. ', found ' .. tostring(epoch))
end
if not epoch then
  epoch = ARGV[3]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
