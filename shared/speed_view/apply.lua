-- The fenced apply of one partition's batch (rule 3): compare-and-set on the epoch marker
-- (KEYS[1], ARGV[1]) and the fence (KEYS[2]: offset ARGV[2] -> ARGV[3], stream time ARGV[4],
-- definitions digest ARGV[8]); then every cell hash (HSET) and de-dup set (SADD) of the batch,
-- each preceded by its argument count, with TTL ARGV[5]. Returns 1 applied, 0 fence moved,
-- -1 epoch lost. Called by `writer.SpeedViewWriter.apply`.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local current = redis.call('HGET', KEYS[2], 'offset')
if (current or '') ~= ARGV[2] then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'defs', ARGV[8])
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[2], 'stream_time')
else
  redis.call('HSET', KEYS[2], 'stream_time', ARGV[4])
end
redis.call('EXPIRE', KEYS[2], ttl)
local n_hashes, n_sets = tonumber(ARGV[6]), tonumber(ARGV[7])
local arg = 9
local function write(command, key, first, last)
  local chunk = 2000
  for i = first, last, chunk do
    redis.call(command, key, unpack(ARGV, i, math.min(i + chunk - 1, last)))
  end
  redis.call('EXPIRE', key, ttl)
end
for k = 3, 2 + n_hashes do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('HSET', KEYS[k], arg + 1, arg + 2 * n) end
  arg = arg + 1 + 2 * n
end
for k = 3 + n_hashes, 2 + n_hashes + n_sets do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('SADD', KEYS[k], arg + 1, arg + n) end
  arg = arg + 1 + n
end
return 1
