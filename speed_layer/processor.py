"""One source's batch of records of one partition: parse → de-dup → lateness → pre-aggregate →
merge with the stored sub-cells → one fenced Lua apply (rule 3). The semantics are `shared`'s
(`parse_fields` = `parse_record`, `metric_inputs` = `metric_input`, `window_start`, rule 2 by
`shared.lateness.latest_late_start`, the states by `shared.aggregations.fold_inputs`); this
module only makes them cheap per event. `decide` is a pure function of the batch and what it
reads of the view; `SourceProcessor.process` does the I/O around it.

Hot path (profiled with py-spy; the worker is CPU-bound, so Python work per event is what
decides its speed): one loop in offset order parses each record and keeps plain tuples (no
object per event), the stream time as of each event and the batch's de-dup markers; one
SMISMEMBER round trip finds the ids earlier batches recorded; then one loop per metric over
the surviving events (validity, lateness, grouping per (base cell, key) as lists of input
tuples). Each group is folded once into its stored state by the aggregation registry
(`shared.aggregations.fold_inputs`: plain columns, and each sketch updated with the group's
items), reading the stored states with one HMGET per touched sub-cell, in one round trip.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple, Protocol

from shared.aggregations import decode_state, encode_state, fold_inputs
from shared.config import Settings, SourceConfig
from shared.events import (
    AsOf,
    Filtered,
    InputFields,
    Malformed,
    Skipped,
    dedup_identity,
    metric_inputs,
    parse_fields,
)
from shared.lateness import id_bucket_closed
from shared.metric_plan import MetricPlan, Rollup, versions_digest
from shared.speed_view import (
    APPLIED,
    FENCE_MOVED,
    ApplyBatch,
    Fence,
    SpeedViewWriter,
    cell_key,
    decode_key,
    encode_key,
    ids_key,
    session_events_key,
    sessions_key,
)
from shared.speed_view.held import (
    HeldEvent,
    KeyIndex,
    SessionPlans,
    event_lines,
    read_event_lines,
)
from speed_layer.session_totals import KeyChange, TotalsView, write_totals
from speed_layer.sessions import (
    KeyUpdate,
    SessionSeeds,
    SlowPath,
    fast_update,
    needs_events,
    reseeded,
    tail_update,
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
    """A record for `<source>.dlq` (reason, and the detail naming the field) or
    `<source>.late` (the metrics it is late for)."""

    offset: int
    value: bytes | None
    why: str
    detail: str = ""


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


Publish = Callable[[str, int, Sequence[Rejected], Sequence[Rejected]], None]
"""Sends a batch's dead letters and late events to Kafka (and waits) before the batch is
applied, so a crash after the apply never loses them; replays re-send the same keys."""

_NO_TIME = -(2**63)
"""The stream time of a partition that has read no source-valid record yet."""


class ViewState(TotalsView, Protocol):
    """What deciding a batch reads of the speed view (`SpeedViewWriter` answers from Redis)."""

    def known_ids(self, requests: Mapping[str, Sequence[str]]) -> dict[str, list[bool]]: ...

    def read_strings(self, names: Sequence[str]) -> list[bytes | None]: ...


@dataclass(frozen=True)
class SourcePlan:
    """One source as the speed layer decides it: its metrics' plans, the de-dup id bucket and
    the digest of the metric versions its fences record."""

    source: SourceConfig
    metrics: tuple[MetricPlan, ...]
    id_bucket_ms: int
    """The source's smallest base window: ids are kept per (partition, bucket) (rule 4)."""
    defs: str
    """The metric versions this worker builds cells with (stored in each fence)."""

    @classmethod
    def of(cls, settings: Settings, source: SourceConfig) -> SourcePlan:
        metrics = settings.plans_of(source)
        bucket = min((m.base_window_ms for m in metrics), default=60_000)
        return cls(source, metrics, bucket, versions_digest(metrics))

    def id_bucket_closed(
        self, bucket_ms: int, watermarks: Mapping[str, int | None], stream_time: int | None
    ) -> bool:
        """Whether a partition whose stream time is `stream_time` may forget the de-dup id
        bucket starting at `bucket_ms` (rule 4): a later copy would be late for every metric."""
        metrics = [(m.base_window_ms, m.grace_ms, watermarks.get(m.name)) for m in self.metrics]
        return id_bucket_closed(bucket_ms, self.id_bucket_ms, metrics, stream_time)


