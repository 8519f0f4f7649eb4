"""The speed worker: Faust consumes (consumer group, assignment, rebalancing, offset commits);
each fetched batch of a partition goes to its source's `SourceProcessor` and is applied to
Redis in one fenced Lua call before its offsets may be committed (rule 3).

Steps, by name:
- `position_of` — where a partition is read from: its fence + 1; with no fence (never applied,
  or Redis lost it) its `rebuild_from` from the served row (0 before any batch run).
- `apply_batch` — decide and apply one partition's batch; on a failed compare-and-set forget
  the fence and reposition the partition (the records fetched from the old position are
  dropped by the consumer); on a lost epoch `start_rebuild`.
- `start_rebuild` — rule 9: a new epoch, every owned partition marked in `lp:rebuilding` until
  it is read back to where it was, positioned at `rebuild_from` with empty state.
- `ServedState.refresh` — W per metric and `rebuild_from`, re-read every `watermark_refresh_s`.
- `cleanup` — rule 8: cells ending at or before a W served for `cleanup_delay_s`, and de-dup
  id sets late for every metric, deleted for the partitions this worker owns.
- `retry_delay` — a store went away: nothing is committed that Redis does not hold, the
  worker keeps its partitions and retries with a capped backoff (`speed.outage_backoff_s` up
  to `speed.outage_backoff_max_s`), logging once when a store goes down and once when it is
  back, and setting `speed_degraded{cause}` meanwhile. Redis down: batches are not applied
  and partitions are re-read from their fences once it answers (rule 3 makes the retry
  exact). PostgreSQL down: only W stops being refreshed; the last one is used. Kafka down
  (dead letters, late events): like Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import faust
import psycopg
from confluent_kafka import KafkaException
from faust.types import TP
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.backoff import Backoff
from shared.config import Settings
from shared.faults import fault_point
from shared.gc_tuning import collector_paused, freeze_startup_objects
from shared.kafka import check_topics, faust_credentials
from shared.speed_view import (
    APPLIED,
    EPOCH_LOST,
    FENCE_MOVED,
    REDIS_FAILURES,
    Fence,
    PartitionStall,
    SpeedViewWriter,
    ensure_epoch,
    rebuild_member,
    redis_client,
)
from speed_layer.cleanup import expired_keys
from speed_layer.consumer import BatchConsumer, BatchTransport
from speed_layer.errors import ServedRowUnavailable, SideTopicError, TableFeedError
from speed_layer.metrics import CAUSES, SpeedMetrics
from speed_layer.processor import (
    BatchOutcome,
    KafkaRecord,
    SourcePlan,
    SourceProcessor,
    isolate_failures,
)
from speed_layer.rejoin import rejoin_partition, rejoined_plan
from speed_layer.served_state import ServedState
from speed_layer.side_topics import SideTopicPublisher
from speed_layer.tables import TableDeadLetters, TableFeeds, oldest_joined_w

log = logging.getLogger(__name__)


class SpeedWorker:
    """One worker: positions partitions, applies batches, rebuilds, cleans up, around the
    Faust app it builds. Its parts: the processors (`processor`), the view writer
    (`shared.speed_view`), the side-topic publisher (`side_topics`), the served row
    (`served_state`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        speed = settings.speed
        # One immediate retry (a pooled connection Redis closed on restart); the worker's
        # own backoff does the rest.
        self.redis = redis_client(
            settings.redis,
            socket_timeout=speed.redis_timeout_s,
            socket_connect_timeout=min(2.0, speed.redis_timeout_s),
            retry=Retry(NoBackoff(), 1),
        )
        self.store = SpeedViewWriter(self.redis, speed.ttl_days * 86_400)
        self.side_topics = SideTopicPublisher(settings)
        self.metrics = SpeedMetrics()
        self.backoffs = {
            cause: Backoff(
                cause,
                speed.outage_backoff_s,
                speed.outage_backoff_max_s,
                log,
                on_change=self.metrics.degraded.labels(cause).set,
                on_failure=self.metrics.store_failures.labels(cause).inc,
            )
            for cause in CAUSES
        }
        self.epoch = ""
        """Rule 9's epoch marker the view this worker writes belongs to (set by `start`)."""
        self.served = ServedState(settings, self.backoffs["postgres"])
        self.tables = TableFeeds(settings, self.metrics.registry)
        self.table_dead_letters = TableDeadLetters(settings, self.side_topics.publish_rejected)
        self.joined_by_source = {
            source.topic: {
                lookup.table.name: None
                for plan in settings.plans_of(source)
                for lookup in plan.lookups
            }
            for source in settings.sources
        }
        """Source topic -> the tables its metrics join."""
        self.processors = {
            source.topic: SourceProcessor(
                settings, source, self.store, self.side_topics.publish_rejected
            )
            for source in settings.sources
        }
        self.rebuilding: dict[TP, int] = {}
        self.rejoining: dict[TP, set[str]] = {}
        """Partitions whose cells are to be joined anew, with the tables that received a late
        version (rule 11; `speed_layer.rejoin`)."""
        self.stalls: dict[TP, float] = {}
        """Partitions whose last batch failed, since when (epoch seconds)."""
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.app = self._build_app()

    # -- positioning, apply, rebuild ----------------------------------------------------------

    @property
    def consumer(self) -> BatchConsumer:
        return self.app.consumer  # type: ignore[return-value]

    async def position_of(self, tp: TP) -> int:
        """Fence + 1, or `rebuild_from` when the partition has no fence (rule 3, rule 9) or
        its fence was written with other metric definitions (rule 7: every cell of the
        partition is rebuilt with empty state under the current versions, and its de-dup ids
        are dropped so the replay counts every event once). When a table its metrics join
        received a late version that changes a join the speed view counted (rule 11), the
        cells of the metrics joining it are recomputed first (`rejoin_cells`)."""
        processor = self.processors[tp.topic]
        processor.forget(tp.partition)
        fence = processor.fence(tp.partition)
        member = rebuild_member(tp.topic, tp.partition)
        until = self.store.rebuild_until(member)
        tables = self.rejoining.pop(tp, set()) | self.store.pending_rejoin(member)
        redefined = fence.defs not in (None, processor.defs)
        if tables and not redefined:
            rejoined = rejoined_plan(processor.plan, tables)
            if fence.offset is not None and rejoined.metrics:
                await self.rejoin_cells(tp, fence, rejoined)
                fence = processor.fence(tp.partition)
            else:  # no cell joins the tables, or none is stored yet
                self.store.finish_rejoin(member)
        if fence.offset is not None and redefined:
            until = max(until or 0, fence.offset + 1)
            self.store.start_rebuild({member: until})
            doomed = self.store.partition_keys(tp.topic, tp.partition, processor.metrics)
            self.store.delete_keys(doomed)
            processor.forget(tp.partition)
            fence = processor.fence(tp.partition)
            self.store.finish_rejoin(member)
            self.metrics.rebuilds.inc()
            log.warning(
                "event=rebuild_partition reason=metric_definitions topic=%s partition=%d until=%d",
                tp.topic,
                tp.partition,
                until,
            )
        if fence.offset is not None:
            target = fence.offset + 1
            # The partition's cells joined the tables up to its stream time, whichever worker
            # applied them: a version valid before it is late for them too (rule 11).
            self.tables.joined(self.joined_by_source[tp.topic], fence.stream_time)
        else:
            await asyncio.to_thread(self.served.refresh)
            if not self.served.loaded:
                raise ServedRowUnavailable(
                    f"{tp.topic}[{tp.partition}] has no fence, and where it is read from "
                    "(rebuild_from) is in PostgreSQL, which has not answered yet; retrying"
                )
            target = self.served.rebuild_from(tp.topic, tp.partition)
            committed = self.consumer._committed_offset.get(tp)
            if until is None and committed is not None and committed > target:
                until = committed
                self.store.start_rebuild({member: until})
                self.metrics.rebuilds.inc()
                log.warning(
                    "event=rebuild_partition topic=%s partition=%d from=%d until=%d",
                    tp.topic,
                    tp.partition,
                    target,
                    until,
                )
        if until is not None:
            if target >= until:
                self.store.finish_rebuild(member)
                self.rebuilding.pop(tp, None)
            else:
                self.rebuilding[tp] = until
        if tp not in self.stalls:  # a stall another worker (or this one's past) left behind
            self.store.clear_stall(member)
        log.info("event=position topic=%s partition=%d offset=%d", tp.topic, tp.partition, target)
        self.backoffs["redis"].recovered()
        return target

    async def apply_batch(self, tp: TP, records: Sequence[KafkaRecord]) -> None:
        """Decide and apply one partition's batch; no await inside, so a stop or a rebalance
        never lands between the Redis apply and the offset it allows to commit."""
        processor = self.processors[tp.topic]
        started = time.perf_counter()
        watermarks, seeds = self.served.watermarks, self.served.seeds
        joined = self.joined_by_source[tp.topic]
        tables = self.tables.joins if joined else None

        def process(batch: Sequence[KafkaRecord], unprocessable: str | None) -> BatchOutcome:
            return processor.process(tp.partition, batch, watermarks, unprocessable, tables, seeds)

        try:
            if joined:
                self.tables.catch_up()
                if self.rejoin(self.tables.take_rejoins()) and tp in self.rejoining:
                    return  # the batch is read again once the partition is rebuilt
            with collector_paused():  # see `tune_gc`
                outcomes = isolate_failures(records, process, _transient)
        except Exception as exc:
            self.note_stall(tp, exc)
            raise
        fence = processor.known_fence(tp.partition)
        if joined and fence is not None:
            self.tables.joined(joined, fence.stream_time)
        if tp in self.stalls:
            self.clear_stall(tp)
        for cause in ("redis", "kafka", "error"):
            self.backoffs[cause].recovered()
        for outcome in outcomes:
            self._account(tp, outcome, started)

    def rejoin(self, tables: set[str]) -> bool:
        """Join the owned partitions of the sources joining `tables` anew (rule 11: a late
        table version changed a join the speed view counted): noted in Redis, so a new owner
        finishes the job, and done as each is positioned again; whether any is to be."""
        if not tables:
            return False
        owned = {
            tp: tables & set(self.joined_by_source[tp.topic]) for tp in self.consumer.assignment()
        }
        owned = {tp: joined for tp, joined in owned.items() if joined}
        self.store.mark_rejoin(
            {rebuild_member(tp.topic, tp.partition): t for tp, t in owned.items()}
        )
        for tp, joined in owned.items():
            self.rejoining.setdefault(tp, set()).update(joined)
        self.consumer.reposition(owned)
        log.warning("event=rejoin tables=%s partitions=%s", sorted(tables), sorted(map(str, owned)))
        return bool(owned)

    async def rejoin_cells(self, tp: TP, fence: Fence, plan: SourcePlan) -> None:
        """`rejoin_partition` (rule 11), counted and logged."""
        started = time.perf_counter()
        member = rebuild_member(tp.topic, tp.partition)
        await asyncio.to_thread(self.served.refresh)
        if not self.served.loaded:
            raise ServedRowUnavailable(
                f"{tp.topic}[{tp.partition}] is to be joined anew from rebuild_from, which is "
                "in PostgreSQL, which has not answered yet; retrying"
            )
        self.tables.catch_up()
        watermarks = self.served.watermarks
        start = self.served.rebuild_from(tp.topic, tp.partition)
        known = [w for m in self.processors[tp.topic].metrics if (w := watermarks.get(m.name))]
        status, records = await rejoin_partition(
            self.settings,
            self.store,
            tp.partition,
            fence,
            plan,
            start,
            min(known, default=None),
            watermarks,
            self.tables.joins,
            self.served.seeds,
        )
        self.metrics.rejoined_records.labels(tp.topic).inc(records)
        if status != APPLIED:
            self._not_applied(tp, status)
            return
        self.store.finish_rejoin(member)
        log.warning(
            "event=rejoin_partition topic=%s partition=%d metrics=%s records=%d seconds=%.2f",
            tp.topic,
            tp.partition,
            ",".join(m.name for m in plan.metrics),
            records,
            time.perf_counter() - started,
        )

    def _account(self, tp: TP, outcome: BatchOutcome, started: float) -> None:
        """Count an outcome, let its offsets be committed, or act on its failed apply."""
        metrics = self.metrics
        if outcome.status == APPLIED:
            metrics.apply_seconds.observe(time.perf_counter() - started)
            metrics.events.labels(tp.topic).inc(outcome.records)
            if outcome.duplicates:
                metrics.duplicates.labels(tp.topic).inc(outcome.duplicates)
            for name, n in outcome.late_by_metric.items():
                metrics.late.labels(name).inc(n)
            for item in outcome.dead_letters:
                metrics.dead_letters.labels(tp.topic, item.why).inc()
            for (name, reason), n in outcome.skipped.items():
                metrics.skipped.labels(name, reason).inc(n)
            fault_point("after_redis_apply_before_commit")
            if outcome.fence.offset is not None:
                self.consumer.mark_applied(tp, outcome.fence.offset + 1)
                until = self.rebuilding.get(tp)
                if until is not None and outcome.fence.offset + 1 >= until:
                    self.store.finish_rebuild(rebuild_member(tp.topic, tp.partition))
                    del self.rebuilding[tp]
                    log.info("event=rebuild_done topic=%s partition=%d", tp.topic, tp.partition)
        else:
            self._not_applied(tp, outcome.status)

    def _not_applied(self, tp: TP, status: int) -> None:
        """An apply of `tp` found its fence moved (another worker wrote since: re-read from
        the fence) or gone (Redis lost the view: rebuild)."""
        if status == FENCE_MOVED:
            self.metrics.fence_conflicts.labels(tp.topic).inc()
            self.consumer.reposition([tp])
        elif status == EPOCH_LOST:
            self.start_rebuild()

    def note_stall(self, tp: TP, error: BaseException) -> None:
        """A batch of `tp` failed: from now until one is applied the partition is stalled,
        shown by `speed_partition_stalled` and, unless Redis is what failed, in the speed
        view's stall list that `/v1/status` and `/readyz` report."""
        since = self.stalls.setdefault(tp, time.time())
        self.metrics.stalled.labels(tp.topic, str(tp.partition)).set(1)
        cause = cause_of(error)
        if cause == "redis":
            return
        stall = PartitionStall(
            cause, f"{type(error).__name__}: {error}"[:500], int(since * 1000), self.worker_id
        )
        with contextlib.suppress(*REDIS_FAILURES):
            self.store.report_stall(rebuild_member(tp.topic, tp.partition), stall)

    def clear_stall(self, tp: TP) -> None:
        self.store.clear_stall(rebuild_member(tp.topic, tp.partition))
        self.stalls.pop(tp, None)
        self.metrics.stalled.labels(tp.topic, str(tp.partition)).set(0)

    def epoch_lost(self) -> bool:
        """True when the epoch marker is gone or replaced: Redis lost the speed view."""
        return self.store.epoch() != self.epoch

    def start_rebuild(self) -> None:
        """Rule 9: the epoch marker vanished, so Redis lost the speed view. Rebuild every owned
        partition from `rebuild_from` with empty state, marked `rebuilding` until it is read
        back to where this worker was. The new epoch is adopted only once the rebuild is marked:
        if Redis fails half-way, the next check finds the epoch still changed and starts
        again."""
        epoch = ensure_epoch(self.redis, uuid.uuid4().hex)
        self.served.refresh()
        consumer = self.consumer
        members: dict[str, int] = {}
        owned = consumer.assignment()
        for tp in owned:
            self.processors[tp.topic].forget(tp.partition)
            reached = max(consumer._applied.get(tp, 0), consumer._read_offset.get(tp) or 0)
            target = self.served.rebuild_from(tp.topic, tp.partition)
            if reached > target:
                members[rebuild_member(tp.topic, tp.partition)] = reached
        self.store.start_rebuild(members)
        self.epoch = epoch
        self.metrics.rebuilds.inc()
        log.warning("event=rebuild_started epoch=%s partitions=%s", self.epoch, sorted(members))
        consumer.reposition(owned)

    def reseed_idle(self) -> None:
        """Continue the owned partitions' session metrics from a newly served run (rule 13)
        without waiting for their next batch, which would do it first: until then their
        speed sessions after W may hold events the run's sessions hold. Runs on the event
        loop between batches, like `apply_batch`, so no batch is decided across it; a Redis
        failure is counted, never raised."""
        seeds = self.served.seeds
        backoff = self.backoffs["redis"]
        if not seeds or not backoff.due():
            return
        try:
            for tp in sorted(self.consumer.assignment()):
                status = self.processors[tp.topic].reseed(tp.partition, seeds)
                if status != APPLIED:
                    self._not_applied(tp, status)
                    return
        except REDIS_FAILURES as exc:
            backoff.failed(exc)

    # -- riding out outages --------------------------------------------------------------

    def retry_delay(self, error: BaseException) -> float:
        """The consumer's `retry_delay`: an apply or a positioning failed. Counts it against
        the store that failed and returns the backoff; an unexpected error is logged in full
        every time (it is a bug, not an outage) and retried the same way."""
        cause = cause_of(error)
        if cause == "error":
            log.error("event=apply_failed: retrying from the fences", exc_info=error)
        return self.backoffs[cause].failed(error)

    def check_epoch(self) -> None:
        """Rule 9's check (and the rebuild it may start), skipped while Redis is being backed
        off from; a Redis failure is counted, never raised."""
        backoff = self.backoffs["redis"]
        if not backoff.due():
            return
        try:
            if self.epoch_lost():
                self.start_rebuild()
        except REDIS_FAILURES as exc:
            backoff.failed(exc)

    # -- housekeeping ------------------------------------------------------------------------

    def cleanup(self, owned: set[TP]) -> tuple[int, int]:
        """Delete what the batch serves of the owned partitions (`expired_keys`). Returns
        (cells, id sets)."""
        cells, id_sets = expired_keys(owned, self.processors, self.served, self.store)
        if cells:
            self.store.delete_keys(cells)
        if id_sets:
            self.store.delete_keys(id_sets)
        return len(cells), len(id_sets)

    def report_lag(self) -> None:
        consumer = self.consumer
        for tp in consumer.assignment():
            try:
                end = consumer.highwater(tp)
            except Exception:
                continue
            position = consumer._applied.get(tp)
            if end is not None and position is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(end - position, 0))

    # -- the Faust app ---------------------------------------------------------------------

    def _build_app(self) -> faust.App:
        speed = self.settings.speed
        faust_dir = self.settings.stack.data_dir / "faust"
        faust_dir.mkdir(parents=True, exist_ok=True)
        app = faust.App(
            speed.app_id,
            broker=f"kafka://{self.settings.kafka.bootstrap_servers}",
            broker_credentials=faust_credentials(self.settings.kafka),
            value_serializer="raw",
            key_serializer="raw",
            store="memory://",
            datadir=str(faust_dir / speed.app_id),
            web_enabled=False,
            broker_session_timeout=speed.session_timeout_s,
            broker_rebalance_timeout=speed.rebalance_timeout_s,
            broker_heartbeat_interval=max(speed.session_timeout_s / 6, 0.5),
            broker_max_poll_records=speed.max_poll_records,
            consumer_max_fetch_size=speed.max_partition_fetch_bytes,
            broker_commit_interval=1.0,
            consumer_auto_offset_reset="earliest",
            topic_allow_declare=False,
            topic_disable_leader=True,
        )
        app.transport = BatchTransport(app.conf.broker_consumer, app)
        for source in self.settings.sources:
            app.topics.add(app.topic(source.topic, value_serializer="raw", key_serializer="raw"))

        @app.on_partitions_revoked.connect
        def on_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            revoked: set[TP] = args[0]
            for tp in revoked:
                self.processors[tp.topic].forget(tp.partition)
                self.rebuilding.pop(tp, None)
            log.info("event=revoked partitions=%s", sorted(map(str, revoked)))

        @app.on_partitions_assigned.connect
        def on_assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            assigned: set[TP] = args[0]
            for tp in assigned:
                self.processors[tp.topic].forget(tp.partition)
            self.consumer.reposition(assigned)
            log.info("event=assigned partitions=%s", sorted(map(str, assigned)))

        # A timer that raises ends the worker (Faust crashes the app): neither may.
        @app.timer(interval=speed.watermark_refresh_s)
        async def refresh_timer() -> None:
            await asyncio.to_thread(self.served.refresh)
            self.report_lag()
            self.check_epoch()
            self.reseed_idle()
            self.tables.prune(oldest_joined_w(self.settings, self.served.watermarks))
            self.follow_tables()
            await asyncio.to_thread(self.publish_table_dead_letters)

        @app.timer(interval=speed.cleanup_interval_s)
        async def cleanup_timer() -> None:
            owned = set(self.consumer.assignment())
            if owned and not self.backoffs["redis"].down:
                try:
                    cells, id_sets = await asyncio.to_thread(self.cleanup, owned)
                except REDIS_FAILURES as exc:
                    self.backoffs["redis"].failed(exc)
                    return
                if cells or id_sets:
                    self.metrics.cleaned_keys.labels("cell").inc(cells)
                    self.metrics.cleaned_keys.labels("ids").inc(id_sets)
                    log.info("event=cleanup cells=%d id_sets=%d", cells, id_sets)

        return app

    def start(self) -> None:
        self.metrics.serve(self.settings.speed.metrics_port)
        self.epoch = self.adopt_epoch()
        self.served.refresh()
        self.catch_up_tables()
        consumer = self.consumer
        consumer.handler = self.apply_batch
        consumer.position_of = self.position_of
        consumer.retry_delay = self.retry_delay

    def follow_tables(self) -> None:
        """Read the joined tables' new versions while no batch comes (a late one rebuilds the
        partitions joining it, rule 11); a Kafka failure is retried at the next call."""
        try:
            self.tables.catch_up()
        except TableFeedError as exc:
            self.backoffs["kafka"].failed(exc)
            return
        self.rejoin(self.tables.take_rejoins())

    def publish_table_dead_letters(self) -> None:
        """The invalid table records read since the last call, to `<table>.dlq` (rule 11);
        a Kafka failure is retried at the next call."""
        backoff = self.backoffs["kafka"]
        try:
            published = self.table_dead_letters.drain()
        except (TableFeedError, SideTopicError) as exc:
            backoff.failed(exc)
            return
        if published:
            self.metrics.dead_letters.labels("tables", "table_record").inc(published)
            log.info("event=table_dead_letters records=%d", published)

    def catch_up_tables(self) -> None:
        """Read every joined table to its end before the first batch (rule 11), waiting out a
        Kafka outage with the backoff."""
        backoff = self.backoffs["kafka"]
        while True:
            try:
                read = self.tables.catch_up()
            except TableFeedError as exc:
                time.sleep(backoff.failed(exc))
                continue
            backoff.recovered()
            log.info("event=tables_read records=%d tables=%s", read, sorted(self.tables.tables))
            return

    def adopt_epoch(self) -> str:
        """The speed view's epoch marker (a new one when Redis holds none), waited for with
        the outage backoff: a worker started while Redis is down waits for it, saying so once
        and in `speed_degraded{cause="redis"}`, instead of exiting (a supervisor restarting it
        would only crash-loop)."""
        backoff = self.backoffs["redis"]
        while True:
            try:
                epoch = ensure_epoch(self.redis, uuid.uuid4().hex)
            except REDIS_FAILURES as exc:
                time.sleep(backoff.failed(exc))
                continue
            backoff.recovered()
            return epoch


