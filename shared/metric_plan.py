"""A metric compiled once: everything each layer needs to know about a configured metric,
derived from its `MetricConfig` and its source's `SourceConfig` in one place.

The layers read a metric only through its plan, so the version (the name its cells are stored
under), the base window, the aggregations (parsed by the registry, `shared.aggregations`) and
the fields an event must carry are decided here and nowhere else. `compile_plans` is what
`Settings.plans` returns."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

import orjson

from shared.aggregations import AggregationSet, SketchKind, parse_aggregation
from shared.config import MetricConfig, SourceConfig, TableConfig
from shared.expressions import Definitions, compile_definitions
from shared.expressions.syntax import Call, Field, Node, walk
from shared.sessions import SessionRule
from shared.window_kind import SessionWindows, TumblingWindows


@dataclass(frozen=True, slots=True)
class MetricPlan:
    """One metric as every layer uses it. Durations are epoch milliseconds."""

    name: str
    version: str
    """First 12 hex digits of a SHA-256 over the metric's and its source's definitions (the
    source's partition count excluded): cells of two versions are never merged."""
    config: MetricConfig
    source: SourceConfig
    key: tuple[str, ...]
    """The key dimensions, in configured order (empty: one global series)."""
    value: str | None
    """The numeric field `sum`/`min`/`max`/`avg` read, or None when no aggregation needs one."""
    aggregations: AggregationSet
    """The configured aggregations, parsed by the registry (`shared.aggregations`)."""
    windows: TumblingWindows
    """The window kind: how events fall into stored cells and windows are composed of them."""
    grace_ms: int
    sketch_inputs: tuple[SketchInput, ...]
    """What each sketch slot reads, in slot order."""
    fields_read: tuple[str, ...]
    """The event fields the metric reads besides the source's time and id fields: key
    dimensions, the value field, then the sketches' fields, each once."""
    rollups: tuple[tuple[str, ...], ...] = ()
    """The key subsets pre-aggregated for this metric, each stored as its own plan (named by
    `rollup_name`)."""
    definitions: Definitions | None = None
    """The metric's computed fields and filter (rule 10 in docs/semantics.md), when it has any
    or reads a nested field: then every input (`key`, `value`, the sketches' fields) is read
    through them. None for a metric of raw top-level fields only."""
    rollup: Rollup | None = None
    """Set on a rollup's own plan: whose cells it merges over the dimensions it leaves out."""
    lookups: tuple[LookupPlan, ...] = ()
    """The tables joined to each event before `definitions` read it (rule 11)."""
    sessions: SessionWindows | None = None
    """Set for a session metric (rule 13) and its parts: how its key's events form sessions,
    bucketed by their first event into `windows`. The metric's own cells hold its aggregations
    over the events of the sessions starting in a bucket."""
    session_part: SessionPart | None = None
    """Set on a session part's own plan (`compile_session_parts`): what it counts of its
    metric's sessions."""

    @property
    def holds_sessions(self) -> bool:
        """A session metric itself, whose keys' sessions both layers cut (not one of its parts
        or rollups, which share its window kind but are built from what it holds)."""
        return self.sessions is not None and self.session_part is None and self.rollup is None

    @property
    def base_window_ms(self) -> int:
        """The smallest window: the cell size both layers store."""
        return self.windows.base_ms

    @property
    def windows_ms(self) -> tuple[int, ...]:
        """Every configured window, ascending (the base window first)."""
        return self.windows.sizes_ms

    @property
    def kinds(self) -> tuple[SketchKind, ...]:
        """The sketch slots' kinds (what `merge_states` takes)."""
        return self.aggregations.kinds

    @property
    def output_names(self) -> tuple[str, ...]:
        """The names a point carries by default, in configured order."""
        return self.aggregations.output_names()

    @property
    def text_inputs(self) -> tuple[str, ...]:
        """The names read as canonical text (key dimensions, then text-fed sketches), once
        each."""
        texts = (s.field for s in self.sketch_inputs if not s.number)
        return tuple(dict.fromkeys((*self.key, *texts)))

    @property
    def number_inputs(self) -> tuple[str, ...]:
        """The names read as finite numbers (the value, then number-fed sketches), once each."""
        value = () if self.value is None else (self.value,)
        numbers = (s.field for s in self.sketch_inputs if s.number)
        return tuple(dict.fromkeys((*value, *numbers)))

    @property
    def text_fields(self) -> tuple[str, ...]:
        """`text_inputs` when they are raw top-level fields; none when the inputs are read
        through `definitions`."""
        return () if self.definitions is not None else self.text_inputs

    @property
    def number_fields(self) -> tuple[str, ...]:
        """`number_inputs` when they are raw top-level fields; none when the inputs are read
        through `definitions`."""
        return () if self.definitions is not None else self.number_inputs


@dataclass(frozen=True, slots=True)
class Rollup:
    """A rollup of a metric: the parent's cells with the key projected on `dims` and merged.
    Both layers build it from what they built for the parent (its validated, de-duplicated,
    non-late inputs), so it answers exactly what merging the parent's keys would — it is not
    read from the events a second time and has no skips or late events of its own."""

    parent: str
    dims: tuple[str, ...]
    positions: tuple[int, ...]
    """Where each of `dims` sits in the parent's key."""
    of_sessions: bool = False
    """Its parent is a session metric or one of its parts (rule 13): the speed layer keeps it
    from the keys' sessions as they change (`speed_layer.session_totals`), not from events."""

    def project(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """A parent key's rollup key."""
        return tuple(key[i] for i in self.positions)


SESSION_DURATION = "duration"
"""The value of a session metric's `sessions` part: a session's last event time minus its
first, in ms."""


@dataclass(frozen=True, slots=True)
class SessionPart:
    """One part of a session metric stored as cells of its own, bucketed like the metric by
    each session's first event (rule 13): `sessions`, whose value is each session's duration
    in ms (count: sessions; sum, max, quantiles: of durations), or `bounces`, the sessions
    of one event (count)."""

    parent: str
    part: SessionPartName


SessionPartName = Literal["sessions", "bounces"]

SESSION_PART_AGGREGATIONS: Mapping[SessionPartName, tuple[str, ...]] = MappingProxyType(
    {
        "sessions": ("count", "sum", "max", f"quantiles({SESSION_DURATION})"),
        "bounces": ("count",),
    }
)
"""What each session part aggregates (`SESSION_DURATION` is the sessions part's value)."""


SESSION_WINDOW_MS = 0
"""The `window_ms` of a stored cell holding one session of a session metric or of its
`sessions` part (rule 13), started by the session's first event: what a key's sessions are
read from."""


def session_part_name(metric: str, part: str) -> str:
    """The name a session part's cells are stored under: parentheses, which a configured
    metric name cannot hold (nor a Redis hash tag's braces)."""
    return f"{metric}({part})"


def rollup_name(metric: str, dims: tuple[str, ...]) -> str:
    """The name a rollup's cells are stored under: brackets, which a configured metric name
    cannot hold, so it never collides with one."""
    return f"{metric}[{','.join(dims)}]"


@dataclass(frozen=True, slots=True)
class LookupPlan:
    """One lookup of a metric (rule 11 in docs/semantics.md): the version of `table` valid at
    the event time for the key `on` gives, read by the metric as `<alias>.<path>`."""

    table: TableConfig
    alias: str
    on: Node
    """The event's join key, an expression over the event's own fields."""
    reads: tuple[tuple[str, ...], ...]
    """The paths inside the table's records the metric reads (after the alias), once each."""


@dataclass(frozen=True, slots=True)
class SketchInput:
    """The field one sketch slot is fed, and how it is checked (metric-level validity)."""

    field: str
    number: bool
    """Fed the field's finite number (else its canonical text)."""
    missing: str
    """The skip reason when the field is absent."""
    invalid: str
    """The skip reason when it holds something else."""
    out_of_range: str
    """The skip reason when a number is too large in magnitude (`shared.events.VALUE_LIMIT`)."""


VALIDITY_REVISION = 3
"""Which edition of the validity rules (`shared.events`) cells were computed under. It is part
of every metric's version, so a change in what counts (2: the limits of the stores; 3: an id
reused at another event time is another event, rule 4) recomputes
every metric (a full run and a speed rebuild, as for a changed definition) instead of mixing
cells of both editions."""


def _unversioned(source: SourceConfig) -> set[str]:
    """The source keys a metric's version leaves out: the partition count, and the de-dup
    horizon when unset (a source without one hashes as it did before the key existed)."""
    return {"partitions"} | ({"dedup_horizon"} if source.dedup_horizon is None else set())


def _version(
    metric: MetricConfig,
    source: SourceConfig,
    rollup: tuple[str, ...] | None = None,
    tables: tuple[TableConfig, ...] = (),
    session_part: str | None = None,
) -> str:
    """The one hash of a metric's definition in the code base; see `MetricPlan.version`. A
    metric without rollups, computed fields, a filter or lookups hashes as it did before those
    keys existed; a rollup's plan hashes its parent's definition and its dimensions; a metric
    with lookups hashes the tables they join too."""
    optional = ("rollups", "fields", "where", "lookups", "session")
    unset = {name for name in optional if not getattr(metric, name)}
    unset.add("retention")  # how long cells are kept changes none of them
    definition: dict[str, object] = {
        "metric": metric.model_dump(mode="json", exclude=unset),
        "source": source.model_dump(mode="json", exclude=_unversioned(source)),
        "validity": VALIDITY_REVISION,
    }
    if tables:
        definition["tables"] = [t.model_dump(mode="json", exclude={"partitions"}) for t in tables]
    if rollup is not None:
        definition["rollup"] = list(rollup)
    if session_part is not None:
        definition["session_part"] = session_part
    digest = hashlib.sha256(orjson.dumps(definition, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()[:12]


def compile_plan(
    metric: MetricConfig, source: SourceConfig, tables: Iterable[TableConfig] = ()
) -> MetricPlan:
    """The plan of `metric`, whose source is `source` (`tables`: at least those its lookups
    join)."""
    if metric.source != source.name:
        raise ValueError(
            f"metric {metric.name!r} reads source {metric.source!r}, not {source.name!r}"
        )
    windows = tuple(sorted(metric.windows))
    value = () if metric.value is None else (metric.value,)
    aggregations = AggregationSet(tuple(map(parse_aggregation, metric.aggregations)))
    inputs = tuple(
        SketchInput(
            a.field,
            a.kind.reads == "number",
            f"{a.skip_reason}_missing",
            f"{a.skip_reason}_invalid",
            f"{a.skip_reason}_out_of_range",
        )
        for a in aggregations.sketched
        if a.field is not None and a.kind is not None
    )
    inputs_read = (*metric.key, *value, *(i.field for i in inputs))
    definitions = None
    if (
        metric.fields
        or metric.where is not None
        or metric.lookups
        or any("." in name for name in inputs_read)
    ):
        definitions = compile_definitions(metric.where, dict(metric.fields), source.time_field)
    lookups = () if definitions is None else _lookups(metric, source, tables, definitions)
    buckets = TumblingWindows(windows, metric.retention)
    sessions = None
    if metric.session is not None:
        rule = SessionRule(metric.session.gap, metric.session.max_duration)
        sessions = SessionWindows(rule, buckets)
    return MetricPlan(
        name=metric.name,
        version=_version(metric, source, tables=tuple(lookup.table for lookup in lookups)),
        config=metric,
        source=source,
        key=metric.key,
        value=metric.value,
        aggregations=aggregations,
        windows=buckets,
        grace_ms=metric.grace,
        sketch_inputs=inputs,
        fields_read=tuple(dict.fromkeys(inputs_read)),
        rollups=metric.rollups if sessions is None else ((), *metric.rollups),
        definitions=definitions,
        lookups=lookups,
        sessions=sessions,
    )


def _lookups(
    metric: MetricConfig,
    source: SourceConfig,
    tables: Iterable[TableConfig],
    definitions: Definitions,
) -> tuple[LookupPlan, ...]:
    """The metric's lookups, each with the table paths the metric reads through it. A
    ValueError when `on` reads anything but the event's own fields, or a lookup is read as a
    whole rather than by its fields."""
    by_name = {t.name: t for t in tables}
    aliases = {lookup.alias for lookup in metric.lookups}
    computed = {name for name, _ in definitions.fields}
    read: list[Node] = [node for _, root in definitions.fields for node in walk(root)]
    if definitions.where is not None:
        read += walk(definitions.where)
    value = () if metric.value is None else (metric.value,)
    sketched = (a.field for a in map(parse_aggregation, metric.aggregations) if a.field)
    read += [definitions.reference(name) for name in (*metric.key, *value, *sketched)]
    paths = [node.path for node in read if isinstance(node, Field)]
    for path in paths:
        if path[0] in aliases and len(path) == 1:
            raise ValueError(f"{path[0]!r} is a lookup; read its fields as {path[0]}.<field>")
    for node in read:
        if not isinstance(node, Call) or node.zone is None:
            continue
        instant = node.args[0]
        if isinstance(instant, Field) and instant.path[0] in aliases:
            raise ValueError(
                f"{node.function.value}({'.'.join(instant.path)}, '{node.zone}'): a date part "
                "with a zone reads the time field or an event field, not a lookup's"
            )
    plans = []
    for lookup in metric.lookups:
        on = compile_definitions(None, {"on": lookup.on}, source.time_field).fields[0][1]
        for node in walk(on):
            if isinstance(node, Field) and (node.path[0] in aliases or node.path[0] in computed):
                raise ValueError(
                    f"lookup {lookup.alias!r}: `on` reads {'.'.join(node.path)!r}, which is not "
                    "an event field; a lookup's key is read from the event itself"
                )
        reads = dict.fromkeys(p[1:] for p in paths if p[0] == lookup.alias)
        plans.append(LookupPlan(by_name[lookup.table], lookup.alias, on, tuple(reads)))
    return tuple(plans)


def compile_rollups(plan: MetricPlan) -> tuple[MetricPlan, ...]:
    """The plans of `plan`'s rollups: the parent's plan with the rollup's key, name and
    version. A session metric's and its parts' rollups (a session metric always has its
    total, `()`) keep its window kind (buckets, lateness, W) but hold no sessions: they are
    built from its keys' bucket cells."""
    part = None if plan.session_part is None else plan.session_part.part
    return tuple(
        replace(
            plan,
            name=rollup_name(plan.name, dims),
            version=_version(
                plan.config,
                plan.source,
                dims,
                tuple(lookup.table for lookup in plan.lookups),
                session_part=part,
            ),
            key=dims,
            rollups=(),
            rollup=Rollup(
                plan.name,
                dims,
                tuple(plan.key.index(d) for d in dims),
                of_sessions=plan.sessions is not None,
            ),
            session_part=None,
        )
        for dims in plan.rollups
    )


def compile_session_parts(plan: MetricPlan) -> tuple[MetricPlan, ...]:
    """The plans of a session metric's parts (`SessionPart`); none for another metric."""
    if plan.sessions is None:
        return ()
    parts = []
    for part, aggregations in SESSION_PART_AGGREGATIONS.items():
        config = plan.config.model_copy(
            update={
                "value": SESSION_DURATION if part == "sessions" else None,
                "aggregations": aggregations,
                "fields": (),
                "where": None,
                "lookups": (),
            }
        )
        compiled = compile_plan(config, plan.source)
        parts.append(
            replace(
                plan,
                name=session_part_name(plan.name, part),
                version=_version(
                    plan.config,
                    plan.source,
                    tables=tuple(lookup.table for lookup in plan.lookups),
                    session_part=part,
                ),
                value=compiled.value,
                aggregations=compiled.aggregations,
                sketch_inputs=compiled.sketch_inputs,
                session_part=SessionPart(plan.name, part),
            )
        )
    return tuple(parts)


@lru_cache(maxsize=16)
def compile_plans(
    sources: tuple[SourceConfig, ...],
    metrics: tuple[MetricConfig, ...],
    tables: tuple[TableConfig, ...] = (),
) -> Mapping[str, MetricPlan]:
    """Every metric's plan by name, in configured order, each followed by its rollups' plans
    (`MetricPlan.rollup`), compiled once per definition.

    Cached on the (frozen, hashable) source and metric tuples rather than on the settings
    object: `Settings` itself is not hashable (it holds dicts such as `spark.conf`), and a
    cache stored on the instance would be copied, stale, by `model_copy(update=...)`. Keyed on
    the definitions, a lookup can never answer for other definitions."""
    by_name = {s.name: s for s in sources}
    plans: dict[str, MetricPlan] = {}
    for metric in metrics:
        plan = compile_plan(metric, by_name[metric.source], tables)
        plans[plan.name] = plan
        plans.update((r.name, r) for r in compile_rollups(plan))
        for part in compile_session_parts(plan):
            plans[part.name] = part
            plans.update((r.name, r) for r in compile_rollups(part))
    return MappingProxyType(plans)


def read_plans(plans: Iterable[MetricPlan]) -> tuple[MetricPlan, ...]:
    """The plans read from the events (every configured metric; not the rollups, which are
    built from their parents' cells, nor the session parts, built from their sessions)."""
    return tuple(p for p in plans if p.rollup is None and p.session_part is None)


def versions_of(plans: Iterable[MetricPlan]) -> dict[str, str]:
    """Metric name -> version, as the served row records them."""
    return {p.name: p.version for p in plans}


def versions_digest(plans: Iterable[MetricPlan]) -> str:
    """One text for a set of metric versions (a speed fence records its source's): a digest of
    the versions, not of the definitions again."""
    pairs = ",".join(sorted(f"{p.name}={p.version}" for p in plans))
    return hashlib.sha256(pairs.encode()).hexdigest()[:12]