class SourceProcessor:
    """Applies batches of one source's records to the speed view, exactly once per partition.

    Holds, per partition, only the fence it last wrote or read; `forget` drops it (revoked,
    a failed compare-and-set, a rebuild)."""

    def __init__(
        self, settings: Settings, source: SourceConfig, store: SpeedViewWriter, publish: Publish
    ) -> None:
        self.plan = SourcePlan.of(settings, source)
        self.source = source
        self._store = store
        self._publish = publish
        self._fences: dict[int, Fence] = {}
        self.session_plans = {
            m.name: SessionPlans.of(m, self.plan.metrics)
            for m in self.plan.metrics
            if m.holds_sessions
        }
        self._seeded: dict[int, dict[str, str]] = {}
        """Per partition, the published run (its stamp) each session metric was last continued
        from."""

    @property
    def metrics(self) -> tuple[MetricPlan, ...]:
        return self.plan.metrics

    @property
    def id_bucket_ms(self) -> int:
        return self.plan.id_bucket_ms

    @property
    def defs(self) -> str:
        """The metric versions this worker builds cells with (stored in each fence)."""
        return self.plan.defs

    def forget(self, partition: int) -> None:
        self._fences.pop(partition, None)
        self._seeded.pop(partition, None)

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
        partition: int,
        records: Sequence[KafkaRecord],
        watermarks: Mapping[str, int | None],
        unprocessable: str | None = None,
        tables: Mapping[str, AsOf] | None = None,
        seeds: Mapping[str, SessionSeeds] | None = None,
    ) -> BatchOutcome:
        """Decide a batch (`decide`, reading the view through Redis), publish its dead letters
        and late events, and apply it with one fenced call (rule 3). With `unprocessable` (why
        deciding failed) the records are dead-lettered instead (`unprocessable_batch`). The
        partition's session metrics are first continued from the run that published `seeds`
        (`reseed`)."""
        status = self.reseed(partition, seeds or {})
        if status != APPLIED:
            return BatchOutcome(status, self.fence(partition))
        fence = self.fence(partition)
        if fence.offset is not None and records and records[0].offset <= fence.offset:
            records = [r for r in records if r.offset > fence.offset]
        if not records:
            return BatchOutcome(APPLIED, fence)
        if unprocessable is not None:
            outcome, batch = unprocessable_batch(self.plan, fence, records, unprocessable)
        else:
            outcome, batch = decide(
                self.plan, partition, fence, records, watermarks, self._store, tables
            )
        self._publish(self.source.topic, partition, outcome.dead_letters, outcome.late)
        topic = self.source.topic
        outcome.status = self._store.apply(topic, partition, fence, outcome.fence, batch)
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

    def reseed(self, partition: int, seeds: Mapping[str, SessionSeeds]) -> int:
        """Continue the partition's session metrics from the run that published `seeds` (rule
        13), once per run: every held key re-split after its seed (`reseeded`), in one fenced
        apply that leaves the fence where it is. APPLIED when done or nothing to do, else the
        apply's status (the fence is forgotten, as for a batch)."""
        seeded = self._seeded.setdefault(partition, {})
        stale = [
            (self.session_plans[name], run)
            for name, run in seeds.items()
            if name in self.session_plans and seeded.get(name) != run.stamp
        ]
        if not stale:
            return APPLIED
        fence = self.fence(partition)
        topic = self.source.topic
        if fence.offset is not None:  # else nothing was applied: nothing is held
            batch = ApplyBatch()
            for plans, run in stale:
                continue_from_seeds(plans, topic, partition, run, self._store, batch)
            status = self._store.apply(topic, partition, fence, fence, batch)
            if status != APPLIED:
                self.forget(partition)
                return status
        seeded.update((plans.metric.name, run.stamp) for plans, run in stale)
        return APPLIED


class HeldView(ViewState, Protocol):
    """A view a session metric's held keys are read from as well (Redis or `MemoryView`)."""

    def held_keys(self, topic: str, partition: int, plan: MetricPlan) -> dict[bytes, bytes]: ...