def _transient(error: BaseException) -> bool:
    """Whether a failed batch is retried as it is (a store failed), rather than narrowed down
    to the records that make it fail (`isolate_failures`)."""
    return cause_of(error) != "error"


def cause_of(error: BaseException) -> str:
    """Which store a failed apply or positioning points at (one of `metrics.CAUSES`)."""
    if isinstance(error, REDIS_FAILURES):
        return "redis"
    if isinstance(error, psycopg.Error | ServedRowUnavailable):
        return "postgres"
    if isinstance(error, SideTopicError | TableFeedError | KafkaException):
        return "kafka"
    return "error"


def tune_gc() -> None:
    """Keep CPython's cyclic garbage collector out of the hot path (with `apply_batch`,
    which pauses it while a batch is decided and applied).

    Every batch allocates a dict and a few tuples per event (and aiokafka a record object per
    event), all alive until the batch is applied. With the default thresholds a young
    collection runs every 700 allocations and walks the batch's objects again and again as
    they age, and older collections walk every object Faust, aiokafka and the imports
    created; profiled, that was about 40% of a worker's CPU time. A batch's objects hold no
    cycles (reference counting frees them when the batch is done), so: freeze what startup
    built (never scanned again), collect the young generation every 50,000 allocations, and
    pause collection for the duration of a batch."""
    freeze_startup_objects(50_000)


def run_worker(settings: Settings) -> None:
    """`lambdactl speed`: one worker of the consumer group; N workers share the partitions.
    SIGTERM/SIGINT stop it cleanly: the batch in hand is applied, offsets are committed."""
    check_topics(settings)
    sys.setswitchinterval(settings.speed.gil_switch_interval_s)
    # Faust sets logging up once it runs; what `start` logs before (the tables read) is kept.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] %(message)s")
    worker_state = SpeedWorker(settings)
    worker_state.start()
    tune_gc()
    faust.Worker(worker_state.app, loglevel="INFO").execute_from_commandline()
