"""One source's batch of records of one partition: parse → de-dup → lateness → pre-aggregate →
merge with the stored sub-cells → one fenced Lua apply (rule 3). The semantics are `shared`'s
(`parse_record`, `metric_input`, `window_start`, rule 2 as in `shared.lateness.is_late`);
this module only makes them cheap per event.

Hot path: each event is parsed once, then folded per (metric, base cell, key) into a plain
list `[count, sum, min, max, set(distinct values)...]`; DataSketches HLL sketches are built
only once per touched (cell, key) per batch, from the de-duplicated distinct values, and
merged with the stored state (one HMGET per touched sub-cell, one round trip).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from shared.aggregates import AggState, new_sketch
from shared.config import MetricConfig, Settings, SourceConfig
from shared.events import Malformed, Skipped, SourceEvent, metric_input, parse_record
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

log = logging.getLogger(__name__)


class KafkaRecord(Protocol):
    """What the processor reads of a Kafka record (aiokafka's `ConsumerRecord` has these)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...


class RawRecord(NamedTuple):
    """A Kafka record: offset, CreateTime in epoch ms, value."""

    offset: int
    timestamp: int
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
    records: int = 0
    duplicates: int = 0
    dead_letters: list[Rejected] = field(default_factory=list)
    late: list[Rejected] = field(default_factory=list)
    late_by_metric: Counter[str] = field(default_factory=Counter)
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)


class _Metric(NamedTuple):
    config: MetricConfig
    version: str
    base: int
    grace: int
    n_distinct: int


Publish = Callable[[str, int, Sequence[Rejected], Sequence[Rejected]], None]
"""Sends a batch's dead letters and late events to Kafka (and waits) before the batch is
applied, so a crash after the apply never loses them; replays re-send the same keys."""

_Slot = tuple[int, int, tuple[str, ...]]
"""(metric index, base cell start, canonical key)."""


