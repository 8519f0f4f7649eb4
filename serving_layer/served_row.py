"""The served row as the API knows it: one metric's view of it (`ServedRow`), the row last
seen per metric (`ServedHints`), and the row held in memory (`HeldServedRow`, issue #50):
each API process keeps the row it last read and plans requests against it instead of reading
it in every request, since the row changes only when a batch run publishes (rule 6 in
docs/semantics.md) and every write of it is announced.

- **Announcements.** A trigger on `served_view` sends `NOTIFY lp_served` with the row's new
  stamp from whatever writes it (migration 0010; `shared.db.served.CHANNEL`), delivered at
  commit. A background task `LISTEN`s on a connection of its own to the primary (a standby
  neither sends nor takes notifications) and re-reads the row where requests read it
  (`Settings.batch_view_url`, through the query pool) after each one, until it finds the
  announced stamp: a streaming replica may replay the publication later than the primary
  announces it, and until then requests read the row themselves, as before.
- **Safety net.** The row is re-read every `serving.served_refresh_s` as well, and a lost
  `LISTEN` connection is made again (after `_RECONNECT_S`, doubling up to `_RECONNECT_MAX_S`),
  the row re-read once `LISTEN` is in place: a publication committed while no one listened is
  in that read, any later one is announced.
- **Confirmed** (`serving.served_row_confirm`, the default). A request using the held row
  waits for one `SELECT 1` on the `LISTEN` connection sent after it arrived, shared by every
  request arriving meanwhile (at most one in flight; those arriving during it share the next).
  PostgreSQL signals the listening backends before it tells the publisher its commit is done,
  and a backend sends the notifications it was signalled for before it answers its next
  statement: once that `SELECT 1` is answered, every publication committed before the
  request arrived has been heard. So an answer reflects them all, as when each request read
  the row itself, for one round trip without a pool connection, most of a hundred requests
  in flight sharing it. Unconfirmed, a request uses the held row with no round trip at all,
  and an answer may lag a publication by its announcement's delivery (microseconds at the
  median, a few milliseconds at worst measured on the local stack).
- **When requests use it** (`row_for`): a read of it succeeded, no announcement or request
  has said it changed since (a request whose statement finds another row says so:
  `contradicted`), nothing unread waits on the `LISTEN` connection (one `select`, no round
  trip) and the statement that read it was sent less than `fresh_for_s` ago — twice the
  refresh period, and at most half of `speed.cleanup_delay_s`, which bounds how long the speed
  cells after its W are still there (the exactness argument: `BatchViewReader.guarded`).
  Otherwise a request reads the row in its own statement, as it did before the row was held.

Every read also refreshes the rows `ServedHints` keeps per metric (the W last read, which
rule 12 answers from while PostgreSQL is unreachable), dated when its statement was sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import select
import threading
import time
from typing import Any, NamedTuple

import psycopg
from psycopg_pool import AsyncConnectionPool

from shared.config import Settings
from shared.db.served import CHANNEL, STAMPED_SQL
from shared.metric_plan import MetricPlan

log = logging.getLogger(__name__)


class ServedRow(NamedTuple):
    """The served row as one metric sees it: its `xmin` stamp (every publication rewrites the
    row, rule 6), the generation and W (None when nothing of the metric's version is served).
    `reachable` False: PostgreSQL did not answer, and this is the row last read (rule 12 in
    docs/semantics.md): a plan of it reads no batch cell and answers from W on."""

    stamp: str | None
    generation: int | None
    watermark: int | None
    reachable: bool = True


NOTHING_SERVED = ServedRow(None, None, None)


class ServedHints:
    """The served row last seen per metric: what the next batch read is planned with, and,
    while PostgreSQL does not answer, for how long a speed-only answer may still use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hints: dict[str, ServedRow] = {}
        self._read_at: dict[str, float] = {}

    def get(self, metric: str) -> ServedRow:
        with self._lock:
            return self._hints.get(metric, NOTHING_SERVED)

    def set(self, metric: str, served: ServedRow, sent_at: float) -> None:
        """Keep `served`, read by a statement sent at `sent_at` (monotonic), unless a row
        read by a statement sent later is kept already (a slow read ending late holds an
        older snapshot)."""
        with self._lock:
            if sent_at >= self._read_at.get(metric, -math.inf):
                self._hints[metric] = served
                self._read_at[metric] = sent_at

    def read_within(self, metric: str, seconds: float) -> ServedRow | None:
        """The row kept, if the statement that read it was sent less than `seconds` ago (its
        snapshot is no older than that: a publication it misses came after)."""
        with self._lock:
            read_at = self._read_at.get(metric)
            if read_at is None or time.monotonic() - read_at > seconds:
                return None
            return self._hints[metric]


LISTEN_APPLICATION = "lambda-serving-listen"
"""The `application_name` of the `LISTEN` connection (`pg_stat_activity` shows it)."""

_LISTEN_CONNECTION: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": 3,
    "application_name": LISTEN_APPLICATION,
    # A connection that dies without a word (a host or network gone) is found by TCP
    # keepalives within ~11 s; one the server closes is found at once (its socket reads).
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}
_RECONNECT_S = 0.25
_RECONNECT_MAX_S = 5.0
_RETRY_S = 0.01
"""First wait before reading an announced row again when the read did not find it yet (a
replica replaying behind the primary); doubled up to the refresh period."""
_READ_TIMEOUT_S = 5.0
_LOCK_WAIT_MS = 200


