-- One key's states in the sub-cells of some source partitions: the key's field in every
-- sub-cell of the base cells asked for, named here from each partition's cell prefix.
-- ARGV[1] is how many KEYS lead with the view's status (2: the epoch marker and the set of
-- rebuilding partitions, answered first as EXISTS and SCARD; 0: none), ARGV[2] the key's
-- field, ARGV[3] the base window, ARGV[4] the number of prefixes, then the prefixes, then the
-- cells as runs of (first start, cell count). The other KEYS are the partitions' fences: they
-- only route the call (on a Redis Cluster, one call per partition, since each has its own
-- slot; the status is read apart there, its keys being in other slots).
-- Each cell asked for answers one array: the states found in it, partition by partition,
-- missing ones left out. A series asks for ~60 contiguous cells: two numbers instead of ~60
-- names per partition, and 60 short arrays instead of 240 mostly empty replies, are most of
-- what the call saves the client. Called by `reader.SpeedViewReader.read_key`.
local out = {}
local status = tonumber(ARGV[1])
if status == 2 then
  out[1] = redis.call('EXISTS', KEYS[1])
  out[2] = redis.call('SCARD', KEYS[2])
end
local field, base, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 5 + n, #ARGV, 2 do
  local first, count = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  for c = 0, count - 1 do
    local start = string.format('%d', first + c * base)
    local found = {}
    for p = 5, 4 + n do
      local state = redis.call('HGET', ARGV[p] .. start, field)
      if state then found[#found + 1] = state end
    end
    out[#out + 1] = found
  end
end
return out
