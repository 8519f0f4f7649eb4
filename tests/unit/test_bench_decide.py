"""`bench/decide.py`'s columnar bound does the work `decide` does, or its figure would bound
nothing: over the same batches it folds the same events into the same (cell, key) groups
(duplicates and late events dropped alike)."""

from __future__ import annotations

from collections import Counter

from bench.decide import bench_input, columnar_pass, python_pass
from shared.aggregations import decode_state
from shared.speed_view.keys import cell_key_prefix, cell_of_key, decode_key


def test_the_columnar_bound_folds_the_cells_decide_writes() -> None:
    plan, records = bench_input(4_000)
    view = python_pass(plan, records, 700)
    folded = columnar_pass(plan, records, 700)
    for metric in plan.metrics:
        prefix = cell_key_prefix(plan.source.topic, 0, metric.name, metric.version)
        written: Counter[tuple[int, tuple[str, ...]]] = Counter()
        for name, fields in view.hashes.items():
            if name.startswith(prefix):
                start, _ = cell_of_key(name)
                for field, state in fields.items():
                    written[(start, decode_key(field))] = decode_state(state).count
        assert written, metric.name
        assert folded[metric.name] == written, metric.name