class _Any:
    """No stamp announced since the last read: whatever a read finds is current."""


_ANY = _Any()


class HeldServedRow:
    """The served row this process holds, kept current by a `LISTEN` task (module doc).
    Start it in the event loop that serves the requests (`start`), stop it before the pool it
    reads through is closed (`stop`)."""

    def __init__(
        self, settings: Settings, pool: AsyncConnectionPool, hints: ServedHints | None = None
    ) -> None:
        self._listen_url = settings.postgres.url
        self._pool = pool
        self._hints = hints
        self._plans = tuple(settings.plans.values())
        self.confirm = settings.serving.served_row_confirm
        self.refresh_s = settings.serving.served_refresh_s
        self.fresh_for_s = min(2 * self.refresh_s, settings.speed.cleanup_delay_s / 2)
        self._read_timeout_s = min(_READ_TIMEOUT_S, max(self.refresh_s, 1.0))
        self._stamp: str | None = None
        self._generation: int | None = None
        self._watermarks: dict[str, int] = {}
        self._versions: dict[str, str] = {}
        self._held = False
        self._read_at = -float("inf")
        self._rows: dict[tuple[str, str], ServedRow] = {}
        self._usable = False
        self._expected: str | _Any | None = _ANY
        self._contradictions = 0
        self._fd = -1
        self._listening = False
        self._syncing = False
        self._next: asyncio.Future[bool] | None = None
        """What the requests waiting for the next `SELECT 1` learn: whether the held row
        is still current once it is answered."""
        self._wake = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None
        self._read_due = 0.0
        """When the row is to be read next (monotonic)."""
        self._retry_s = _RETRY_S
        self._down = False
        self._task: asyncio.Task[None] | None = None
        self.reads = 0
        """Reads of the row so far."""
        self.syncs = 0
        """`SELECT 1`s on the `LISTEN` connection so far (confirmations and pings)."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="served-listen")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._forget()

    @property
    def stamp(self) -> str | None:
        """The stamp of the row held, while requests may use it (else None)."""
        return self._stamp if self._is_fresh() else None

    @property
    def listening(self) -> bool:
        """Whether `LISTEN` is in place on a live connection."""
        return self._listening

    async def row_for(self, metric: MetricPlan) -> ServedRow | None:
        """The held row as `metric` sees it, when a request may plan against it without
        reading it (module doc), confirmed first unless `confirm` is off; else None."""
        if not self._is_fresh():
            return None
        if self.confirm:
            waiting = self._next
            if waiting is None:
                waiting = self._next = asyncio.get_running_loop().create_future()
                self._wake.set()
            # shielded: a request cancelled (its time budget) must not fail the others' wait
            if not await asyncio.shield(waiting) or not self._is_fresh():
                return None
        key = (metric.name, metric.version)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self._row_of(metric.name, metric.version)
        return row

    def contradicted(self, stamp: str | None) -> None:
        """A request planned against the held row read another one: until a read confirms
        the row, requests read it themselves."""
        if stamp != self._stamp:
            self._usable = False
            self._contradictions += 1

    def _is_fresh(self) -> bool:
        if self._syncing and not self.confirm:
            return False  # announcements may be read but not handled yet
        if not self._usable or time.monotonic() - self._read_at >= self.fresh_for_s:
            return False
        try:  # an announcement PostgreSQL sent, not read yet (or the connection closing)
            readable, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def _row_of(self, name: str, version: str) -> ServedRow:
        if not self._held:
            return NOTHING_SERVED
        watermark = self._watermarks.get(name) if self._versions.get(name) == version else None
        return ServedRow(self._stamp, self._generation, watermark)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._listen_url, **_LISTEN_CONNECTION)
            except psycopg.Error as exc:
                failures += 1
                self._lost(exc)
                await asyncio.sleep(_backoff(failures))
                continue
            try:
                if not await _announced(conn):
                    log.warning(
                        "event=served_unannounced: served_view has no trigger announcing its "
                        "writes (run `lambdactl db upgrade`); requests read the served row "
                        "themselves"
                    )
                    return
                conn.add_notify_handler(self._announced)
                await conn.execute(f"LISTEN {CHANNEL}")
                self._fd = conn.fileno()
                self._expected = _ANY  # what was announced while no one listened is unknown
                self._listening = True
                failures = 0
                await self._listen(conn)
            except (psycopg.Error, OSError) as exc:
                self._forget()
                failures += 1
                self._lost(exc)
            finally:
                self._forget()  # before the socket is closed (its number may be reused)
                await conn.close()
            await asyncio.sleep(_backoff(failures))

    def _announced(self, note: psycopg.Notify) -> None:
        """Called by psycopg as it reads each notification off the `LISTEN` connection."""
        if note.channel == CHANNEL:
            self._expected = note.payload or None
            self._usable = False
            self._read_due = 0.0  # read it at once

    def _forget(self) -> None:
        self._usable = self._listening = self._syncing = False
        self._fd = -1
        waiting, self._next = self._next, None
        if waiting is not None and not waiting.done():
            waiting.set_result(False)

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read the row now (`LISTEN` is in place: anything published before is in this
        read), then answer confirmations, hear announcements and re-read the row after each
        one and every refresh period, until the connection fails. Reads run beside the
        confirmations (`_reading`): one waiting for a pool connection holds up no request."""
        await self._refresh()
        try:
            while True:
                now = time.monotonic()
                if self._reading is None and now >= self._read_due:
                    self._reading = asyncio.get_running_loop().create_task(self._reread())
                wait = self.refresh_s if self._reading is not None else self._read_due - now
                await self._idle(max(0.0, wait))
                # One round trip reads whatever was announced (psycopg hands each
                # notification to `_announced` before it returns) and confirms the row to
                # the requests waiting.
                waiting, self._next = self._next, None
                self._syncing, answered = True, False
                try:
                    await conn.execute("SELECT 1")
                    answered = True
                finally:
                    self._syncing = False
                    if waiting is not None:
                        waiting.set_result(answered and self._usable)
                self.syncs += 1
        finally:
            reading, self._reading = self._reading, None
            if reading is not None:
                reading.cancel()

    async def _reread(self) -> None:
        try:
            await self._refresh()
        finally:
            self._reading = None
            self._wake.set()  # the next read's time has changed

    async def _idle(self, timeout: float) -> None:
        """Until a request waits for a confirmation, the `LISTEN` connection has something to
        read (an announcement, or the server closing it), or `timeout`."""
        if self._next is None and not self._wake.is_set():
            loop = asyncio.get_running_loop()
            loop.add_reader(self._fd, self._wake.set)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self._fd)  # psycopg waits on it itself
        self._wake.clear()

    async def _refresh(self) -> None:
        contradictions = self._contradictions
        try:
            async with asyncio.timeout(self._read_timeout_s):
                async with (
                    self._pool.connection(timeout=self._read_timeout_s) as conn,
                    conn.transaction(),
                ):
                    # Never long behind a lock (a migration altering the table): read again.
                    await conn.execute(f"SET LOCAL lock_timeout = {_LOCK_WAIT_MS}")
                    sent_at = time.monotonic()
                    cursor = await conn.execute(STAMPED_SQL)
                    row = await cursor.fetchone()
        except (psycopg.Error, OSError, TimeoutError) as exc:  # PostgreSQL did not answer
            self._usable = False
            self._retry_later()
            log.debug("the served row was not read: %s", exc)
            return
        self.reads += 1
        stamp = None if row is None else row[0]
        self._hold(row, sent_at)
        if self._expected is not _ANY and stamp != self._expected:
            self._retry_later()  # not replayed here yet
            return
        if contradictions != self._contradictions:
            self._retry_later()  # a request read another row since this read was sent
            return
        self._expected = _ANY
        self._usable = self._listening
        self._retry_s = _RETRY_S
        self._read_due = sent_at + self.refresh_s
        if self._down and self._usable:
            self._down = False
            log.warning("event=store_recovered store=postgres pool=listen")

    def _retry_later(self) -> None:
        self._read_due = time.monotonic() + self._retry_s
        self._retry_s = min(2 * self._retry_s, self.refresh_s)

    def _hold(self, row: tuple[Any, ...] | None, sent_at: float) -> None:
        """Keep a row read by a statement sent at `sent_at` (usable or not: `_refresh`
        decides), and hand every plan's view of it to the hints."""
        if row is None:
            self._held, self._stamp, self._generation = False, None, None
            self._watermarks, self._versions = {}, {}
        else:
            self._held = True
            self._stamp, self._generation, self._watermarks, self._versions = row
        self._read_at = sent_at
        self._rows = {}
        if self._hints is not None:
            for plan in self._plans:
                self._hints.set(plan.name, self._row_of(plan.name, plan.version), sent_at)

    def _lost(self, error: Exception) -> None:
        self._usable = self._listening = False
        if not self._down:
            self._down = True
            log.warning(
                "event=store_down store=postgres pool=listen error=%s: %s; requests read the "
                "served row themselves until LISTEN %s is in place again",
                type(error).__name__,
                str(error).strip().replace("\n", " ")[:300],
                CHANNEL,
            )


async def _announced(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the database announces the served row's writes (migration 0010)."""
    cursor = await conn.execute(
        "SELECT 1 FROM pg_trigger WHERE tgname = 'served_view_announce' "
        "AND tgrelid = 'served_view'::regclass"
    )
    return await cursor.fetchone() is not None


def _backoff(failures: int) -> float:
    return min(_RECONNECT_MAX_S, _RECONNECT_S * 2 ** max(0, failures - 1)) if failures else 0.0
