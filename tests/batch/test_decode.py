"""The pyarrow.json fast path decodes exactly what the shared parser decodes: the same rows,
the same malformed and skipped reasons, for clean blocks and for blocks salted with edge cases."""

from __future__ import annotations

import json
import random

import orjson
import pyarrow as pa
import pytest

from batch_layer.decode import Decoder
from batch_layer.kafka_source import Records
from batch_layer.lookups import _versions
from batch_layer.raw_reads import RawRead, arrow_columns, python_columns
from lambdactl.generator import GeneratorSpec, generate
from shared.config import Settings, TableConfig
from tests.conftest import platform_config

NOW = 1_780_000_000_000
SETTINGS = Settings(**platform_config("decode"))
SOURCE = SETTINGS.sources[0]
METRICS = SETTINGS.plans_of(SOURCE)

EDGE_CASES: list[bytes | None] = [
    None,
    b"",
    b"not json",
    b"[1, 2]",
    b"5",
    b'{"ts": 1780000000000, "event_id": "a", "page": "/p", "user_id": "u", "latency_ms": true}',
    b'{"ts": 1780000000000, "event_id": "b", "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "c", "page": "/p", "user_id": "u", "latency_ms": 1e999}',
    b'{"ts": 1780000000000, "event_id": "d", "page": "/p", "user_id": "u", "latency_ms": NaN}',
    b'{"ts": 1780000000000, "event_id": "e", "page": "/p", "user_id": "u", "latency_ms": 1e300}',
    b'{"ts": 1780000000000, "event_id": "f", "page": "/p", "user_id": "u", '
    b'"latency_ms": 99999999999999999999999}',
    b'{"ts": 1780000000000, "event_id": "g", "page": "/p", "user_id": "u", '
    b'"latency_ms": 9007199254740993}',
    b'{"ts": 1780000000000.0, "event_id": "h", "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": "2026-05-28T20:26:40Z", "event_id": "i", "page": "/p", "user_id": "u", '
    b'"latency_ms": 1}',
    b'{"ts": "2026-05-28T20:26:40.1234567Z", "event_id": "j", "page": "/p", "user_id": "u"}',
    b'{"ts": "2026-05-28 20:26:40Z", "event_id": "k", "page": "/p", "user_id": "u"}',
    b'{"ts": "2026-05-28T20:26:40+25:00", "event_id": "l", "page": "/p", "user_id": "u"}',
    b'{"ts": 1780000000000, "ts": 1, "event_id": "m", "page": "/p", "user_id": "u", '
    b'"latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "n", "event_id": "n2", "page": "/p", "user_id": "u", '
    b'"latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": 17, "page": 3, "user_id": 4, "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": 1.5, "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "o", "page": null, "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "q", "page": "/p", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "r", "page": "/p", "user_id": "u"}',
    b'{"ts": 1780000000000, "event_id": "s", "page": "/\\u00e9", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "t", "page": "\\ud800", "user_id": "u", "latency_ms": 1}',
    '{"ts": 1780000000000, "event_id": "u", "page": "/é", "user_id": "ü"}'.encode(),
    b'{"ts": 1780000000000, "event_id": "v", "page": "/\xff", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "w", "page": "/p", "user_id": "u", "latency_ms": 1}'
    b'{"ts": 1780000000000, "event_id": "w2", "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000,\n "event_id": "x", "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 1780000000000, "event_id": "y", "page": "/p", "user_id": "u", "latency_ms": 1}  ',
    b'{"ts": 9780000000000, "event_id": "z", "page": "/p", "user_id": "u", "latency_ms": 1}',
    b'{"ts": 99999999999999999, "event_id": "z1", "page": "/p", "user_id": "u"}',
    b'{"ts": -62135596800001, "event_id": "z2", "page": "/p", "user_id": "u"}',
    b'{"nested": {"ts": 1780000000000}, "event_id": "z3", "page": "/p", "user_id": "u"}',
    b'{"ts": 1780000000000, "event_id": "z4", "page": "/p", "user_id": "u", "latency_ms": 1,'
    b' "extra": [1, {"a": 99999999999999999999999}], "page2": "x"}',
    b'{"ts": 1780000000000, "event_id": "z5", "page": "/p", "user_id": "u", "latency_ms": -0.0}',
    b'{"ts": 1780000000000, "event_id": "z6", "page": "/p", "user_id": "u", "latency_ms": 1} x',
    b'{"ts": true, "event_id": "z7", "page": "/p", "user_id": "u"}',
    b'{"ts": 1780000000000, "event_id": "z8", "page": "/p", "user_id": "u", "latency_ms": "3"}',
    *(  # nesting the shared parser refuses (RecursionError) and pyarrow reads
        b'{"ts": 1780000000000, "event_id": "z9", "page": "/p", "user_id": "u", "latency_ms": 1'
        + b', "deep": '
        + b"[" * depth
        + b"]" * depth
        + b"}"
        for depth in (600, 2000)
    ),
]


