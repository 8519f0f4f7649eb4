"""The Faust app: consumption, partition assignment, rebalancing and offset commits are Faust's;
each batch (`stream.take_events`) goes to the source's `SourceProcessor` (the semantics) and is
applied to Redis in one fenced Lua call before Faust may commit its offsets (rule 3)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence

import faust
import redis
from confluent_kafka import Producer

from shared.config import Settings
from shared.db.connect import connect
from shared.db.served import read_served
from shared.faults import fault_point
from shared.kafka import check_topics
from shared.speed_store import EPOCH_LOST, FENCE_MOVED, SpeedStore, ensure_epoch
from speed_layer.processor import RawRecord, Rejected, SourceProcessor

log = logging.getLogger(__name__)


class SpeedWorker:
    """Holds the worker's resources (Redis, producer, W) and builds the Faust app around them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis.url)
        self.store = SpeedStore(self.redis, settings.speed.ttl_days * 86_400)
        self.producer = Producer(
            {"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5}
        )
        self.epoch = ensure_epoch(self.redis, uuid.uuid4().hex)
        self.watermarks: dict[str, int | None] = {}
        self.processors = {
            source.topic: SourceProcessor(settings, source, self.store, self.publish_rejected)
            for source in settings.sources
        }
        self.app = self._build_app()

    def publish_rejected(
        self, topic: str, partition: int, dead: Sequence[Rejected], late: Sequence[Rejected]
    ) -> None:
        """Dead letters and late events, keyed `topic:partition:offset` so replays dedupe."""
        for target, rejected, header in ((".dlq", dead, "reason"), (".late", late, "metrics")):
            for item in rejected:
                self.producer.produce(
                    topic + target,
                    key=f"{topic}:{partition}:{item.offset}",
                    value=item.value,
                    partition=partition,
                    headers=[(header, item.why.encode())],
                )
        if dead or late:
            self.producer.flush(10)

    def refresh_watermarks(self) -> None:
        """W per metric (rule 2's second clause), re-read every few seconds."""
        with connect(self.settings.postgres.url, autocommit=True) as conn:
            served = read_served(conn)
        self.watermarks = {
            m.name: None
            if served is None
            else served.watermark(m.name, self.settings.metric_version(m))
            for m in self.settings.metrics
        }

    def _build_app(self) -> faust.App:
        speed = self.settings.speed
        app = faust.App(
            speed.app_id,
            broker=f"kafka://{self.settings.kafka.bootstrap_servers}",
            value_serializer="raw",
            key_serializer="raw",
            store="memory://",
            web_enabled=False,
            broker_session_timeout=speed.session_timeout_s,
            broker_heartbeat_interval=max(speed.session_timeout_s / 6, 0.5),
            consumer_auto_offset_reset="earliest",
            topic_allow_declare=False,
            topic_disable_leader=True,
        )
        for source in self.settings.sources:
            topic = app.topic(source.topic, value_serializer="raw", key_serializer="raw")
            app.agent(topic, name=f"speed-{source.name}")(self._agent_for(source.topic))

        @app.timer(interval=speed.watermark_refresh_s)
        async def watermark_timer() -> None:
            await asyncio.to_thread(self.refresh_watermarks)

        @app.task
        async def on_start() -> None:
            await asyncio.to_thread(self.refresh_watermarks)

        return app

    def _agent_for(self, topic: str):  # type: ignore[no-untyped-def]
        processor = self.processors[topic]
        speed = self.settings.speed

        async def agent(stream: faust.Stream) -> None:
            async for events in stream.take_events(speed.take_max, within=speed.take_within_s):
                by_partition: dict[int, list[RawRecord]] = defaultdict(list)
                for event in events:
                    message = event.message
                    by_partition[message.partition].append(
                        RawRecord(message.offset, round(message.timestamp * 1000), message.value)
                    )
                for partition, records in by_partition.items():
                    outcome = processor.process(self.epoch, partition, records, self.watermarks)
                    if outcome.status == EPOCH_LOST:
                        raise RuntimeError(
                            "Redis lost the speed view (epoch marker gone); restart the worker "
                            "to rebuild it"
                        )
                    if outcome.status == FENCE_MOVED:
                        await self._seek_to_fence(topic, partition)
                fault_point("after_redis_apply_before_commit")

        return agent

    async def _seek_to_fence(self, topic: str, partition: int) -> None:
        fence = self.store.read_fence(topic, partition)
        target = 0 if fence.offset is None else fence.offset + 1
        tp = faust.types.TP(topic, partition)
        await self.app.consumer.seek(tp, target)


def run_worker(settings: Settings) -> None:
    """`lambdactl speed`: one worker of the consumer group; N workers share the partitions."""
    check_topics(settings)
    worker_state = SpeedWorker(settings)
    faust.Worker(worker_state.app, loglevel="INFO").execute_from_commandline()
