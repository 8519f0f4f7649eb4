"""The batch view's tables. `batch_cells` is partitioned by generation (rule 6 in
docs/semantics.md); each generation's table by metric into *retention groups* (the plans
that keep their windows alike, and the rest), and each group's table by time: by (window_ms,
start_ms) into ranges of cell starts, one window size per range ("Time partitions" in
docs/architecture.md). Retention then drops whole tables, also where other metrics keep the
same window longer, and a read's lookup descends the small index of the one range it needs.
Which groups and ranges a set of cells needs are pure functions (`retention_groups`,
`ranges_to_add`); the DDL sits at the edge."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from shared.metric_plan import SESSION_WINDOW_MS, MetricPlan

DAY_MS = 86_400_000
STARTS_PER_RANGE = 10_080
"""How many window starts a range spans (a week of 1-minute cells), rounded up to whole UTC
days and capped at `MAX_RANGE_DAYS`: a 1m window's ranges span 7 days, 5m 35 days, 15m 105
days, 1h and longer 364 days."""
MAX_RANGE_DAYS = 364
SESSION_RANGE_MS = 7 * DAY_MS
"""The span of the ranges of window 0 (a session metric's sessions, by first event time)."""
NEW_RANGES_PER_WINDOW = 8
"""At most this many ranges of their own span are added per window and publication, for the
newest cells; older cells without a range get one range filling the gap they lie in. However
spread a run's event times (year 1 to 9999), it adds a bounded number of tables."""
MAX_NEW_RANGES = 64
"""A new generation gives a window as many ranges as its retention keeps (plus one), at least
`NEW_RANGES_PER_WINDOW`, at most this many."""


def range_span_ms(window_ms: int) -> int:
    """The span of the ranges of cells of `window_ms` (`STARTS_PER_RANGE`)."""
    if window_ms == SESSION_WINDOW_MS:
        return SESSION_RANGE_MS
    days = -(-window_ms * STARTS_PER_RANGE // DAY_MS)
    return min(max(days, 1), MAX_RANGE_DAYS) * DAY_MS


@dataclass(frozen=True, order=True)
class TimeRange:
    """The cells of one window size whose start is in `[lo, hi)`; None is unbounded (the
    table's MINVALUE / MAXVALUE), in the retention group `group` of its generation ("": the
    generation's table itself, as generations laid out before retention groups are)."""

    window_ms: int
    lo: int | None
    hi: int | None
    group: str = ""

    def holds(self, start_ms: int) -> bool:
        return (self.lo is None or self.lo <= start_ms) and (self.hi is None or start_ms < self.hi)

    def parent(self, generation: int) -> str:
        """The table it is a partition of: its group's."""
        return group_table(generation, self.group)

    def table(self, generation: int) -> str:
        """Its table's name: its group's, the window and the first start it holds."""
        return f"{self.parent(generation)}_w{self.window_ms}_{_label(self.lo)}"

    def bounds(self) -> sql.Composed:
        def value(bound: int | None, unbounded: str) -> sql.Composable:
            return sql.SQL(unbounded) if bound is None else sql.Literal(bound)

        return sql.SQL("FOR VALUES FROM ({w}, {lo}) TO ({w}, {hi})").format(
            w=sql.Literal(self.window_ms),
            lo=value(self.lo, "MINVALUE"),
            hi=value(self.hi, "MAXVALUE"),
        )


def _label(bound: int | None) -> str:
    if bound is None:
        return "min"
    return str(bound) if bound >= 0 else f"m{-bound}"


def ranges_to_add(
    window_ms: int,
    existing: Sequence[TimeRange],
    starts: Iterable[int],
    limit: int = NEW_RANGES_PER_WINDOW,
    group: str = "",
) -> list[TimeRange]:
    """The ranges to add so that every start of `starts` (cells of `window_ms`) has one,
    given the window's `existing` ranges. Starts after every existing range get ranges of
    the window's span (`range_span_ms`), at most `limit` of them, the newest;
    any other start without a range gets one range filling the whole gap it lies in, up to
    its neighbours (or unbounded). The ranges returned (in `group`) overlap neither each
    other nor `existing`."""
    span = range_span_ms(window_ms)
    uncovered = sorted({s for s in starts if not any(r.holds(s) for r in existing)})
    if any(r.hi is None for r in existing):
        top: int | None = None
        fresh: list[int] = []
    else:
        top = max((r.hi for r in existing if r.hi is not None), default=None)
        fresh = uncovered if top is None else uncovered[bisect.bisect_left(uncovered, top) :]
    los = sorted({s - s % span for s in fresh})[-limit:]
    added = [
        TimeRange(window_ms, lo if top is None else max(lo, top), lo + span, group) for lo in los
    ]
    ranges = sorted([*existing, *added], key=_lower)
    lowers = [_lower(r) for r in ranges]
    for start in uncovered:
        i = bisect.bisect_right(lowers, start) - 1
        if i >= 0 and ranges[i].holds(start):
            continue
        # ranges[i] (if any) ends at or before the start, ranges[i + 1] begins after it
        gap = TimeRange(
            window_ms,
            ranges[i].hi if i >= 0 else None,
            ranges[i + 1].lo if i + 1 < len(ranges) else None,
            group,
        )
        ranges.insert(i + 1, gap)
        lowers.insert(i + 1, _lower(gap))
        added.append(gap)
    return sorted(added, key=_lower)


def _lower(r: TimeRange) -> float:
    return -float("inf") if r.lo is None else r.lo


def generation_table(generation: int) -> str:
    return f"batch_cells_g{generation}"


def group_table(generation: int, group: str) -> str:
    """The table of a generation's retention group (`group` "": the generation's own)."""
    return f"{generation_table(generation)}_{group}" if group else generation_table(generation)


REST = "rest"
"""The retention group of every plan keeping all its windows forever, and of any metric no
other group lists (a metric added since the generation was laid out)."""


@dataclass(frozen=True)
class RetentionGroup:
    """Plans whose cells share a generation's table because they keep each window alike, and
    the windows that table splits into time ranges, with the longest retention of each
    (`split_windows`). `plans` is empty for `REST`, the group of the plans no other lists."""

    name: str
    plans: frozenset[str]
    split: Mapping[int, int]


def retention_groups(plans: Iterable[MetricPlan]) -> list[RetentionGroup]:
    """How a new generation groups its plans: one group per distinct retention (plans with the
    same `retention` keep their windows alike; a metric's rollups keep its own), `REST` for the
    plans keeping everything forever. A range of a group holds no cell that another retention
    keeps longer, so retention drops it whole, whatever the other metrics keep; and the groups
    stay as few as the retentions configured, since a generic plan opens every table of the
    generation ("Time partitions" in docs/architecture.md)."""
    retained: dict[tuple[tuple[int, int], ...], list[MetricPlan]] = {}
    rest = []
    for plan in plans:
        if plan.windows.retention_ms:
            retained.setdefault(tuple(sorted(plan.windows.retention_ms)), []).append(plan)
        else:
            rest.append(plan)
    groups = [
        RetentionGroup(f"r{i}", frozenset(plan.name for plan in members), split_windows(members))
        for i, (_, members) in enumerate(sorted(retained.items()))
    ]
    return [*groups, RetentionGroup(REST, frozenset(), split_windows(rest))]


def create_generation(
    conn: psycopg.Connection[Any], generation: int, groups: Sequence[RetentionGroup] = ()
) -> sql.Identifier:
    """A generation's (empty, unattached) table, partitioned by metric into the tables of its
    retention `groups` (and `REST`), each partitioned by time; returns its name."""
    table = sql.Identifier(generation_table(generation))
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE batch_cells) PARTITION BY LIST (metric)").format(table)
    )
    for group in [*(g for g in groups if g.name != REST), RetentionGroup(REST, frozenset(), {})]:
        values = (
            sql.SQL("FOR VALUES IN ({})").format(
                sql.SQL(", ").join(map(sql.Literal, sorted(group.plans)))
            )
            if group.plans
            else sql.SQL("DEFAULT")
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} PARTITION OF {} {} PARTITION BY RANGE (window_ms, start_ms)"
            ).format(sql.Identifier(group_table(generation, group.name)), table, values)
        )
    return table


