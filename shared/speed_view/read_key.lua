-- One call for one key's states: the epoch marker (KEYS[1]), the rebuilding set's size
-- (KEYS[2]) and the key's field (ARGV[2]) in every sub-cell of the base cells asked for,
-- named here from their prefix (ARGV[1]) and the partition count (ARGV[3]). The cells come
-- as runs: ARGV[4] is the base window, then (first start, cell count) pairs. A series asks
-- for ~60 contiguous cells: two numbers instead of ~60 (or ~240 names) are most of what the
-- call saves the client. Called by `reader.SpeedViewReader.read_key`.
local out = {redis.call('EXISTS', KEYS[1]), redis.call('SCARD', KEYS[2])}
local prefix, field, partitions = ARGV[1], ARGV[2], tonumber(ARGV[3])
local base = tonumber(ARGV[4])
for i = 5, #ARGV, 2 do
  local first, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  for n = 0, count - 1 do
    local cell = prefix .. string.format('%d', first + n * base) .. ':'
    for p = 0, partitions - 1 do out[#out + 1] = redis.call('HGET', cell .. p, field) end
  end
end
return out