def _decode(block: list[bytes | None], *, fast: bool) -> tuple[pa.Table, Decoder]:
    decoder = Decoder(SOURCE, METRICS, fast=fast)
    offsets = list(range(len(block)))
    batches = list(decoder.decode(0, offsets, [NOW] * len(block), block))
    table = pa.Table.from_batches(batches).sort_by("offset")
    return table, decoder


def _clean(n: int, seed: int) -> list[bytes | None]:
    spec = GeneratorSpec(NOW - 3_600_000, NOW, n, duplicate_fraction=0.0, seed=seed)
    return [r.value for r in generate(spec)]


def test_clean_blocks_take_the_fast_path() -> None:
    block = _clean(3000, 1)
    fast, decoder = _decode(block, fast=True)
    slow, _ = _decode(block, fast=False)
    assert decoder.fast_records == 3000 and decoder.slow_records == 0
    assert fast.equals(slow)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_salted_blocks_agree_with_the_shared_parser(seed: int) -> None:
    rng = random.Random(seed)
    block = _clean(20000, seed)
    for case in EDGE_CASES:
        block.insert(rng.randrange(len(block) + 1), case)
    fast, decoder = _decode(block, fast=True)
    slow, _ = _decode(block, fast=False)
    assert decoder.fast_records > 8000, "clean neighbourhoods still take the fast path"
    assert fast.to_pylist() == slow.to_pylist()


def test_scattered_malformed_records_alone_take_the_slow_path() -> None:
    """The soak's mix: one record in 200 malformed, so every block holds some. Only they go
    through the shared parser (splitting refused blocks in halves sent ~70% there)."""
    spec = GeneratorSpec(NOW - 3_600_000, NOW, 20000, malformed_fraction=0.005, seed=4)
    block: list[bytes | None] = [r.value for r in generate(spec)]
    fast, decoder = _decode(block, fast=True)
    slow, _ = _decode(block, fast=False)
    malformed = len(block) - slow.column("malformed").null_count
    assert malformed > 50
    assert decoder.slow_records == malformed
    assert fast.to_pylist() == slow.to_pylist()


@pytest.mark.parametrize("case", EDGE_CASES)
def test_each_edge_case_alone(case: bytes | None) -> None:
    block = [*_clean(3, 9), case]
    fast, _ = _decode(block, fast=True)
    slow, _ = _decode(block, fast=False)
    assert fast.to_pylist() == slow.to_pylist()


def test_random_floats_decode_identically() -> None:
    rng = random.Random(5)
    block: list[bytes | None] = []
    for i in range(3000):
        value = rng.choice(
            [rng.random() * 10 ** rng.randint(-300, 15), rng.randint(-(10**15), 10**15)]
        )
        block.append(
            orjson.dumps(
                {
                    "ts": NOW - i,
                    "event_id": f"f{i}",
                    "page": "/p",
                    "user_id": "u",
                    "latency_ms": value,
                }
            )
        )
    fast, decoder = _decode(block, fast=True)
    slow, _ = _decode(block, fast=False)
    assert decoder.fast_records == 3000
    assert fast.to_pylist() == slow.to_pylist()


DEFINED = Settings(
    **{
        **platform_config("decode"),
        "metrics": [
            {
                "name": "defined",
                "source": "pageviews",
                "key": ["geo.country", "section"],
                "value": "latency_ms",
                "fields": {
                    "section": "CASE WHEN page LIKE '/page/%' THEN 'pages' ELSE page END",
                    "berlin_hour": "hour(ts, 'Europe/Berlin')",
                    "at_hour": "hour(at, 'America/New_York')",
                    "twice": "n * 2",
                    "on": "flag OR n > 3",
                },
                "where": "latency_ms >= 0 OR page IS NULL",
                "aggregations": ["count", "sum", "distinct(user_id)"],
                "windows": ["1h"],
            }
        ],
    }
)
DEFINED_METRICS = DEFINED.plans_of(DEFINED.sources[0])
_BASE = b'"ts": 1780000000000, "event_id": "d", "page": "/p", "user_id": "u", "latency_ms": 1.5'
DEFINED_EDGE_CASES: list[bytes | None] = [
    b"{" + _BASE + b', "geo": {"country": "de"}, "n": 4, "flag": true, "at": 1780000000000}',
    b"{" + _BASE + b', "geo": {"country": 7}, "n": 4.0, "flag": 1}',  # 4.0 is a DOUBLE
    b"{" + _BASE + b', "geo": {"country": 99999999999999999999999}, "n": 1E2}',
    b"{" + _BASE + b', "geo": "de", "n": 9223372036854775807}',
    b"{" + _BASE + b', "geo": null, "n": -9223372036854775809}',
    b"{" + _BASE + b', "geo": {"country": null}, "n": 9007199254740993}',
    b"{" + _BASE + b', "geo": {"country": "x", "country": "y"}}',
    b"{" + _BASE + b', "geo": {}, "at": 1780000000000.5, "user_id": 12}',
    b"{" + _BASE + b', "geo": [], "at": "2026-01-01T00:00:00Z", "user_id": 1.5}',
    b"{" + _BASE + b', "geo": {"country": "de"}, "deep": ' + b"[" * 600 + b"]" * 600 + b"}",
    b"{" + _BASE + b', "geo": {"country": "de"}, "deep": ' + b"[" * 2000 + b"]" * 2000 + b"}",
    b'{"ts": 1780000000000, "event_id": "d", "page": "/p", "latency_ms": 3, "n": -0.0}',
    b'{"ts": 1780000000000, "event_id": "d", "page": 5, "latency_ms": 300000000000000000000}',
]