def continue_from_seeds(
    plans: SessionPlans,
    topic: str,
    partition: int,
    run: SessionSeeds,
    view: HeldView,
    batch: ApplyBatch,
) -> None:
    """Every held key of a session metric on a partition continued from its seed in a run
    (`reseeded`, rule 13), written into `batch`; the events of the keys that need them read in
    one round trip."""
    needing = []
    for encoded, data in view.held_keys(topic, partition, plans.metric).items():
        key_index = KeyIndex.decode(data)
        seed = run.by_key.get(decode_key(encoded))
        if needs_events(key_index, seed, run.watermark):
            needing.append((KeyWrite(plans, topic, partition, encoded), key_index, seed))
    names = [w.events_key(s.first) for w, key_index, _ in needing for s in key_index.sessions]
    strings = iter(view.read_strings(names))
    changes = []
    for write, key_index, seed in needing:
        events_of = {s.first: read_event_lines(next(strings)) for s in key_index.sessions}
        update = reseeded(plans, key_index, events_of, seed, run.watermark)
        if update is not None:
            write.into(batch, update)
            changes.append(KeyChange(decode_key(write.key), key_index, update))
    write_totals(plans, topic, partition, changes, view, batch)


def isolate_failures(
    records: Sequence[KafkaRecord],
    process: Callable[[Sequence[KafkaRecord], str | None], BatchOutcome],
    transient: Callable[[BaseException], bool],
) -> list[BatchOutcome]:
    """Process a batch so that a record which makes processing fail cannot stall its partition
    (as Kafka Streams' exception handlers keep one record from blocking a task): a failure
    that is not `transient` (a store going away, retried from the fences by the caller) is
    narrowed down by processing each half in turn, and a single failing record is processed
    again as unprocessable, i.e. dead-lettered with the error. Halves are applied in offset
    order, each with its own fenced apply, so the result equals one apply of the batch less
    those records. Returns the outcomes in order; stops at one that was not applied."""
    try:
        return [process(records, None)]
    except Exception as exc:
        if transient(exc):
            raise
        if len(records) == 1:
            log.error(
                "event=unprocessable offset=%d: dead-lettered", records[0].offset, exc_info=exc
            )
            return [process(records, f"{type(exc).__name__}: {exc}"[:1000])]
    half = len(records) // 2
    outcomes = isolate_failures(records[:half], process, transient)
    if outcomes[-1].status != APPLIED:
        return outcomes
    return outcomes + isolate_failures(records[half:], process, transient)


def unprocessable_batch(
    plan: SourcePlan, fence: Fence, records: Sequence[KafkaRecord], error: str
) -> tuple[BatchOutcome, ApplyBatch]:
    """Records that failed to process, dead-lettered with reason `unprocessable` and the error
    as detail; the fence moves past them and nothing else changes (they count as malformed:
    no stream time, no cell, no id)."""
    outcome = BatchOutcome(
        APPLIED,
        Fence(records[-1].offset, fence.stream_time, plan.defs),
        records=len(records),
        dead_letters=[Rejected(r.offset, r.value, "unprocessable", error) for r in records],
    )
    return outcome, ApplyBatch()