def split_windows(plans: Iterable[MetricPlan]) -> dict[int, int]:
    """The windows a retention group splits into time ranges, with the longest retention of
    each: those every plan storing cells of (`stored_windows`) keeps for a retention, so that
    a range past it can be dropped whole. Any other window gets one unbounded range: split,
    it would only gather tables that are never dropped."""
    retained: dict[int, int] = {}
    kept_forever: set[int] = set()
    for plan in plans:
        retention = dict(plan.windows.retention_ms)
        for window_ms in stored_windows(plan):
            kept = retention.get(
                plan.base_window_ms if window_ms == SESSION_WINDOW_MS else window_ms
            )
            if kept is None:
                kept_forever.add(window_ms)
            else:
                retained[window_ms] = max(kept, retained.get(window_ms, 0))
    return {w: kept for w, kept in retained.items() if w not in kept_forever}


def stored_windows(plan: MetricPlan) -> set[int]:
    """The windows of the cells the batch view stores for `plan` (window 0 for a session
    metric's sessions)."""
    stores_sessions = plan.sessions is not None and plan.rollup is None
    return {*plan.windows_ms, *((SESSION_WINDOW_MS,) if stores_sessions else ())}


def add_time_ranges(
    conn: psycopg.Connection[Any],
    generation: int,
    starts: Mapping[tuple[str, int], Iterable[int]],
    groups: Sequence[RetentionGroup] = (),
) -> list[TimeRange]:
    """Give every cell of `starts` ((metric, window) -> starts) a range in the table of the
    generation's retention group holding its metric; returns the ranges added. A window the
    group holds ranges of gets more as `ranges_to_add` says; a window it holds none of gets
    ranges as many as its retention in the group's `split` keeps (`groups`: a new
    generation's, `retention_groups`), or else one unbounded range. Each new range is
    created apart and then attached, which locks the group's table only against other DDL
    (SHARE UPDATE EXCLUSIVE), never against readers, so a served generation grows while it
    is read; the attach builds the new (empty) table's indexes."""
    held, group_of = _layout(conn, generation)
    split = {group.name: group.split for group in groups}
    wanted: dict[tuple[str, int], list[int]] = {}
    for (metric, window_ms), cell_starts in starts.items():
        group = group_of.get(metric, group_of[None])
        wanted.setdefault((group, window_ms), []).extend(cell_starts)
    added = []
    for (group, window_ms), group_starts in sorted(wanted.items()):
        existing = [r for r in held if r.window_ms == window_ms and r.group == group]
        if existing:
            new = ranges_to_add(window_ms, existing, group_starts, group=group)
        elif window_ms in split.get(group, {}):
            kept = -(-split[group][window_ms] // range_span_ms(window_ms)) + 1
            limit = min(max(kept, NEW_RANGES_PER_WINDOW), MAX_NEW_RANGES)
            new = ranges_to_add(window_ms, [], group_starts, limit, group)
        else:
            new = [TimeRange(window_ms, None, None, group)]
        for r in new:
            table = sql.Identifier(r.table(generation))
            parent = sql.Identifier(r.parent(generation))
            conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(table, parent))
            conn.execute(
                sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(parent, table, r.bounds())
            )
            added.append(r)
    return added


