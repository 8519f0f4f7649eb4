"""`ReadsInFlight`: identical cold reads wait for the one in progress, and no waiter can keep
the others waiting (cancelled, or the read failed)."""

from __future__ import annotations

import asyncio

from serving_layer.caches import ReadsInFlight


def test_waiters_go_on_when_the_read_ends_and_a_cancelled_one_stops_nobody() -> None:
    async def scenario() -> list[str]:
        reads = ReadsInFlight()
        order: list[str] = []
        assert reads.lead("total")
        assert not reads.lead("total")  # one read at a time per answer
        assert reads.lead("other")  # other answers are not held up

        async def waiter(name: str) -> None:
            await reads.wait("total")
            order.append(name)

        first, cancelled, last = (asyncio.create_task(waiter(n)) for n in ("a", "x", "b"))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert order == [] and cancelled.cancelled()
        reads.done("total")
        await asyncio.gather(first, last)
        await reads.wait("total")  # none in progress: at once
        assert reads.lead("total")  # the next cold read leads again
        return order

    assert asyncio.run(scenario()) == ["a", "b"]