def decide(
    plan: SourcePlan,
    partition: int,
    fence: Fence,
    records: Sequence[KafkaRecord],
    watermarks: Mapping[str, int | None],
    view: ViewState,
    tables: Mapping[str, AsOf] | None = None,
) -> tuple[BatchOutcome, ApplyBatch]:
    """Rules 2 and 4 per event in offset order; returns the outcome and what to write. A pure
    function of the batch, the fence it follows, W, what it reads of the view (`view`: the ids
    earlier batches recorded, the stored states it merges into) and the tables its metrics
    join (`tables`, rule 11).

    Two kinds of tight loops. First, in offset order, what does not depend on the metric:
    parse, dead letters, the stream time as of each event, de-duplication within the
    batch (then against Redis, one round trip for the whole batch). Then per metric, over
    the surviving events: metric-level validity, lateness against the stream time as of
    the event, and grouping per (cell, key); states are built once per group."""
    source = plan.source
    topic = source.topic
    bucket_ms = plan.id_bucket_ms
    outcome = BatchOutcome(APPLIED, fence, records=len(records))
    dead_letters = outcome.dead_letters
    stream_time = _NO_TIME if fence.stream_time is None else fence.stream_time
    seen: set[tuple[int, str]] = set()
    new_ids: dict[int, list[str]] = defaultdict(list)
    live_fields: list[dict[str, Any]] = []
    live: list[tuple[int, int, int, tuple[int, str] | None]] = []
    """Per surviving event: (index in the batch, event time, stream time as of the event,
    its de-dup marker (bucket, id) or None)."""
    duplicates = 0
    for index, record in enumerate(records):
        event = parse_fields(record.value, record.timestamp, source)
        if type(event) is Malformed:
            dead_letters.append(Rejected(record.offset, record.value, *event))
            continue
        fields, time_ms, event_id = event  # type: ignore[misc]
        # rule 2: stream time follows event times, but never past the record's timestamp
        clock = time_ms if time_ms < record.timestamp else record.timestamp
        if clock > stream_time:
            stream_time = clock
        marker = None
        if event_id is not None:
            bucket = time_ms - time_ms % bucket_ms
            marker = (bucket, dedup_identity(time_ms, event_id))
            if marker in seen:
                duplicates += 1
                continue
            seen.add(marker)
            new_ids[bucket].append(marker[1])
        live_fields.append(fields)
        live.append((index, time_ms, stream_time, marker))
    known = _known_ids(topic, partition, new_ids, view)
    if known:
        kept = [i for i, item in enumerate(live) if item[3] not in known]
        duplicates += len(live) - len(kept)
        live = [live[i] for i in kept]
        live_fields = [live_fields[i] for i in kept]
        for bucket, members in list(new_ids.items()):
            new_ids[bucket] = [m for m in members if (bucket, m) not in known]
    outcome.duplicates = duplicates

    late_for: dict[int, list[str]] = {}
    times = [item[1] for item in live] if any(m.definitions for m in plan.metrics) else []
    groups: list[dict[tuple[int, tuple[str, ...]], list[InputFields]]] = []
    by_name: dict[str, dict[tuple[int, tuple[str, ...]], list[InputFields]]] = {}
    held: dict[int, dict[tuple[str, ...], list[HeldEvent]]] = {}
    for position, metric in enumerate(plan.metrics):
        name = metric.name
        if metric.rollup is not None:  # a session metric's rollups are kept from its sessions
            rollup = metric.rollup
            groups.append({} if rollup.of_sessions else _rolled_up(by_name[rollup.parent], rollup))
            continue
        groups.append({})
        if metric.session_part is not None:  # its metric's sessions build its cells
            continue
        inputs = metric_inputs(live_fields, metric, times, tables)
        watermark = watermarks.get(name)
        if metric.sessions is not None:
            events, late, skipped = _held_events(metric, watermark, live, inputs, late_for)
            if events:
                held[position] = events
        else:
            groups[-1], late, skipped = _grouped_cells(metric, watermark, live, inputs, late_for)
            by_name[name] = groups[-1]
        if late:
            outcome.late_by_metric[name] += late
        for reason, n in skipped.items():
            outcome.skipped[(name, reason)] += n
    for index in sorted(late_for):
        record = records[index]
        outcome.late.append(Rejected(record.offset, record.value, ",".join(late_for[index])))

    new_stream_time = None if stream_time == _NO_TIME else stream_time
    outcome.fence = Fence(records[-1].offset, new_stream_time, plan.defs)
    ids = {
        ids_key(topic, partition, bucket): members for bucket, members in new_ids.items() if members
    }
    return outcome, _written(plan.metrics, topic, partition, groups, held, view, ids)


Grouped = tuple[dict[tuple[int, tuple[str, ...]], list[InputFields]], int, Counter[str]]
"""One metric's accepted inputs of a batch grouped by (base cell, key), its late events and
its skipped events by reason."""


def _grouped_cells(
    metric: MetricPlan,
    watermark: int | None,
    live: Sequence[tuple[int, int, int, Any]],
    contributions: Iterable[InputFields | Skipped | Filtered],
    late_for: dict[int, list[str]],
) -> Grouped:
    """A cell metric's inputs by (base cell, key), dropping the late ones (rule 2; their
    batch indexes gain the metric's name in `late_for`)."""
    name, windows, grace = metric.name, metric.windows, metric.grace_ms
    cell_start = windows.cell_start
    as_of_seen, bound = _NO_TIME, windows.latest_late_start(grace, None, watermark)
    cells: defaultdict[tuple[int, tuple[str, ...]], list[InputFields]] = defaultdict(list)
    skipped: Counter[str] = Counter()
    late = 0
    for (index, time_ms, as_of, _), contribution in zip(live, contributions, strict=True):
        if type(contribution) is Skipped:
            skipped[contribution.reason] += 1
            continue
        if type(contribution) is Filtered:
            continue
        start = cell_start(time_ms)
        if as_of != as_of_seen:  # the stream time moves only on a new maximum
            as_of_seen, bound = as_of, windows.latest_late_start(grace, as_of, watermark)
        if start <= bound:
            late += 1
            late_for.setdefault(index, []).append(name)
            continue
        cells[(start, contribution[0])].append(contribution)  # type: ignore[index,arg-type,misc]
    return cells, late, skipped