_BOUND = re.compile(
    r"FROM \('(-?\d+)', (MINVALUE|'(-?\d+)')\) TO \('(-?\d+)', (MAXVALUE|'(-?\d+)')\)"
)
_LISTED = re.compile(r"'((?:[^']|'')*)'")


def time_ranges(conn: psycopg.Connection[Any], generation: int) -> list[TimeRange]:
    """The ranges of a generation, as its partition bounds say: the ranges of each retention
    group's table, or (a generation laid out before retention groups) of its own."""
    return _layout(conn, generation)[0]


def _layout(
    conn: psycopg.Connection[Any], generation: int
) -> tuple[list[TimeRange], dict[str | None, str]]:
    """A generation's time ranges, and its retention groups by metric: metric -> the group
    listing it; None -> the group of any other metric (`REST`, or "" when the generation
    has no groups). One read of the catalog: the generation's partitions and theirs."""
    _check_time_partitioned(conn, generation)
    own = generation_table(generation)
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), p.relname FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE i.inhparent = %(g)s::regclass OR i.inhparent IN ("
        "  SELECT inhrelid FROM pg_inherits WHERE inhparent = %(g)s::regclass)",
        {"g": own},
    ).fetchall()
    ranges = []
    groups: dict[str | None, str] = {None: ""}
    for name, bound, parent in rows:
        found = _BOUND.search(bound)
        if found is None:  # a retention group's table
            group = name.removeprefix(own + "_")
            if bound == "DEFAULT":
                groups[None] = group
            for listed in _LISTED.findall(bound):
                groups[listed.replace("''", "'")] = group
            continue
        lo, hi = (None if bound is None else int(bound) for bound in found.group(3, 6))
        group = "" if parent == own else parent.removeprefix(own + "_")
        ranges.append(TimeRange(int(found.group(1)), lo, hi, group))
    return sorted(ranges, key=lambda r: (r.group, r.window_ms, _lower(r))), groups


