"""A late table version joined anew (rule 11 in docs/semantics.md): only the metrics that join
the table, from the partition's events since W, recomputed in memory while the old cells stay
served, then put in their place by one fenced apply. So no answer blanks meanwhile, and the
metrics that join no table are never touched.

Steps, by name: `rejoined_plan` (which metrics), `read_range` (the partition's records from
`rebuild_from` through its fence), `Recomputation` (`decide` over them into a `MemoryView`),
`replacement` (the apply that swaps the recomputed sub-cells for the stored ones)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from confluent_kafka import Consumer, TopicPartition

from shared.config import Settings
from shared.events import AsOf
from shared.kafka import client_config
from shared.metric_plan import MetricPlan
from shared.speed_view import ApplyBatch, Fence, SpeedViewWriter, sessions_key
from shared.speed_view.held import SessionPlans
from shared.speed_view.keys import ids_of_key
from speed_layer.errors import TableFeedError
from speed_layer.processor import RawRecord, SourcePlan, continue_from_seeds, decide
from speed_layer.sessions import SessionSeeds

_CHUNK = 5_000
"""Records decided at once: the speed layer's own batch size."""
_STALL_S = 10.0


class MemoryView:
    """The speed view's hashes, sets and strings in dicts, read as `decide` reads Redis."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[bytes, bytes]] = defaultdict(dict)
        self.sets: dict[str, set[str]] = defaultdict(set)
        self.strings: dict[str, bytes] = {}

    def known_ids(self, requests: Mapping[str, Sequence[str]]) -> dict[str, list[bool]]:
        return {name: [m in self.sets[name] for m in ids] for name, ids in requests.items()}

    def read_fields(self, requests: Mapping[str, Sequence[bytes]]) -> dict[str, list[bytes | None]]:
        return {name: [self.hashes[name].get(f) for f in fs] for name, fs in requests.items()}

    def read_hashes(self, names: Sequence[str]) -> dict[str, dict[bytes, bytes]]:
        return {name: dict(self.hashes.get(name, {})) for name in names}

    def read_strings(self, names: Sequence[str]) -> list[bytes | None]:
        return [self.strings.get(name) for name in names]

    def write(self, batch: ApplyBatch) -> None:
        for name, fields in batch.cells.items():
            self.hashes[name].update(fields)
        for name, members in batch.ids.items():
            self.sets[name].update(members)
        for name, removed in batch.deleted.items():
            for field in removed:
                self.hashes[name].pop(field, None)
        self.strings.update(batch.strings)
        for name, data in batch.appends.items():
            self.strings[name] = self.strings.get(name, b"") + data
        for name in batch.dropped:
            del self.strings[name]

    def held_keys(self, topic: str, partition: int, plan: MetricPlan) -> dict[bytes, bytes]:
        return dict(self.hashes.get(sessions_key(topic, partition, plan.name, plan.version), {}))


def rejoined_plan(plan: SourcePlan, tables: set[str]) -> SourcePlan:
    """The source's metrics that join one of `tables`, with their rollups and session parts,
    as a plan of their own (no metrics: none joins them)."""
    chosen: dict[str, None] = {}
    for metric in plan.metrics:
        part = metric.rollup or metric.session_part
        joins = any(lookup.table.name in tables for lookup in metric.lookups)
        if joins or (part is not None and part.parent in chosen):
            chosen[metric.name] = None
    return replace(plan, metrics=tuple(m for m in plan.metrics if m.name in chosen))


def accepting_from_w(
    plan: SourcePlan, watermarks: Mapping[str, int | None]
) -> dict[str, int | None]:
    """The W each metric is recomputed under: its own, but a session metric's (and its
    parts') moved back by `max_duration`, so the recomputation holds every event from W on
    that the grace has not passed (rule 13's lateness keeps `max_duration` after W); the
    run's seeds then cut them as the first pass's continuation did."""
    moved = dict(watermarks)
    for metric in plan.metrics:
        w = watermarks.get(metric.name)
        if metric.sessions is not None and w is not None:
            moved[metric.name] = w - metric.sessions.rule.max_duration_ms
    return moved


class Recomputation:
    """A plan's cells of one partition rebuilt from its records in offset order from
    `rebuild_from` (`add`, a chunk at a time), as `decide` builds them from empty state: the
    events from there on hold every copy of every event at or after W (copies share their
    time, rule 4), and lateness is judged as it was the first time (rule 9's argument).
    De-dup sets of buckets late for every metric are dropped as the read goes, so memory
    holds the cells and a few minutes of identities.

    A session metric's sessions from W on are rebuilt from its events there and continued
    from the served run's seeds (`finish`), as the first pass was after that run (rule 13):
    its events from W on are judged under `accepting_from_w`, so one the first pass dropped
    as too close to the W of its day (before that W plus `max_duration`) counts now, as the
    next run counts it."""

    def __init__(
        self,
        plan: SourcePlan,
        partition: int,
        watermarks: Mapping[str, int | None],
        tables: Mapping[str, AsOf],
    ) -> None:
        self.plan, self.partition = plan, partition
        self.watermarks, self.tables = accepting_from_w(plan, watermarks), tables
        self.view = MemoryView()
        self.records = 0
        """How many records were read again."""
        self._fence = Fence(None, None)

    def add(self, chunk: Sequence[RawRecord]) -> None:
        plan, view = self.plan, self.view
        outcome, batch = decide(
            plan, self.partition, self._fence, chunk, self.watermarks, view, self.tables
        )
        view.write(batch)
        self._fence, self.records = outcome.fence, self.records + len(chunk)
        stream_time = self._fence.stream_time
        closed = [
            key
            for key in view.sets
            if plan.id_bucket_closed(ids_of_key(key)[1], self.watermarks, stream_time)
        ]
        for key in closed:
            del view.sets[key]

    def finish(self, seeds: Mapping[str, SessionSeeds]) -> None:
        """Continue each session metric from the served run's seeds (`continue_from_seeds`)."""
        topic = self.plan.source.topic
        for metric in self.plan.metrics:
            run = seeds.get(metric.name)
            if run is None or not metric.holds_sessions:
                continue
            batch = ApplyBatch()
            plans = SessionPlans.of(metric, self.plan.metrics)
            continue_from_seeds(plans, topic, self.partition, run, self.view, batch)
            self.view.write(batch)


def replacement(
    recomputed: MemoryView,
    stored: Mapping[str, tuple[int, set[bytes]]],
    watermarks: Mapping[str, int],
    stored_strings: Iterable[str] = (),
) -> ApplyBatch:
    """The apply that puts the recomputed hashes in place of `stored` (key -> (cell start,
    fields)) for the cells from W on, and the recomputed strings (sessions' events) in place
    of `stored_strings`: stored fields the recomputation lacks are removed, stored keys it
    lacks are dropped. Cells ending before W stay for the readers that still hold the
    previous W (rule 8) until cleanup takes them. `watermarks`: per stored cell, the W of its
    metric (a key without one, such as a session index, is replaced whole)."""
    cells = {key: fields for key, fields in recomputed.hashes.items() if fields}
    batch = ApplyBatch(cells=cells, strings=dict(recomputed.strings))
    for key, (start, fields) in stored.items():
        w = watermarks.get(key)
        if w is not None and start < w:
            continue
        if key not in cells:
            batch.dropped.append(key)
        elif stale := sorted(fields - cells[key].keys()):
            batch.deleted[key] = stale
    batch.dropped += sorted(set(stored_strings) - recomputed.strings.keys())
    return batch


def read_range(
    settings: Settings, topic: str, partition: int, start: int, last: int
) -> Iterator[list[RawRecord]]:
    """The partition's committed records at offsets `start` through `last`, in chunks."""
    consumer = Consumer(
        {
            **client_config(settings.kafka),
            "group.id": f"{settings.speed.app_id}-rejoin",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        chunk: list[RawRecord] = []
        position, progress = start, time.monotonic()
        while position <= last:
            if time.monotonic() - progress > _STALL_S:
                raise TableFeedError(
                    f"reading {topic}[{partition}] again stalled at offset {position} before "
                    f"{last}; is the broker healthy?"
                )
            for message in consumer.consume(_CHUNK, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.fatal() or message.topic() is not None:
                        raise TableFeedError(f"could not read {topic}[{partition}]: {error}")
                    continue
                offset = message.offset()
                assert offset is not None
                if offset <= last:
                    chunk.append(RawRecord(offset, message.timestamp()[1], message.value()))
                progress = time.monotonic()
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if len(chunk) >= _CHUNK or (chunk and position > last):
                yield chunk
                chunk = []
        if chunk:
            yield chunk
    finally:
        consumer.close()


async def rejoin_partition(
    settings: Settings,
    store: SpeedViewWriter,
    partition: int,
    fence: Fence,
    plan: SourcePlan,
    start: int,
    since: int | None,
    watermarks: Mapping[str, int | None],
    tables: Mapping[str, AsOf],
    seeds: Mapping[str, SessionSeeds],
) -> tuple[int, int]:
    """Recompute `plan`'s sub-cells of the partition from offset `start` (its `rebuild_from`,
    the first event at or after `since`, the smallest W of the source's metrics) through its
    fence while the stored ones stay served, then swap them in with one fenced apply (a
    metric without a W of its own has its cells replaced from `since` on; a session metric's
    held sessions are replaced whole, continued from `seeds`). The read runs in
    a thread a chunk at a time and the decisions between awaits, so the worker keeps its group
    membership however long it takes. Returns (the apply's status, the records read again)."""
    topic = plan.source.topic
    assert fence.offset is not None
    watermarks = dict(watermarks)
    work = Recomputation(plan, partition, watermarks, tables)
    chunks = read_range(settings, topic, partition, start, fence.offset)
    while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
        work.add(chunk)
    work.finish(seeds)
    stored: dict[str, tuple[int, set[bytes]]] = {}
    served_w: dict[str, int] = {}
    strings: list[str] = []
    for metric in plan.metrics:
        cells = store.cell_fields(topic, partition, metric)
        stored.update(cells)
        w = watermarks.get(metric.name)
        w = since if w is None else w
        served_w.update({} if w is None else dict.fromkeys(cells, w))
        if metric.holds_sessions:
            index = sessions_key(topic, partition, metric.name, metric.version)
            stored[index] = (0, set(store.held_keys(topic, partition, metric)))
            strings += store.session_strings(topic, partition, metric)
    batch = replacement(work.view, stored, served_w, strings)
    return store.apply(topic, partition, fence, fence, batch), work.records
