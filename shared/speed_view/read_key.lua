-- One key's states in the sub-cells of some source partitions: the key's field (ARGV[1]) in
-- every sub-cell of the base cells asked for, named here from each partition's cell prefix.
-- ARGV[2] is the base window, ARGV[3] the number of prefixes, then the prefixes, then the
-- cells as runs of (first start, cell count). KEYS are the partitions' fences: they only
-- route the call (on a Redis Cluster, one call per partition, since each has its own slot).
-- A series asks for ~60 contiguous cells: two numbers instead of ~60 names per partition are
-- most of what the call saves the client. Called by `reader.SpeedViewReader.read_key`.
local out = {}
local field, base, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 4 + n, #ARGV, 2 do
  local first, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  for c = 0, count - 1 do
    local start = string.format('%d', first + c * base)
    for p = 4, 3 + n do out[#out + 1] = redis.call('HGET', ARGV[p] .. start, field) end
  end
end
return out
