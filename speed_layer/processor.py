"""One source's batch of records, per partition: parse → de-dup → lateness → pre-aggregate →
one fenced Lua apply (rule 3). Faust only feeds it; the semantics live in `shared`."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shared.aggregates import AggState
from shared.config import MetricConfig, Settings, SourceConfig
from shared.events import Malformed, Skipped, SourceEvent, metric_input, parse_record
from shared.lateness import is_late
from shared.speed_store import (
    APPLIED,
    FENCE_MOVED,
    ApplyBatch,
    Fence,
    SpeedStore,
    cell_key,
    encode_key,
    ids_key,
)
from shared.windows import window_start

log = logging.getLogger(__name__)


class RawRecord(NamedTuple):
    offset: int
    create_time_ms: int
    value: bytes | None


class Rejected(NamedTuple):
    """A record for `<source>.dlq` (reason) or `<source>.late` (the metrics it is late for)."""

    offset: int
    value: bytes | None
    why: str


@dataclass
class BatchOutcome:
    status: int
    fence: Fence
    applied: int = 0
    duplicates: int = 0
    dead_letters: list[Rejected] = field(default_factory=list)
    late: list[Rejected] = field(default_factory=list)
    late_by_metric: Counter[str] = field(default_factory=Counter)
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)


class _Metric(NamedTuple):
    config: MetricConfig
    version: str


Publish = Callable[[str, int, Sequence[Rejected], Sequence[Rejected]], None]
"""Sends a batch's dead letters and late events to Kafka before the batch is applied."""


class SourceProcessor:
    """Applies batches of one source's records to the speed view, exactly once per partition."""

    def __init__(
        self,
        settings: Settings,
        source: SourceConfig,
        store: SpeedStore,
        publish: Publish,
    ) -> None:
        self.source = source
        self._store = store
        self._publish = publish
        self._metrics = [
            _Metric(m, settings.metric_version(m)) for m in settings.metrics_of(source)
        ]
        self._id_bucket_ms = min(
            (m.base_window for m in settings.metrics_of(source)), default=60_000
        )
        self._fences: dict[int, Fence] = {}

    def forget(self, partition: int) -> None:
        """Drop what we hold for a partition (revoked, or our fence lost a compare-and-set)."""
        self._fences.pop(partition, None)

    def fence(self, partition: int) -> Fence:
        if partition not in self._fences:
            self._fences[partition] = self._store.read_fence(self.source.topic, partition)
        return self._fences[partition]

    def process(
        self,
        epoch: str,
        partition: int,
        records: Sequence[RawRecord],
        watermarks: Mapping[str, int | None],
    ) -> BatchOutcome:
        fence = self.fence(partition)
        fresh = [r for r in records if fence.offset is None or r.offset > fence.offset]
        if not fresh:
            return BatchOutcome(APPLIED, fence)
        outcome, batch = self._decide(partition, fence, fresh, watermarks)
        self._publish(self.source.topic, partition, outcome.dead_letters, outcome.late)
        outcome.status = self._store.apply(
            epoch, self.source.topic, partition, fence, outcome.fence, batch
        )
        if outcome.status == APPLIED:
            self._fences[partition] = outcome.fence
        else:
            self.forget(partition)
            if outcome.status == FENCE_MOVED:
                log.warning(
                    "fence of %s[%d] moved: another worker owns it", self.source.topic, partition
                )
        return outcome

    def _decide(
        self,
        partition: int,
        fence: Fence,
        records: Sequence[RawRecord],
        watermarks: Mapping[str, int | None],
    ) -> tuple[BatchOutcome, ApplyBatch]:
        source = self.source
        parsed = [(r, parse_record(r.value, r.create_time_ms, source)) for r in records]
        known = self._known_ids(partition, parsed)
        stream_time = fence.stream_time
        outcome = BatchOutcome(APPLIED, fence)
        new_ids: dict[str, list[str]] = defaultdict(list)
        seen: set[tuple[int, str]] = set()
        partials: dict[tuple[int, int, tuple[str, ...]], AggState] = {}
        for record, event in parsed:
            if isinstance(event, Malformed):
                outcome.dead_letters.append(Rejected(record.offset, record.value, event.reason))
                continue
            time_ms = event.time_ms
            stream_time = time_ms if stream_time is None else max(stream_time, time_ms)
            if event.event_id is not None:
                bucket = window_start(time_ms, self._id_bucket_ms)
                if (bucket, event.event_id) in seen or (bucket, event.event_id) in known:
                    outcome.duplicates += 1
                    continue
                seen.add((bucket, event.event_id))
                new_ids[ids_key(source.topic, partition, bucket)].append(event.event_id)
            late_for = []
            for index, (metric, _version) in enumerate(self._metrics):
                contribution = metric_input(event, metric)
                if isinstance(contribution, Skipped):
                    outcome.skipped[(metric.name, contribution.reason)] += 1
                    continue
                start = window_start(time_ms, metric.base_window)
                if is_late(
                    start + metric.base_window,
                    metric.grace,
                    stream_time,
                    watermarks.get(metric.name),
                ):
                    late_for.append(metric.name)
                    outcome.late_by_metric[metric.name] += 1
                    continue
                slot = (index, start, contribution.key)
                state = partials.get(slot)
                if state is None:
                    state = partials[slot] = AggState.empty(len(metric.distinct_fields))
                state.add(contribution.value, contribution.distincts)
            if late_for:
                outcome.late.append(Rejected(record.offset, record.value, ",".join(late_for)))
        outcome.applied = len(records)
        outcome.fence = Fence(records[-1].offset, stream_time)
        return outcome, ApplyBatch(self._merged_cells(partition, partials), dict(new_ids))

    def _known_ids(
        self, partition: int, parsed: Sequence[tuple[RawRecord, SourceEvent | Malformed]]
    ) -> set[tuple[int, str]]:
        """Ids of this batch already recorded by earlier batches (one pipelined round trip)."""
        candidates = sorted(
            {
                (window_start(event.time_ms, self._id_bucket_ms), event.event_id)
                for _, event in parsed
                if isinstance(event, SourceEvent) and event.event_id is not None
            }
        )
        if not candidates:
            return set()
        answers = self._store.known_ids(
            (ids_key(self.source.topic, partition, bucket), event_id)
            for bucket, event_id in candidates
        )
        return {c for c, known in zip(candidates, answers, strict=True) if known}

    def _merged_cells(
        self, partition: int, partials: Mapping[tuple[int, int, tuple[str, ...]], AggState]
    ) -> dict[str, dict[bytes, bytes]]:
        """Merge the batch's partial states into the stored sub-cells it touches."""
        slots = list(partials)
        requests = []
        for index, start, key in slots:
            metric, version = self._metrics[index]
            requests.append((cell_key(metric.name, version, start, partition), encode_key(key)))
        current = self._store.read_states(requests)
        cells: dict[str, dict[bytes, bytes]] = defaultdict(dict)
        for slot, (name, encoded), stored in zip(slots, requests, current, strict=True):
            state = partials[slot]
            if stored is not None:
                state = AggState.from_bytes(stored).merge(state)
            cells[name][encoded] = state.to_bytes()
        return dict(cells)