def _defined_block(n: int, seed: int) -> list[bytes | None]:
    """Generator events with the fields the `defined` metric reads, some as integers."""
    rng = random.Random(seed)
    block: list[bytes | None] = []
    for value in _clean(n, seed):
        event = orjson.loads(value)  # type: ignore[arg-type]
        event.update(n=rng.randrange(-5, 10), flag=rng.random() < 0.5, at=event["ts"] - 5)
        if rng.random() < 0.01:
            event["latency_ms"] = rng.randrange(100)  # an integer in a DOUBLE column
        block.append(orjson.dumps(event))
    return block


def _decode_defined(block: list[bytes | None], *, fast: bool) -> list[dict[str, object]]:
    decoder = Decoder(DEFINED.sources[0], DEFINED_METRICS, fast=fast)
    offsets = list(range(len(block)))
    batches = list(decoder.decode(0, offsets, [NOW] * len(block), block))
    return pa.Table.from_batches(batches).sort_by("offset").to_pylist()


def test_raw_reads_of_a_clean_block_come_from_one_arrow_parse() -> None:
    """The columns the definitions read (rule 10) from pyarrow, integers written in a DOUBLE
    column read again record by record: the same as reading every record in Python."""
    layout = Decoder(DEFINED.sources[0], DEFINED_METRICS).layout
    assert {r.path for r in layout.raw} >= {("geo", "country"), ("n",), ("at",), ("flag",)}
    assert len(layout.zones) == 2
    block = _defined_block(3000, 3)
    times = pa.array([orjson.loads(v)["ts"] for v in block], pa.int64())  # type: ignore[arg-type]
    fast = arrow_columns(layout.raw, layout.zones, block, times)
    assert fast is not None, "a clean block is read by pyarrow"
    slow = python_columns(layout.raw, layout.zones, block, times.to_pylist())
    assert [c.to_pylist() for c in fast] == [c.to_pylist() for c in slow]


@pytest.mark.parametrize("seed", [1, 2])
def test_raw_reads_of_salted_blocks_agree_with_the_shared_parser(seed: int) -> None:
    rng = random.Random(seed)
    block = _defined_block(5000, seed)
    for case in [*EDGE_CASES, *DEFINED_EDGE_CASES]:
        block.insert(rng.randrange(len(block) + 1), case)
    assert _decode_defined(block, fast=True) == _decode_defined(block, fast=False)


@pytest.mark.parametrize("case", DEFINED_EDGE_CASES)
def test_each_raw_read_edge_case_alone(case: bytes | None) -> None:
    block = [*_defined_block(3, 9), case]
    assert _decode_defined(block, fast=True) == _decode_defined(block, fast=False)


TABLE = TableConfig(name="pages", topic="pages", key_field="page", time_field="from")
TABLE_READS = [RawRead(("section",), True, True, True), RawRead(("rank",), True, True, True)]


@pytest.mark.parametrize(("seed", "salted"), [(0, 0.0), (1, 0.0), (2, 0.01), (3, 0.3)])
def test_table_versions_decode_alike_with_and_without_the_fast_path(
    seed: int, salted: float
) -> None:
    """A table block's version rows (`batch_layer.lookups._versions`) are the same whether
    its read columns come through pyarrow or record by record (`spark.fast_path` off); a
    clean block takes the fast path."""
    rng = random.Random(seed)
    values: list[bytes | None] = []
    for i in range(300):
        record = {"page": f"/p/{i % 40}", "from": NOW + i, "section": f"s{i % 7}", "rank": i}
        if rng.random() < salted:
            record[rng.choice(["section", "rank", "page", "from"])] = rng.choice(
                [None, 7, 2.5, True, "x", 2**70, [1], {"a": 1}]
            )
        odd = rng.random() < salted / 10  # a tombstone or a value that is not an object
        values.append(rng.choice([None, b"5"]) if odd else json.dumps(record).encode())
    keys = [f"/p/{i % 40}".encode() for i in range(len(values))]
    batch = Records(list(range(len(values))), [NOW] * len(values), values, keys)
    fast = _versions(TABLE, TABLE_READS, 0, batch, fast=True)
    slow = _versions(TABLE, TABLE_READS, 0, batch, fast=False)
    assert fast.to_pylist() == slow.to_pylist()
    if not salted:
        assert arrow_columns(TABLE_READS, (), values, pa.array([NOW] * len(values))) is not None
