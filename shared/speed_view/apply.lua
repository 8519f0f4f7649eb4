-- The fenced apply of one partition's batch (rule 3): compare-and-set on the fence (KEYS[1]:
-- offset ARGV[1] -> ARGV[2], stream time ARGV[3], definitions digest ARGV[7]); then every cell
-- hash (HSET) and de-dup set (SADD) of the batch, then the hash fields it removes (HDEL; ARGV[8]
-- hashes), each preceded by its argument count; then strings written whole (SET; ARGV[9]) and
-- appended to (APPEND; ARGV[10]), one value each, and keys removed (DEL; ARGV[11]); every key
-- written with TTL ARGV[4]. Every key carries the partition's hash tag, so the call stays in one Redis
-- Cluster slot. Returns 1 applied, 0 fence moved (another worker wrote since), -1 the fence
-- vanished under the worker that had written or read it: the partition's data was lost (rule
-- 9). Called by `writer.SpeedViewWriter.apply`.
local current = redis.call('HGET', KEYS[1], 'offset') or ''
if current ~= ARGV[1] then
  if current == '' then return -1 end
  return 0
end
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'offset', ARGV[2], 'defs', ARGV[7])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'stream_time')
else
  redis.call('HSET', KEYS[1], 'stream_time', ARGV[3])
end
redis.call('EXPIRE', KEYS[1], ttl)
local n_hashes, n_sets, n_deletes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
local n_strings, n_appends, n_dropped = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local arg = 12
local function write(command, key, first, last)
  local chunk = 2000
  for i = first, last, chunk do
    redis.call(command, key, unpack(ARGV, i, math.min(i + chunk - 1, last)))
  end
  redis.call('EXPIRE', key, ttl)
end
for k = 2, 1 + n_hashes do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('HSET', KEYS[k], arg + 1, arg + 2 * n) end
  arg = arg + 1 + 2 * n
end
for k = 2 + n_hashes, 1 + n_hashes + n_sets do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('SADD', KEYS[k], arg + 1, arg + n) end
  arg = arg + 1 + n
end
local first_delete = 2 + n_hashes + n_sets
for k = first_delete, first_delete + n_deletes - 1 do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('HDEL', KEYS[k], arg + 1, arg + n) end
  arg = arg + 1 + n
end
local k = first_delete + n_deletes
for _, command in ipairs({{'SET', n_strings}, {'APPEND', n_appends}}) do
  for _ = 1, command[2] do
    redis.call(command[1], KEYS[k], ARGV[arg])
    redis.call('EXPIRE', KEYS[k], ttl)
    k, arg = k + 1, arg + 1
  end
end
for _ = 1, n_dropped do
  redis.call('DEL', KEYS[k])
  k = k + 1
end
return 1
