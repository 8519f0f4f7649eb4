"""CPython's cyclic garbage collector kept out of the hot paths (each layer profiled it as a
large cost): its collections walk every tracked object, while the objects the layers make per
event or per request hold no cycles and are freed by reference counting anyway."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_startup_objects(young_threshold: int) -> None:
    """Move everything alive now (imports, app set-up) out of the collector's reach for good,
    and collect the young generation every `young_threshold` allocations instead of 700.
    Call once, from a process entry point, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, 20, 100)


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block (the previous state is restored after it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
