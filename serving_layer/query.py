"""The serving layer's core: a query of the merged view, typed, and its answer (rule 8 in
docs/semantics.md). Every way in builds one of these queries — the HTTP routes from their
parameters (`routes/metrics`), an SQL statement compiled alike — and reads it through one
pipeline:

1. the query is checked when it is built (`SeriesQuery.of`, ...): a bad size, a range outside
   the supported times or more than `serving.max_cells` cells is refused before anything is
   read;
2. `read` picks what it reads: the metric or its smallest covering rollup (`answering_plan`),
   a session metric's three parts;
3. `MergedView` plans it against the served row, reads the batch view and the speed view and
   merges them (`merged_view`);
4. the answer holds the rows and one provenance (`Answer`); rendering it is the caller's
   (JSON for HTTP).

A query names the metric asked; what it reads follows from the configuration."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from serving_layer.errors import BatchViewUnsettled, bad_request
from serving_layer.merged_view import MergedView
from serving_layer.params import (
    by_of,
    check_cells,
    check_key_text,
    check_supported,
    check_windows,
    windows_of,
)
from serving_layer.pools import AsyncDb
from serving_layer.read_plan import Answer, Group, RankedGroups, SeriesRows, check_retained
from serving_layer.selection import Selection
from serving_layer.sessions import SESSION_RANKINGS, SessionRow, join_points, speed_sessions
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.aggregations import Ranking, RenderOptions
from shared.config import Settings
from shared.durations import format_duration
from shared.metric_plan import MetricPlan, rollup_name
from shared.speed_view import encode_key
from shared.speed_view.held import SessionPlans
from shared.windows import window_start, window_starts


class Query(Protocol):
    """What every query answers: its rows of the merged view, with their provenance."""

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[object]: ...


def _check_count(name: str, value: int, most: int) -> None:
    """How many rows a query may answer (`limit`, `n`): 1 to `most`."""
    if not 1 <= value <= most:
        raise bad_request(f"{name} must be between 1 and {most}")


def answering_plan(
    settings: Settings, metric: MetricPlan, selection: Selection
) -> tuple[MetricPlan, Selection]:
    """What a query reads: the smallest of `metric`'s rollups that keeps every dimension the
    query filters or groups by (fewest dimensions: fewest cells), with the selection over its
    key; the metric itself when none does."""
    used = selection.used
    covering = [dims for dims in metric.rollups if used <= set(dims)]
    if not covering:
        return metric, selection
    dims = min(covering, key=len)
    plan = settings.plan(rollup_name(metric.name, dims))
    assert plan is not None, "compile_plans compiles every rollup"
    return plan, selection.onto(dims)


@dataclass(frozen=True)
class SeriesQuery:
    """The windows of `spec` starting in `[start_ms, end_ms)`, of each group of `selection`
    (one group, `()`, without `group_by`), at most `limit` groups rendered."""

    metric: MetricPlan
    spec: WindowSpec
    start_ms: int
    end_ms: int
    selection: Selection
    options: RenderOptions
    limit: int

    @classmethod
    def of(
        cls,
        settings: Settings,
        metric: MetricPlan,
        spec: WindowSpec,
        window: tuple[int, int],
        selection: Selection,
        options: RenderOptions,
        limit: int,
    ) -> SeriesQuery:
        _check_count("limit", limit, settings.serving.max_groups)
        check_windows(settings, metric, spec, *window)
        return cls(metric, spec, *window, selection, options, limit)

    @property
    def one_key(self) -> bool:
        """Whether the query names one key of a configured window, neither hopping nor in a
        time zone: read by its exact, cached path, answered without `filters`."""
        return self.selection.exact_key is not None and self._pre_rolled(self.metric)

    def _pre_rolled(self, metric: MetricPlan) -> bool:
        spec = self.spec
        plain = spec.step_ms == spec.size_ms and spec.tz is None
        return plain and spec.size_ms in metric.windows_ms

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[SeriesRows]:
        if self.metric.sessions is None:
            return await self._read_plan(view, db, self.metric)
        return await self._read_sessions(
            view, db, SessionPlans.of(self.metric, view.settings.plans.values())
        )

    async def _read_plan(
        self, view: MergedView, db: AsyncDb, metric: MetricPlan
    ) -> Answer[SeriesRows]:
        """One key of a configured window by its exact, cached path; any other series merged
        over the keys passing the filters, of the metric or its smallest covering rollup (one
        key of that rollup by its exact path again)."""
        size, options = self.spec.size_ms, self.options
        key = self.selection.exact_key
        if key is not None and self._pre_rolled(metric):
            starts = window_starts(self.start_ms, self.end_ms, size)
            return await view.series(db, metric, size, starts, key, options)
        windows = windows_of(metric, self.spec, self.start_ms, self.end_ms)
        plan, read = answering_plan(view.settings, metric, self.selection)
        rolled_key = read.exact_key
        if rolled_key is None or not self._pre_rolled(plan):
            return await view.sliced_series(db, plan, windows, read, options)
        starts = window_starts(self.start_ms, self.end_ms, size)
        return await view.series(db, plan, size, starts, rolled_key, options)

    async def _read_sessions(
        self, view: MergedView, db: AsyncDb, plans: SessionPlans
    ) -> Answer[SeriesRows]:
        """A session metric's series: its three plans read alike, under one served row
        (read again when a run published between them), joined window by window."""
        for _ in range(_SESSION_READS):
            events, sessions, bounces = await asyncio.gather(
                *(
                    self._read_plan(view, db, p)
                    for p in (plans.metric, plans.sessions, plans.bounces)
                )
            )
            if events.stamp == sessions.stamp == bounces.stamp:
                break
        else:
            raise BatchViewUnsettled("the batch view changed during the read several times; retry")
        events.batch_cells += sessions.batch_cells + bounces.batch_cells
        events.speed_states += sessions.speed_states + bounces.speed_states
        for group, points in events.rows.items():
            events.rows[group] = join_points(
                points, sessions.rows.get(group, []), bounces.rows.get(group, [])
            )
        return events


_SESSION_READS = 4
"""How often a session series reads its three plans before answering 503 (a run published
between them each time)."""


@dataclass(frozen=True)
class TotalQuery:
    """Each group's merge over `[start_ms, end_ms)` as one window (its bounds on base cells),
    of the metric or its smallest covering rollup: the SQL interface's statement without a
    time bucket."""

    metric: MetricPlan
    start_ms: int
    end_ms: int
    selection: Selection
    options: RenderOptions

    @classmethod
    def of(
        cls,
        settings: Settings,
        metric: MetricPlan,
        window: tuple[int, int],
        selection: Selection,
        options: RenderOptions,
    ) -> TotalQuery:
        (start_ms, end_ms), base = window, metric.base_window_ms
        if start_ms % base or end_ms % base:
            raise bad_request(
                f"a total's range must start and end on {format_duration(base)} cells of "
                f"{metric.name}: [{format_time(window_start(start_ms, base))}, "
                f"{format_time(window_start(end_ms + base - 1, base))}) holds it"
            )
        check_supported(start_ms, end_ms, "the range", "send a range in years 1 to 9999")
        check_cells(
            settings,
            (end_ms - start_ms) // base,
            f"narrow the range to at most {settings.serving.max_cells} "
            f"{format_duration(base)} cells",
        )
        return cls(metric, start_ms, end_ms, selection, options)

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[SeriesRows]:
        window = (self.start_ms, self.end_ms)
        plan, read = answering_plan(view.settings, self.metric, self.selection)
        return await view.sliced_series(db, plan, [window], read, self.options)


@dataclass(frozen=True)
class TopQuery:
    """The groups of `selection.group_by` ranked by `by` over the window of `window_ms`
    starting at `start_ms`, best first, ties by group ascending, at most `n`. `ranked`: the
    plan holding the ranked output (a session output's part, else the metric)."""

    metric: MetricPlan
    by: str
    window_ms: int
    start_ms: int
    selection: Selection
    n: int
    ranked: MetricPlan
    ranking: Ranking

    @classmethod
    def of(
        cls,
        settings: Settings,
        metric: MetricPlan,
        by: str,
        window_ms: int,
        at_ms: int,
        selection: Selection,
        n: int,
        options: RenderOptions,
    ) -> TopQuery:
        ranked, ranking = _ranking_of(settings, metric, by, options)
        _check_count("n", n, settings.serving.max_top_n)
        check_cells(
            settings, window_ms // metric.base_window_ms, "use a smaller window for top queries"
        )
        start_ms = window_start(at_ms, window_ms)
        check_supported(
            start_ms, start_ms + window_ms, "the window holding `at`", "send a smaller window"
        )
        return cls(metric, by, window_ms, start_ms, selection, n, ranked, ranking)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.window_ms

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[RankedGroups]:
        plan, read = answering_plan(view.settings, self.ranked, self.selection)
        return await view.top(db, plan, self.window_ms, self.start_ms, self.ranking, read)


def _ranking_of(
    settings: Settings, metric: MetricPlan, by: str, options: RenderOptions
) -> tuple[MetricPlan, Ranking]:
    """The plan `top` reads and how it ranks it: a session output through the part holding
    it (`SESSION_RANKINGS`), else one of the metric's outputs."""
    if metric.sessions is None:
        return metric, by_of(metric, by, options)
    plans = SessionPlans.of(metric, settings.plans.values())
    if by in SESSION_RANKINGS:
        part_name, part_by = SESSION_RANKINGS[by]
        part = plans.sessions if part_name == "sessions" else plans.bounces
        return part, by_of(part, part_by, options)
    if by not in plans.metric.aggregations.output_names(options):
        names = [*SESSION_RANKINGS, *metric.aggregations.output_names(options)]
        raise bad_request(
            f"by={by!r} is not an output of {metric.name}; use one of " + ", ".join(names)
        )
    return metric, by_of(metric, by, options)


@dataclass(frozen=True)
class KeysQuery:
    """The keys passing `selection`'s filters with a cell in `[start_ms, end_ms)`, ascending,
    whose first dimension starts with `prefix` (None: any), at most `limit`."""

    metric: MetricPlan
    start_ms: int
    end_ms: int
    prefix: str | None
    selection: Selection
    limit: int

    @classmethod
    def of(
        cls,
        settings: Settings,
        metric: MetricPlan,
        window: tuple[int, int],
        prefix: str | None,
        selection: Selection,
        limit: int,
    ) -> KeysQuery:
        _check_count("limit", limit, settings.serving.max_keys_limit)
        base, (start_ms, end_ms) = metric.base_window_ms, window
        check_cells(
            settings,
            (end_ms - start_ms + base - 1) // base,
            f"narrow [start, end) to at most {settings.serving.max_cells} "
            f"{format_duration(base)} cells",
        )
        if prefix is not None:
            check_key_text("prefix", prefix)
        return cls(metric, start_ms, end_ms, prefix, selection, limit)

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[list[Group]]:
        return await view.keys(
            db, self.metric, self.start_ms, self.end_ms, self.prefix, self.selection
        )


@dataclass(frozen=True)
class SessionsQuery:
    """One key's sessions (a session metric, rule 13) starting in `[start_ms, end_ms)`,
    ascending: the batch view's before W, the speed view's from W on; `limit` + 1 read, so
    that an answer knows whether more were there."""

    metric: MetricPlan
    key: tuple[str, ...]
    start_ms: int
    end_ms: int
    limit: int

    @classmethod
    def of(
        cls,
        settings: Settings,
        metric: MetricPlan,
        window: tuple[int, int],
        selection: Selection,
        limit: int,
    ) -> SessionsQuery:
        if metric.sessions is None:
            raise bad_request(f"{metric.name} is not a session metric; use /series")
        check_supported(*window, "[start, end)", "send times in years 1 to 9999")
        _check_count("limit", limit, settings.serving.max_keys_limit)
        key = selection.exact_key
        if key is None:
            dims = ", ".join(f"{d}=..." for d in metric.key)
            raise bad_request(
                f"name one key: give each of {metric.name}'s dimensions once ({dims})"
            )
        return cls(metric, key, *window, limit)

    async def read(self, view: MergedView, db: AsyncDb) -> Answer[list[SessionRow]]:
        metric = self.metric
        plans = SessionPlans.of(metric, view.settings.plans.values())
        window = (self.start_ms, self.end_ms)
        (served, stored), (status, held) = await asyncio.gather(  # independent: both at once
            view.batch_parts.read(
                db,
                metric,
                ("sessions", metric.name, self.key, window, self.limit),
                partial(
                    view.batch.sessions,
                    db,
                    metric,
                    plans.sessions,
                    self.key,
                    window,
                    self.limit + 1,
                ),
                lambda kept: 300 * len(kept) + 64,
            ),
            view.speed.read_held(metric, encode_key(self.key)),
        )
        base = metric.base_window_ms
        first_bucket = window_start(self.start_ms, base)  # a session's, by its start
        check_retained(metric, [(first_bucket, first_bucket + base)], served.watermark)
        rows = [
            SessionRow(s.start_ms, s.start_ms + s.duration_ms, s.state, "batch") for s in stored
        ]
        rows += speed_sessions(held, served.watermark, window)
        return Answer(rows, served.watermark, status, stamp=served.stamp)
