"""The speed layer's `decide` in process, per event, beside the least a columnar `decide` of the
same batches could cost: how much of the worker's time per event a columnar design could take
away at best.

    .venv/bin/python bench/decide.py [--events N] [--batch B] [--rounds R]

No services. The speed bench's events (`lambdactl.generator`: 2% late, 2% duplicates) as one
partition's records, the bench's metrics (`platform_config`: `views_by_page` with two sketches,
`views_total`), the speed view in memory (`MemoryView`, as `decide` reads Redis), the
collector paused as the worker pauses it. Then R rounds, each timing both over every batch of
B records (process CPU):

1. `python`: `speed_layer.processor.decide` batch after batch, each batch's writes kept in the
   memory view (the stored states the next batch merges into, the de-dup ids it checks);
2. `columnar_bound`: one `pyarrow.json` read per batch with an explicit schema of the fields the
   metrics read, the source-level checks on whole columns (nulls, lengths, magnitudes), the
   stream time as of each event (`np.maximum.accumulate`) and rule 2's lateness with numpy, the
   de-dup markers in a Python set, Arrow's `group_by` per metric (by base cell and key, each
   sketch's items as lists), then the same `fold_inputs` and `encode_state` per group as
   `decide`. It leaves out the rest of `decide` (merging into the stored states, the ids'
   bookkeeping, the late events' list, skip counters), refuses nothing (the bench's events are
   clean) and parses with pyarrow, which the speed layer may not ("Event validity" in
   docs/semantics.md: it parses with the shared parser): a lower bound, not a design.
   `tests/unit/test_bench_decide.py` holds it to the (cell, key) groups and counts `decide`
   writes, so it bounds the same work.

Ends with `BENCH decide events=<n> batch=<b> python_us=<µs> columnar_bound_us=<µs>
bound_ratio=<columnar_bound / python>` (each the best round's CPU per event).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batch_layer.json_lines import json_lines
from bench.common import log
from lambdactl.generator import GeneratorSpec, generate
from shared.aggregations import encode_state, fold_inputs
from shared.config import Settings
from shared.events import MAX_TEXT_BYTES, VALUE_LIMIT
from shared.gc_tuning import collector_paused, freeze_startup_objects
from shared.lateness import latest_late_start
from shared.metric_plan import MetricPlan
from shared.speed_view import Fence
from shared.windows import window_start
from speed_layer.processor import RawRecord, SourcePlan, decide
from speed_layer.rejoin import MemoryView
from tests.conftest import platform_config

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000


CellCounts = Counter[tuple[int, tuple[str, ...]]]
"""Events folded per (base cell start, key)."""


def bench_input(events: int) -> tuple[SourcePlan, list[RawRecord]]:
    """The speed bench's metrics and events, as one partition's records."""
    settings = Settings(**platform_config("decide-bench", partitions=1))
    plan = SourcePlan.of(settings, settings.sources[0])
    spec = GeneratorSpec(NOW_MS - HOUR_MS, NOW_MS, events)
    return plan, [RawRecord(i, NOW_MS, r.value) for i, r in enumerate(generate(spec))]


def python_pass(plan: SourcePlan, records: Sequence[RawRecord], batch: int) -> MemoryView:
    view = MemoryView()
    fence = Fence(None, None, plan.defs)
    for i in range(0, len(records), batch):
        outcome, writes = decide(plan, 0, fence, records[i : i + batch], {}, view)
        view.write(writes)
        fence = outcome.fence
    return view


def arrow_schema(plan: SourcePlan) -> pa.Schema:
    """The fields the plan's metrics read, typed as the bench's events carry them."""
    source = plan.source
    fields = {source.time_field: pa.int64()}
    if source.id_field is not None:
        fields[source.id_field] = pa.string()
    for metric in plan.metrics:
        if metric.definitions is not None or metric.sessions is not None:
            raise SystemExit(f"the columnar bound covers plain metrics only: {metric.name}")
        fields.update((name, pa.string()) for name in metric.key)
        if metric.value is not None:
            fields[metric.value] = pa.float64()
        for slot in metric.sketch_inputs:
            fields.setdefault(slot.field, pa.float64() if slot.number else pa.string())
    return pa.schema(list(fields.items()))


def columnar_pass(
    plan: SourcePlan, records: Sequence[RawRecord], batch: int
) -> dict[str, CellCounts]:
    """The events each metric folds per (cell, key), summed over the batches (`decide`'s stored
    counts after the same batches)."""
    source = plan.source
    counts: dict[str, CellCounts] = {metric.name: Counter() for metric in plan.metrics}
    seen: set[tuple[int, str]] = set()  # the ids of earlier batches too, as Redis holds them
    schema = arrow_schema(plan)
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pj.ReadOptions(use_threads=False, block_size=1 << 26)
    texts = [f.name for f in schema if f.type == pa.string()]
    numbers = [f.name for f in schema if f.type == pa.float64()]
    stream_time = -(2**63)
    for i in range(0, len(records), batch):
        chunk = records[i : i + batch]
        data = json_lines([r.value for r in chunk])  # the batch layer's screen for pyarrow
        if data is None:
            raise SystemExit("the columnar bound reads clean batches only")
        table = pj.read_json(pa.py_buffer(data), read_options=read, parse_options=parse)
        times = table.column(source.time_field).to_numpy()
        created = np.fromiter((r.timestamp for r in chunk), np.int64, len(chunk))
        clean = (
            table.num_rows == len(chunk)
            and not any(table.column(name).null_count for name in schema.names)
            and bool(np.all(times <= created + source.max_future))
            and all(
                pc.max(pc.binary_length(table.column(name))).as_py() <= MAX_TEXT_BYTES
                for name in texts
            )
            and all(
                bool(np.all(np.abs(table.column(name).to_numpy()) < VALUE_LIMIT))
                for name in numbers
            )
        )
        if not clean:
            raise SystemExit("the columnar bound reads clean batches only")
        as_of = np.maximum.accumulate(np.concatenate(([stream_time], times)))[1:]
        stream_time = int(as_of[-1])
        kept = np.ones(len(chunk), bool)
        if source.id_field is not None:
            buckets = window_start(times, plan.id_bucket_ms).tolist()
            ids = table.column(source.id_field).to_pylist()
            for j, marker in enumerate(zip(buckets, ids, strict=True)):
                if marker in seen:
                    kept[j] = False
                seen.add(marker)
        for metric in plan.metrics:
            counts[metric.name].update(_fold_metric(metric, table, times, as_of, kept))
    return counts


def _fold_metric(
    metric: MetricPlan, table: pa.Table, times: np.ndarray, as_of: np.ndarray, kept: np.ndarray
) -> CellCounts:
    base = metric.base_window_ms
    starts = window_start(times, base)
    on_time = kept & (starts > latest_late_start(base, metric.grace_ms, as_of, None))  # rule 2
    rows = table.filter(pa.array(on_time)).append_column("cell", pa.array(starts[on_time]))
    value = metric.value
    read = [value] if value else []
    lists = list(dict.fromkeys([*read, *(s.field for s in metric.sketch_inputs)]))
    lists = lists or [table.column_names[0]]  # a count alone: any column's lists give sizes
    groups = rows.group_by(["cell", *metric.key], use_threads=False).aggregate(
        [(name, "list") for name in lists]
    )
    columns = {name: groups.column(f"{name}_list").to_pylist() for name in lists}
    slots = [columns[s.field] for s in metric.sketch_inputs]
    values = columns[value] if value else None
    cells = groups.column("cell").to_pylist()
    keys = list(zip(*(groups.column(d).to_pylist() for d in metric.key), strict=True))
    folded: CellCounts = Counter()
    for g, first in enumerate(columns[lists[0]]):
        folded[(cells[g], keys[g] if keys else ())] = len(first)
        encode_state(
            fold_inputs(
                metric.kinds,
                None,
                None if values is None else values[g],
                [slot[g] for slot in slots],
                len(first),
            )
        )
    return folded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plan, records = bench_input(args.events)
    passes: dict[str, Callable[[SourcePlan, Sequence[RawRecord], int], object]] = {
        "python": python_pass,
        "columnar_bound": columnar_pass,
    }
    best = dict.fromkeys(passes, float("inf"))
    freeze_startup_objects(50_000)
    for round_ in range(args.rounds):
        for name, run in passes.items():
            with collector_paused():
                started = time.process_time()
                run(plan, records, args.batch)
                per_event = (time.process_time() - started) / len(records) * 1e6
            best[name] = min(best[name], per_event)
            log(f"round {round_ + 1}: {name} {per_event:.2f} µs of CPU per event")
    print(
        f"BENCH decide events={len(records)} batch={args.batch} "
        f"python_us={best['python']:.2f} columnar_bound_us={best['columnar_bound']:.2f} "
        f"bound_ratio={best['columnar_bound'] / best['python']:.3f}"
    )


if __name__ == "__main__":
    main()
