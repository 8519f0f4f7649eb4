-- One call for one key's states: the epoch marker (KEYS[1]), the rebuilding set's size
-- (KEYS[2]) and the key's field (ARGV[2]) in every sub-cell of the base cells starting at
-- ARGV[4..], named here from their prefix (ARGV[1]) and the partition count (ARGV[3]): packing
-- ~60 arguments instead of ~240 names is most of what the call costs the client. Called by
-- `reader.SpeedViewReader.read_key`.
local out = {redis.call('EXISTS', KEYS[1]), redis.call('SCARD', KEYS[2])}
local prefix, field, partitions = ARGV[1], ARGV[2], tonumber(ARGV[3])
for i = 4, #ARGV do
  local cell = prefix .. ARGV[i] .. ':'
  for p = 0, partitions - 1 do out[#out + 1] = redis.call('HGET', cell .. p, field) end
end
return out