def _held_events(
    metric: MetricPlan,
    watermark: int | None,
    live: Sequence[tuple[int, int, int, Any]],
    contributions: Iterable[InputFields | Skipped | Filtered],
    late_for: dict[int, list[str]],
) -> tuple[dict[tuple[str, ...], list[HeldEvent]], int, Counter[str]]:
    """A session metric's accepted events by key, dropping the late ones (rule 13's lateness;
    their batch indexes gain the metric's name in `late_for`), with its late events and its
    skipped events by reason."""
    assert metric.sessions is not None
    name, is_late, grace = metric.name, metric.sessions.is_late, metric.grace_ms
    events: defaultdict[tuple[str, ...], list[HeldEvent]] = defaultdict(list)
    skipped: Counter[str] = Counter()
    late = 0
    for (index, time_ms, as_of, _), contribution in zip(live, contributions, strict=True):
        if type(contribution) is Skipped:
            skipped[contribution.reason] += 1
            continue
        if type(contribution) is Filtered:
            continue
        if is_late(time_ms, grace, as_of, watermark):
            late += 1
            late_for.setdefault(index, []).append(name)
            continue
        key, value, items = contribution  # type: ignore[misc]
        events[key].append((time_ms, value, items))
    return events, late, skipped


def _rolled_up(
    cells: Mapping[tuple[int, tuple[str, ...]], list[InputFields]], rollup: Rollup
) -> dict[tuple[int, tuple[str, ...]], list[InputFields]]:
    """A rollup's groups: its parent's accepted inputs regrouped by (cell, projected key), so
    it holds exactly what merging the parent's keys would (no validity or lateness of its
    own)."""
    rolled: defaultdict[tuple[int, tuple[str, ...]], list[InputFields]] = defaultdict(list)
    for (start, key), inputs in cells.items():
        rolled[(start, rollup.project(key))].extend(inputs)
    return rolled


def _known_ids(
    topic: str, partition: int, ids_by_bucket: Mapping[int, Sequence[str]], view: ViewState
) -> set[tuple[int, str]]:
    """(bucket, id) of this batch's ids that earlier batches recorded (one round trip,
    SMISMEMBER per bucket)."""
    if not ids_by_bucket:
        return set()
    requests = {ids_key(topic, partition, b): (b, ids) for b, ids in ids_by_bucket.items()}
    answers = view.known_ids({k: v[1] for k, v in requests.items()})
    known: set[tuple[int, str]] = set()
    for key, (bucket, members) in requests.items():
        for member, present in zip(members, answers[key], strict=True):
            if present:
                known.add((bucket, member))
    return known


