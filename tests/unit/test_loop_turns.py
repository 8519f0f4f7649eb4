"""A long merge gives the event loop turns (`LoopTurns`), so a request's deadline fires and
cancels it mid-way instead of after it ends (issue #26: a slow query must not take the API's
latency with it)."""

from __future__ import annotations

import asyncio
import time

from serving_layer.merged_view import LoopTurns


async def _merge(turns: LoopTurns | None, seconds: float, done: list[float]) -> None:
    """Stands for a merge: CPU work for `seconds`, taking turns when given `turns`."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        sum(range(1000))
        if turns is not None:
            await turns.turn()
    done.append(time.perf_counter())


async def _deadline(turns: LoopTurns | None) -> tuple[bool, float]:
    """Runs a 1 s merge with a 0.1 s deadline, as `RequestBudget` does; returns whether the
    merge was cancelled and when the deadline's callback ran, from the start."""
    done: list[float] = []
    started = time.perf_counter()
    work = asyncio.ensure_future(_merge(turns, 1.0, done))
    fired: list[float] = []
    asyncio.get_running_loop().call_later(
        0.1, lambda: (fired.append(time.perf_counter() - started), work.cancel())
    )
    try:
        await work
    except asyncio.CancelledError:
        return True, fired[0]
    return False, fired[0] if fired else time.perf_counter() - started


def test_a_merge_taking_turns_is_cancelled_at_its_deadline() -> None:
    cancelled, fired_after = asyncio.run(_deadline(LoopTurns(0.02)))
    assert cancelled
    assert fired_after < 0.5, "the deadline waited for the merge"


def test_without_turns_the_deadline_waits_for_the_merge() -> None:
    """The failure `LoopTurns` prevents: the loop is held until the merge ends."""
    cancelled, fired_after = asyncio.run(_deadline(None))
    assert not cancelled and fired_after >= 1.0
