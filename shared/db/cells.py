"""A row of the batch view (`batch_cells`), named: what publication writes and merges and what
the serving layer reads, with its conversion to and from the registry's `CellState`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.aggregations import CellState, SketchKind

CELL_COLUMNS = (
    "metric",
    "version",
    "window_ms",
    "start_ms",
    "key",
    "count",
    "sum",
    "min",
    "max",
    "sketches",
    "sketch_summaries",
)
"""`batch_cells`' columns besides `generation`, in `BatchCell` order."""


@dataclass(frozen=True, slots=True)
class BatchCell:
    """One stored cell: its identity, then its state's columns (min/max are NULL when no
    event carried a value; one sketch and one summary per sketch slot). Fields in
    `CELL_COLUMNS` order, so a selected row is `BatchCell(*row)`."""

    metric: str
    version: str
    window_ms: int
    start_ms: int
    key: Sequence[str]
    count: int
    sum: float
    min: float | None
    max: float | None
    sketches: Sequence[bytes]
    sketch_summaries: Sequence[float | None]

    @property
    def identity(self) -> tuple[str, str, int, int, tuple[str, ...]]:
        """What the table's key is made of (the generation aside)."""
        return (self.metric, self.version, self.window_ms, self.start_ms, tuple(self.key))

    def columns(self) -> tuple[Any, ...]:
        """The values in `CELL_COLUMNS` order (what COPY writes)."""
        return tuple(getattr(self, name) for name in CELL_COLUMNS)

    def state(self) -> CellState:
        return state_of_columns(
            self.count, self.sum, self.min, self.max, self.sketches, self.sketch_summaries
        )

    def with_state(self, state: CellState, kinds: Sequence[SketchKind]) -> BatchCell:
        """This cell's identity with `state` (its summaries computed from its sketches)."""
        sketches = list(state.sketches or [])
        return replace(
            self,
            count=state.count,
            sum=state.total,
            min=None if state.minimum == math.inf else state.minimum,
            max=None if state.maximum == -math.inf else state.maximum,
            sketches=sketches,
            sketch_summaries=[k.summary(b) for k, b in zip(kinds, sketches, strict=True)],
        )


def state_of_columns(
    count: int,
    total: float,
    minimum: float | None,
    maximum: float | None,
    sketches: Sequence[Any] | None,
    summaries: Sequence[float | None] | None,
) -> CellState:
    """A `CellState` from a batch row's state columns (`sketches` None when not selected)."""
    return CellState(
        count,
        total,
        math.inf if minimum is None else minimum,
        -math.inf if maximum is None else maximum,
        None if sketches is None else [bytes(b) for b in sketches],
        None if summaries is None else list(summaries),
    )