def _written(
    metrics: Sequence[MetricPlan],
    topic: str,
    partition: int,
    groups: Sequence[Mapping[tuple[int, tuple[str, ...]], Sequence[InputFields]]],
    added: Mapping[int, Mapping[tuple[str, ...], list[HeldEvent]]],
    view: ViewState,
    ids: dict[str, list[str]],
) -> ApplyBatch:
    """What a batch writes: each touched (cell, key) state merged with the stored one, and
    each touched key of a session metric updated (`sessions`: a second round trip reads the
    events of the sessions an event cuts again), reading the stored states and the keys'
    session indexes in one round trip."""
    folds: dict[str, list[tuple[bytes, int, tuple[int, tuple[str, ...]]]]] = defaultdict(list)
    for index, cells in enumerate(groups):
        metric = metrics[index]
        name, version = metric.name, metric.version
        for slot in cells:
            start, key = slot
            field = (encode_key(key), index, slot)
            folds[cell_key(topic, partition, name, version, start)].append(field)
    requests: dict[str, list[bytes]] = {name: [f for f, _, _ in fs] for name, fs in folds.items()}
    for index, keys in added.items():
        metric = metrics[index]
        held = sessions_key(topic, partition, metric.name, metric.version)
        requests[held] = [encode_key(key) for key in keys]
    stored = view.read_fields(requests)
    batch = ApplyBatch(_merged_cells(metrics, groups, folds, stored), ids)
    slow: list[tuple[KeyWrite, KeyIndex, int, list[HeldEvent]]] = []
    changes: dict[str, tuple[SessionPlans, list[KeyChange]]] = {}
    for index, keys in added.items():
        metric = metrics[index]
        plans = SessionPlans.of(metric, metrics)
        changed = changes.setdefault(metric.name, (plans, []))[1]
        held = sessions_key(topic, partition, metric.name, metric.version)
        for (key, events), data in zip(keys.items(), stored[held], strict=True):
            write = KeyWrite(plans, topic, partition, encode_key(key))
            key_index = KeyIndex.decode(data)
            update = fast_update(plans, key_index, events)
            if isinstance(update, SlowPath):
                slow.append((write, key_index, update.start, events))
            else:
                write.into(batch, update)
                changed.append(KeyChange(key, key_index, update))
    if slow:  # their sessions from the first one an event re-cuts, read in one round trip
        names = [
            [write.events_key(s.first) for s in key_index.sessions[start:]]
            for write, key_index, start, _ in slow
        ]
        strings = iter(view.read_strings([name for some in names for name in some]))
        for write, key_index, start, events in slow:
            tail = {s.first: read_event_lines(next(strings)) for s in key_index.sessions[start:]}
            update = tail_update(write.plans, key_index, start, tail, events)
            write.into(batch, update)
            key = decode_key(write.key)
            changes[write.plans.metric.name][1].append(KeyChange(key, key_index, update))
    for plans, changed in changes.values():  # after the keys' cells, which a rebuild reads
        write_totals(plans, topic, partition, changed, view, batch)
    return batch


@dataclass(frozen=True)
class KeyWrite:
    """Where one key of a session metric on one partition is written."""

    plans: SessionPlans
    topic: str
    partition: int
    key: bytes
    """The encoded key (`encode_key`)."""

    def events_key(self, first_ms: int) -> str:
        metric = self.plans.metric
        return session_events_key(
            self.topic, self.partition, metric.name, metric.version, self.key, first_ms
        )

    def into(self, batch: ApplyBatch, update: KeyUpdate) -> None:
        """The key's index (removed when it holds nothing), its sessions' strings and the
        cells of its changed buckets, rebuilt whole or removed where no session starts any
        more."""
        metric = self.plans.metric
        held = sessions_key(self.topic, self.partition, metric.name, metric.version)
        if update.index is not None:
            batch.cells.setdefault(held, {})[self.key] = update.index.encode()
        else:
            batch.deleted.setdefault(held, []).append(self.key)
        for first, events in update.appended.items():
            batch.appends[self.events_key(first)] = event_lines(events)
        for first, events in update.written.items():
            batch.strings[self.events_key(first)] = event_lines(events)
        batch.dropped.extend(self.events_key(first) for first in update.removed)
        for bucket, sessions in update.buckets.items():
            for plan, state in self.plans.bucket_states(sessions):
                name = cell_key(self.topic, self.partition, plan.name, plan.version, bucket)
                if state is None:
                    batch.deleted.setdefault(name, []).append(self.key)
                else:
                    batch.cells.setdefault(name, {})[self.key] = encode_state(state)


def _merged_cells(
    metrics: Sequence[MetricPlan],
    groups: Sequence[Mapping[tuple[int, tuple[str, ...]], Sequence[InputFields]]],
    wanted: Mapping[str, Sequence[tuple[bytes, int, tuple[int, tuple[str, ...]]]]],
    stored: Mapping[str, Sequence[bytes | None]],
) -> dict[str, dict[bytes, bytes]]:
    """Build each touched (cell, key) state once, from its group of inputs, and merge it
    into the stored one."""
    values_of = itemgetter(1)
    items_of = itemgetter(2)
    out: dict[str, dict[bytes, bytes]] = {}
    for name, fields in wanted.items():
        cell: dict[bytes, bytes] = {}
        for (encoded, index, slot), previous in zip(fields, stored[name], strict=True):
            group = groups[index][slot]
            metric = metrics[index]
            kinds = metric.kinds
            state = fold_inputs(
                kinds,
                None if previous is None else decode_state(previous),
                None if metric.value is None else list(map(values_of, group)),
                list(zip(*map(items_of, group), strict=True)) if kinds else [],
                len(group),
            )
            cell[encoded] = encode_state(state)
        out[name] = cell
    return out