class SourceProcessor:
    """Applies batches of one source's records to the speed view, exactly once per partition.

    Holds, per partition, only the fence it last wrote or read; `forget` drops it (revoked,
    a failed compare-and-set, a rebuild)."""

    def __init__(
        self, settings: Settings, source: SourceConfig, store: SpeedStore, publish: Publish
    ) -> None:
        self.source = source
        self._store = store
        self._publish = publish
        self.metrics = [
            _Metric(m, settings.metric_version(m), m.base_window, m.grace, len(m.distinct_fields))
            for m in settings.metrics_of(source)
        ]
        self.id_bucket_ms = min((m.base for m in self.metrics), default=60_000)
        self.defs = hashlib.sha256(
            ",".join(sorted(f"{m.config.name}={m.version}" for m in self.metrics)).encode()
        ).hexdigest()[:12]
        """The metric versions this worker builds cells with (stored in each fence)."""
        self._fences: dict[int, Fence] = {}

    def forget(self, partition: int) -> None:
        self._fences.pop(partition, None)

    def set_fence(self, partition: int, fence: Fence) -> None:
        self._fences[partition] = fence

    def known_fence(self, partition: int) -> Fence | None:
        """The fence held for a partition, without reading Redis (None when not held)."""
        return self._fences.get(partition)

    def fence(self, partition: int) -> Fence:
        if partition not in self._fences:
            self._fences[partition] = self._store.read_fence(self.source.topic, partition)
        return self._fences[partition]

    def process(
        self,
        epoch: str,
        partition: int,
        records: Sequence[KafkaRecord],
        watermarks: Mapping[str, int | None],
    ) -> BatchOutcome:
        fence = self.fence(partition)
        if fence.offset is not None and records and records[0].offset <= fence.offset:
            records = [r for r in records if r.offset > fence.offset]
        if not records:
            return BatchOutcome(APPLIED, fence)
        outcome, batch = self.decide(partition, fence, records, watermarks)
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
                    "fence of %s[%d] moved: another worker applied it; re-reading it",
                    self.source.topic,
                    partition,
                )
        return outcome

    def decide(
        self,
        partition: int,
        fence: Fence,
        records: Sequence[KafkaRecord],
        watermarks: Mapping[str, int | None],
    ) -> tuple[BatchOutcome, ApplyBatch]:
        """Rules 2 and 4 per event in offset order; returns the outcome and what to write."""
        source = self.source
        topic = source.topic
        bucket_ms = self.id_bucket_ms
        parsed: list[SourceEvent | Malformed] = [
            parse_record(r.value, r.timestamp, source) for r in records
        ]
        known = self._known_ids(partition, parsed)
        metrics = [
            (i, m.config, m.base, m.grace, watermarks.get(m.config.name), m.n_distinct)
            for i, m in enumerate(self.metrics)
        ]
        stream_time = fence.stream_time
        if stream_time is None:
            stream_time = -(2**63)
        outcome = BatchOutcome(APPLIED, fence, records=len(records))
        dead_letters, late_records = outcome.dead_letters, outcome.late
        late_by_metric, skipped = outcome.late_by_metric, outcome.skipped
        new_ids: dict[int, list[str]] = defaultdict(list)
        seen: set[tuple[int, str]] = set()
        partials: dict[_Slot, list[Any]] = {}
        duplicates = 0
        inf, ninf = math.inf, -math.inf
        for record, event in zip(records, parsed, strict=True):
            if type(event) is Malformed:
                dead_letters.append(Rejected(record.offset, record.value, event.reason))
                continue
            assert type(event) is SourceEvent
            time_ms = event.time_ms
            if time_ms > stream_time:
                stream_time = time_ms
            event_id = event.event_id
            if event_id is not None:
                bucket = time_ms - time_ms % bucket_ms
                marker = (bucket, event_id)
                if marker in seen or marker in known:
                    duplicates += 1
                    continue
                seen.add(marker)
                new_ids[bucket].append(event_id)
            late_for: list[str] | None = None
            for index, metric, base, grace, watermark, n_distinct in metrics:
                contribution = metric_input(event, metric)
                if type(contribution) is Skipped:
                    skipped[(metric.name, contribution.reason)] += 1
                    continue
                start = time_ms - time_ms % base
                end = start + base
                if end + grace <= stream_time or (watermark is not None and end <= watermark):
                    if late_for is None:
                        late_for = []
                    late_for.append(metric.name)
                    late_by_metric[metric.name] += 1
                    continue
                key, value, distincts = contribution  # type: ignore[misc]
                slot = (index, start, key)
                acc = partials.get(slot)
                if acc is None:
                    acc = partials[slot] = [0, 0.0, inf, ninf, *(set() for _ in range(n_distinct))]
                acc[0] += 1
                if value is not None:
                    acc[1] += value
                    if value < acc[2]:
                        acc[2] = value
                    if value > acc[3]:
                        acc[3] = value
                for position, item in enumerate(distincts, 4):
                    acc[position].add(item)
            if late_for is not None:
                late_records.append(Rejected(record.offset, record.value, ",".join(late_for)))
        outcome.duplicates = duplicates
        new_stream_time = None if stream_time == -(2**63) else stream_time
        outcome.fence = Fence(records[-1].offset, new_stream_time, self.defs)
        ids = {ids_key(topic, partition, bucket): members for bucket, members in new_ids.items()}
        return outcome, ApplyBatch(self._merged_cells(partition, partials), ids)

    def _known_ids(
        self, partition: int, parsed: Sequence[SourceEvent | Malformed]
    ) -> set[tuple[int, str]]:
        """Ids of this batch that earlier batches recorded (one round trip, SMISMEMBER)."""
        bucket_ms = self.id_bucket_ms
        by_bucket: dict[int, set[str]] = defaultdict(set)
        for event in parsed:
            if type(event) is SourceEvent and event.event_id is not None:
                by_bucket[event.time_ms - event.time_ms % bucket_ms].add(event.event_id)
        if not by_bucket:
            return set()
        topic = self.source.topic
        requests = {ids_key(topic, partition, b): (b, sorted(ids)) for b, ids in by_bucket.items()}
        answers = self._store.known_ids({k: v[1] for k, v in requests.items()})
        known: set[tuple[int, str]] = set()
        for key, (bucket, members) in requests.items():
            for member, present in zip(members, answers[key], strict=True):
                if present:
                    known.add((bucket, member))
        return known

    def _merged_cells(
        self, partition: int, partials: Mapping[_Slot, list[Any]]
    ) -> dict[str, dict[bytes, bytes]]:
        """Build each touched (cell, key) state once and merge it into the stored one."""
        wanted: dict[str, list[tuple[bytes, _Slot]]] = defaultdict(list)
        for slot in partials:
            index, start, key = slot
            metric = self.metrics[index]
            name = cell_key(metric.config.name, metric.version, start, partition)
            wanted[name].append((encode_key(key), slot))
        stored = self._store.read_fields({name: [f for f, _ in fs] for name, fs in wanted.items()})
        cells: dict[str, dict[bytes, bytes]] = {}
        for name, fields in wanted.items():
            out: dict[bytes, bytes] = {}
            for (encoded, slot), previous in zip(fields, stored[name], strict=True):
                acc = partials[slot]
                sketches = []
                for values in acc[4:]:
                    sketch = new_sketch()
                    for item in values:
                        sketch.update(item)
                    sketches.append(sketch)
                state = AggState(acc[0], acc[1], acc[2], acc[3], sketches)
                if previous is not None:
                    state = AggState.from_bytes(previous).merge(state)
                out[encoded] = state.to_bytes()
            cells[name] = out
        return cells
