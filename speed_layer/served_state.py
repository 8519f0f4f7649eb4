"""What the speed layer knows of the batch view: the served row, re-read every
`watermark_refresh_s` — W per metric (rule 2's second clause), `rebuild_from` per partition
(where a rebuild starts, rule 9) and, for each session metric, the sessions its keys continue
from (rule 13), read with the row in one snapshot — and when each W was first seen, so cleanup
deletes only cells below a W served for longer than any request may take (rule 8). The row
is read where the API reads it (`Settings.batch_view_url`: a streaming replica, or the
primary), so a W counts as served only once the API can see it.

The worker needs only the last row it read: while PostgreSQL is unreachable no run can
publish, so that row is still the served one. The worker keeps it (lateness keeps using its
W) and re-reads it with a capped backoff instead of failing."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import psycopg

from shared.backoff import Backoff
from shared.config import Settings
from shared.db.connect import connect
from shared.db.served import ServedView, read_served
from shared.db.sessions import boundary_sessions
from shared.speed_view.held import SessionPlans
from speed_layer.sessions import SessionSeeds

log = logging.getLogger(__name__)


class ServedState:
    def __init__(self, settings: Settings, backoff: Backoff | None = None) -> None:
        self.settings = settings
        speed = settings.speed
        self.backoff = backoff or Backoff(
            "postgres", speed.outage_backoff_s, speed.outage_backoff_max_s, log
        )
        self.served: ServedView | None = None
        self.loaded = False
        """Whether the row was ever read (None then means: no batch run has published yet)."""
        self.watermarks: dict[str, int | None] = {m: None for m in settings.plans}
        self.seeds: dict[str, SessionSeeds] = {}
        """Per session metric, what the served run gives its keys to continue from."""
        self._seen: dict[str, list[tuple[float, int]]] = {}

    def refresh(self) -> bool:
        """Re-read the served row (W of each metric's current version, `rebuild_from`); False
        when PostgreSQL could not be read (or is being backed off from): the last row stays."""
        if not self.backoff.due():
            return False
        try:
            with connect(self.settings.batch_view_url) as conn:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                served = read_served(conn)
                watermarks = {
                    m.name: None if served is None else served.watermark(m.name, m.version)
                    for m in self.settings.plans.values()
                }
                seeds = self._seeds(conn, served, watermarks)
        except psycopg.Error as exc:
            self.backoff.failed(exc)
            return False
        self.backoff.recovered()
        now = time.monotonic()
        for name, w in watermarks.items():
            seen = self._seen.setdefault(name, [])
            if w is not None and (not seen or seen[-1][1] != w):
                seen.append((now, w))
        self.served, self.watermarks, self.seeds, self.loaded = served, watermarks, seeds, True
        return True

    def _seeds(
        self,
        conn: psycopg.Connection[Any],
        served: ServedView | None,
        watermarks: Mapping[str, int | None],
    ) -> dict[str, SessionSeeds]:
        """Each session metric's seeds from the served run (those already read are kept)."""
        seeds: dict[str, SessionSeeds] = {}
        if served is None:
            return seeds
        row = conn.execute("SELECT xmin::text FROM served_view WHERE id = 1").fetchone()
        assert row is not None, "the served row was read in this transaction"
        stamp = str(row[0])
        plans = self.settings.plans
        for plan in plans.values():
            watermark = watermarks.get(plan.name)
            if not plan.holds_sessions or watermark is None:
                continue
            known = self.seeds.get(plan.name)
            if known is not None and known.stamp == stamp:
                seeds[plan.name] = known
                continue
            part = SessionPlans.of(plan, plans.values()).sessions
            by_key = boundary_sessions(conn, served.generation, plan, part, watermark)
            seeds[plan.name] = SessionSeeds(stamp, watermark, by_key)
        return seeds

    def rebuild_from(self, topic: str, partition: int) -> int:
        """Where a partition is read from when Redis holds nothing of it (0 before any run)."""
        if self.served is None:
            return 0
        return int(self.served.rebuild_from.get(topic, {}).get(str(partition), 0))

    def safe_watermark(self, metric: str) -> int | None:
        """The largest W of `metric` served for at least `cleanup_delay_s` (rule 8)."""
        delay = self.settings.speed.cleanup_delay_s
        now = time.monotonic()
        ready = [w for seen_at, w in self._seen.get(metric, []) if now - seen_at >= delay]
        return max(ready, default=None)
