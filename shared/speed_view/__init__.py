"""The speed view in Redis as one module: its key scheme (`keys`), the writer the speed layer
applies batches with (`SpeedViewWriter`), the reader the serving layer answers from
(`SpeedViewReader`), the Lua scripts each calls, kept beside them (`apply.lua`,
`read_key.lua`), and the clients they take (`redis_client`, `redis_client_async`: one server or a
Redis Cluster). The states it holds are the aggregation registry's bytes
(`shared.aggregations.encode_state`). See `keys` for the key scheme."""

from shared.speed_view.client import (
    REDIS_FAILURES,
    AsyncRedis,
    SyncRedis,
    redis_client,
    redis_client_async,
)
from shared.speed_view.keys import (
    EPOCH_KEY,
    REBUILDING_KEY,
    PartitionStall,
    cell_key,
    decode_key,
    encode_key,
    fence_key,
    ids_key,
    rebuild_member,
    session_events_key,
    sessions_key,
)
from shared.speed_view.reader import (
    SpeedViewReader,
    speed_status,
    speed_status_of,
    stalled_partitions,
)
from shared.speed_view.writer import (
    APPLIED,
    EPOCH_LOST,
    FENCE_MOVED,
    ApplyBatch,
    Fence,
    SpeedViewWriter,
    ensure_epoch,
)

__all__ = [
    "APPLIED",
    "EPOCH_KEY",
    "EPOCH_LOST",
    "FENCE_MOVED",
    "REBUILDING_KEY",
    "REDIS_FAILURES",
    "ApplyBatch",
    "AsyncRedis",
    "Fence",
    "PartitionStall",
    "SpeedViewReader",
    "SpeedViewWriter",
    "SyncRedis",
    "cell_key",
    "decode_key",
    "encode_key",
    "ensure_epoch",
    "fence_key",
    "ids_key",
    "rebuild_member",
    "redis_client",
    "redis_client_async",
    "session_events_key",
    "sessions_key",
    "speed_status",
    "speed_status_of",
    "stalled_partitions",
]
