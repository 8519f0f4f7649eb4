"""What an SQL aggregate reads of a metric's cells (docs/sql.md): the output of a configured
aggregation (`COUNT(*)` -> `count`, `APPROX_PERCENTILE(f, q)` -> `p<100 q>`), and of a session
metric the session outputs first (`COUNT(*)` -> `sessions`)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp

from serving_layer.sql.statement import SqlError
from shared.aggregations import quantile_name
from shared.metric_plan import MetricPlan

_PLAIN = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}


def aggregate_output(metric: MetricPlan, node: exp.Expression, quantiles: list[Decimal]) -> str:
    """The output name an aggregate call reads (`count`, `sum`, `distinct_f`, `p99`; of a
    session metric, `sessions`, `bounces`, `duration_*_s` first)."""
    metric = metric
    outputs = {a.spec for a in metric.aggregations.aggregations}
    if metric.sessions is not None:
        session_output = _session_output(node, outputs, quantiles)
        if session_output is not None:
            return session_output
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Star) and "count" in outputs:
            return "count"
        if isinstance(arg, exp.Distinct):
            raise SqlError(
                "distinct counts are estimates here: write APPROX_COUNT_DISTINCT(<field>)",
                node,
            )
    for kind, name in _PLAIN.items():
        if isinstance(node, kind) and _is_value(metric, node.this) and name in outputs:
            return name
    field = node.this.name if isinstance(node.this, exp.Column) else None
    if isinstance(node, exp.ApproxDistinct) and f"distinct({field})" in outputs:
        return f"distinct_{field}"
    args = node.expressions
    percentile = isinstance(node, exp.Anonymous) and node.name.upper() == "APPROX_PERCENTILE"
    if percentile and len(args) == 2 and isinstance(args[0], exp.Column):
        q = _fraction(args[1])
        if f"quantiles({args[0].name})" in outputs:
            quantiles.append(q)
            return quantile_name(q)
    raise SqlError(
        f"{metric.name} cannot answer {node.sql('postgres')}: {answerable(metric)}", node
    )


def _session_output(
    node: exp.Expression, outputs: set[str], quantiles: list[Decimal]
) -> str | None:
    """A session output (rule 13) an aggregate over the sessions reads, or None: COUNT(*)
    the sessions, COUNT(*) FILTER (WHERE events = 1) the bounces, SUM(events) the events
    (the metric's `count`), AVG/SUM/MAX(duration_s) and APPROX_PERCENTILE(duration_s, q)
    their durations; any other aggregate is over the sessions' events, as a metric's."""
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.Count):
        condition = node.expression.this if isinstance(node.expression, exp.Where) else None
        one = exp.EQ(this=exp.column("events"), expression=exp.Literal.number(1))
        if isinstance(node.this.this, exp.Star) and condition == one:
            return "bounces"
        raise SqlError("a bounce is COUNT(*) FILTER (WHERE events = 1)", node)
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
        return "sessions"
    column = node.this.name if isinstance(node.this, exp.Column) else None
    if isinstance(node, exp.Sum) and column == "events" and "count" in outputs:
        return "count"
    durations = {exp.Avg: "avg", exp.Sum: "sum", exp.Max: "max"}
    for kind, name in durations.items():
        if isinstance(node, kind) and column == "duration_s":
            return f"duration_{name}_s"
    args = node.expressions
    percentile = isinstance(node, exp.Anonymous) and node.name.upper() == "APPROX_PERCENTILE"
    durations_at = percentile and len(args) == 2 and isinstance(args[0], exp.Column)
    if durations_at and args[0].name == "duration_s":
        q = _fraction(args[1])
        quantiles.append(q)
        return f"duration_{quantile_name(q)}_s"
    return None


def _is_value(metric: MetricPlan, node: exp.Expression | None) -> bool:
    return isinstance(node, exp.Column) and node.name == metric.value


def answerable(metric: MetricPlan) -> str:
    """What a metric's table answers, as the aggregates to write."""
    value = metric.value
    calls = []
    for aggregation in metric.aggregations.aggregations:
        spec = aggregation.spec
        if spec == "count":
            calls.append("COUNT(*)")
        elif spec in ("sum", "min", "max", "avg"):
            calls.append(f"{spec.upper()}({value})")
        elif spec.startswith("distinct("):
            calls.append(f"APPROX_COUNT_DISTINCT({aggregation.field})")
        elif spec.startswith("quantiles("):
            calls.append(f"APPROX_PERCENTILE({aggregation.field}, <q in (0, 1)>)")
    if metric.sessions is not None:
        calls = [
            "COUNT(*) (sessions)",
            "COUNT(*) FILTER (WHERE events = 1) (bounces)",
            "AVG/SUM/MAX(duration_s)",
            "APPROX_PERCENTILE(duration_s, <q>)",
            *(
                ["SUM(events)"]
                if "count" in {a.spec for a in metric.aggregations.aggregations}
                else []
            ),
            *[c for c in calls if c != "COUNT(*)"],
        ]
    return "it answers " + ", ".join(calls)


def _fraction(node: exp.Expression) -> Decimal:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            q = Decimal(str(node.this))
        except InvalidOperation:
            q = Decimal(0)
        if 0 < q < 1:
            return q
    raise SqlError("APPROX_PERCENTILE's fraction is a number in (0, 1), e.g. 0.99", node)
