"""What the speed layer knows of the batch view: the served row, re-read every
`watermark_refresh_s` — W per metric (rule 2's second clause), `rebuild_from` per partition
(where a rebuild starts, rule 9) — and when each W was first seen, so cleanup deletes only
cells below a W served for longer than any request may take (rule 8)."""

from __future__ import annotations

import time

from shared.config import Settings
from shared.db.connect import connect
from shared.db.served import ServedView, read_served


class ServedState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.served: ServedView | None = None
        self.watermarks: dict[str, int | None] = {m: None for m in settings.plans}
        self._seen: dict[str, list[tuple[float, int]]] = {}

    def refresh(self) -> None:
        """Re-read the served row (W of each metric's current version, `rebuild_from`)."""
        with connect(self.settings.postgres.url, autocommit=True) as conn:
            served = read_served(conn)
        watermarks = {
            m.name: None if served is None else served.watermark(m.name, m.version)
            for m in self.settings.plans.values()
        }
        now = time.monotonic()
        for name, w in watermarks.items():
            seen = self._seen.setdefault(name, [])
            if w is not None and (not seen or seen[-1][1] != w):
                seen.append((now, w))
        self.served, self.watermarks = served, watermarks

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
