"""The speed view in Redis as one module: its key scheme (`keys`), the writer the speed layer
applies batches with (`SpeedViewWriter`), the reader the serving layer answers from
(`SpeedViewReader`), and the Lua scripts each calls, kept beside them (`apply.lua`,
`read_key.lua`). The states it holds are the aggregation registry's bytes
(`shared.aggregations.encode_state`). See `keys` for the key scheme."""

from shared.speed_view.keys import (
    EPOCH_KEY,
    REBUILDING_KEY,
    cell_key,
    decode_key,
    encode_key,
    fence_key,
    ids_key,
    rebuild_member,
)
from shared.speed_view.reader import SpeedViewReader, speed_status, speed_status_of
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
    "ApplyBatch",
    "Fence",
    "SpeedViewReader",
    "SpeedViewWriter",
    "cell_key",
    "decode_key",
    "encode_key",
    "ensure_epoch",
    "fence_key",
    "ids_key",
    "rebuild_member",
    "speed_status",
    "speed_status_of",
]