def _check_time_partitioned(conn: psycopg.Connection[Any], generation: int) -> None:
    kind = conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = %s::regclass", [generation_table(generation)]
    ).fetchone()
    if kind is None or kind[0] != "p":
        raise ValueError(
            f"{generation_table(generation)} is not partitioned by time: a runner older than "
            "migration 0007 wrote it; stop old runners and queue a full run"
        )


def index_generation(conn: psycopg.Connection[Any], generation: int) -> None:
    """The one place a loaded generation's key and indexes are built (after the load, before
    it is attached; each range builds its own): its part of `batch_cells`' primary key, which
    is time-major so that `top` and sliced reads find every key of one window start together,
    and `by_key_index` beside it."""
    table = sql.Identifier(generation_table(generation))
    conn.execute(
        sql.SQL(
            "ALTER TABLE {} ADD PRIMARY KEY (generation, metric, version, window_ms, start_ms, key)"
        ).format(table)
    )
    conn.execute(by_key_index(generation))


def by_key_index(generation: int) -> sql.Composed:
    """The statement creating a generation's index of each key's cells in time order:
    (metric, version, window_ms, key, start_ms). A one-key series reads its consecutive cells
    of a window as one range of it (`SERIES_SQL`), one or two leaf pages where the primary
    key holds each cell on a leaf of its own (a page from disk per cell once the view
    outgrows memory); one key's sessions (window 0) are read through it too. About as large
    as the primary key ("Time partitions" in docs/architecture.md)."""
    return sql.SQL(
        "CREATE INDEX IF NOT EXISTS {} ON {} (metric, version, window_ms, key, start_ms)"
    ).format(by_key_name(generation), sql.Identifier(generation_table(generation)))


def by_key_name(generation: int) -> sql.Identifier:
    """The name of a generation's index by key (`by_key_index`)."""
    return sql.Identifier(f"{generation_table(generation)}_by_key")


def drop_detached_ranges(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop the time ranges retention detached from their generation, each in a transaction
    of its own, after the publication that detached them committed; returns their names.
    Dropping a large table inside the publication would hold the generation's lock through
    the commit while its files are unlinked (~1 ms per MB here: 3 s for a week of 1-minute
    cells at 10^8), and every reader of the generation would wait; detached, nobody reads it.
    Also drops what a crash between the two left behind. Only the runner calls it (one at a
    time, on a connection with no transaction open: it commits): a range being built is
    attached in the transaction that creates it."""
    names = [
        name
        for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition "
            "AND relname ~ %s AND pg_table_is_visible(oid) ORDER BY relname",
            [r"^batch_cells_g\d+_(r\d+_|rest_)?w\d+_"],
        ).fetchall()
    ]
    conn.commit()
    for name in names:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        conn.commit()
    return names


def partitions_of(conn: psycopg.Connection[Any], parent: str) -> list[str]:
    """The names of the tables attached to the partitioned table `parent`."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass",
        [parent],
    ).fetchall()
    return [name for (name,) in rows]
