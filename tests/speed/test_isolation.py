"""A record that makes processing fail cannot stall its partition (`isolate_failures`): pure
logic, checked with a stand-in for `SourceProcessor.process` that fails on chosen records."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shared.speed_view import APPLIED, FENCE_MOVED, Fence
from speed_layer.processor import BatchOutcome, RawRecord, isolate_failures


class Transient(Exception):
    """Stands for a store failure: retried as it is, never narrowed down."""


class Recorder:
    """Applies batches like the processor would (in offset order, each past the last), failing
    on `poison` offsets unless told the batch is unprocessable."""

    def __init__(self, poison: set[int], transient_at: int | None = None) -> None:
        self.poison = poison
        self.transient_at = transient_at
        self.applied: list[int] = []
        self.dead: list[tuple[int, str]] = []
        self.calls = 0

    def __call__(self, records: Sequence[RawRecord], unprocessable: str | None) -> BatchOutcome:
        self.calls += 1
        offsets = [r.offset for r in records]
        if unprocessable is not None:
            self.dead += [(o, unprocessable) for o in offsets]
        else:
            bad = self.poison.intersection(offsets)
            if bad:
                raise OverflowError(f"intermediate overflow at {min(bad)}")
            if self.transient_at in offsets:
                raise Transient("redis went away")
            assert not self.applied or offsets[0] > self.applied[-1], "applied out of order"
            self.applied += offsets
        return BatchOutcome(APPLIED, Fence(offsets[-1], None))


def records(n: int) -> list[RawRecord]:
    return [RawRecord(offset, 0, b"{}") for offset in range(n)]


@pytest.mark.parametrize("poison", [set(), {0}, {999}, {500}, {3, 4, 700}, set(range(0, 1000, 97))])
def test_every_other_record_is_applied_once_in_order(poison: set[int]) -> None:
    process = Recorder(poison)
    outcomes = isolate_failures(records(1000), process, lambda e: isinstance(e, Transient))
    assert all(o.status == APPLIED for o in outcomes)
    assert process.applied == [o for o in range(1000) if o not in poison]
    assert [o for o, _ in process.dead] == sorted(poison)
    assert all(why.startswith("OverflowError: intermediate overflow") for _, why in process.dead)
    assert outcomes[-1].fence.offset == 999
    assert process.calls <= 1 + 4 * len(poison) * 10 + len(poison), "narrowing costs ~log2(n)"


def test_a_store_failure_is_not_narrowed_down() -> None:
    process = Recorder(set(), transient_at=10)
    with pytest.raises(Transient):
        isolate_failures(records(100), process, lambda e: isinstance(e, Transient))
    assert process.calls == 1 and process.applied == [] and process.dead == []


def test_a_store_failure_while_narrowing_stops_there() -> None:
    """The first half applied, the store failed in the second: the caller re-reads from the
    fence, which holds exactly what was applied."""
    process = Recorder({20}, transient_at=80)
    with pytest.raises(Transient):
        isolate_failures(records(100), process, lambda e: isinstance(e, Transient))
    assert process.applied == [o for o in range(50) if o != 20]
    assert process.dead == [(20, "OverflowError: intermediate overflow at 20")]


def test_it_stops_at_an_outcome_that_was_not_applied() -> None:
    calls: list[int] = []

    def process(batch: Sequence[RawRecord], unprocessable: str | None) -> BatchOutcome:
        calls.append(batch[0].offset)
        if unprocessable is None and any(r.offset == 7 for r in batch):
            raise ValueError("bad record")
        status = FENCE_MOVED if batch[0].offset == 0 and len(batch) < 16 else APPLIED
        return BatchOutcome(status, Fence(batch[-1].offset, None))

    outcomes = isolate_failures(records(16), process, lambda e: False)
    assert [o.status for o in outcomes] == [FENCE_MOVED]
    assert calls == [0, 0, 0], "the whole batch, the half holding 7, then its first quarter"
