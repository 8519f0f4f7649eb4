"""Lookup-table memory benchmark: the RSS a speed worker's copy of a table takes
(`shared.tables.TableVersions`, rule 11 in docs/semantics.md), and the cost of adding a version.

    .venv/bin/python bench/tables.py [--quick] [--keys N] [--versions V]

Default 1,000,000 keys x 3 versions (`--quick`: 200,000 keys). No stack needed: the bench runs
in a fresh Python subprocess (so the RSS is that of the table alone, over the interpreter and
the imports), which:

1. builds the records as the table's topic would hold them, 10,000 at a time (as many as the
   worker consumes at once; each lot is freed before the next), JSON objects
   `{"page": "/page/<i>", "section": ..., "title": ..., "valid_from": ...}`: every key's first
   version, then every key's second, and so on (a table updated over time), version `v` valid
   from `v` hours after the first;
2. applies each as the worker does (`speed_layer/tables.py` `TableFeeds._apply`):
   `parse_table_record` on the JSON bytes, `project` to the one path the metric reads
   (`("section",)`: `title` is dropped) and `TableVersions.add`, with the garbage collector as
   the worker has it then (its defaults: the worker reads its tables before `tune_gc`). Only
   this step is timed (`add_us`: microseconds per record; the collector's share is logged);
3. RSS (psutil) before step 1 and after step 2: `rss_mb` is the difference, `bytes_per_version`
   and `bytes_per_key` divide it by the versions and by the keys;
4. `prune(w)` with `w` before every version: it drops nothing, as each of the worker's calls
   (every `watermark_refresh_s`, 2 s, on its event loop) while the keys have versions after W:
   `prune_scan_s` (2.6 s for 1M keys when it visited every key; with its heap of due keys,
   what it costs is what it drops);
5. `prune(w)` with `w` the last version's valid-from time, so one version per key remains (as
   the worker prunes at the oldest W once every key's newest version is older than it):
   `prune_s`, `kept` (versions left), and the RSS again: `rss_after_prune_mb` (over the same
   baseline), then after returning the freed heap to the system (glibc `malloc_trim`)
   `rss_after_trim_mb`: CPython keeps the small objects it freed in its arenas, so a pruned
   worker's RSS shrinks less than its versions do.

Ends with one line:
`BENCH tables keys=<n> versions=<v> records=<n> rss_mb=<n> bytes_per_version=<n>
bytes_per_key=<n> add_us=<us> prune_scan_s=<s> prune_s=<s> kept=<n> rss_after_prune_mb=<n>
rss_after_trim_mb=<n>` (on one line).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHUNK = 10_000
"""Records built at a time: as many as the worker's table read consumes at once."""
HOUR = 3_600_000
BASE_MS = 1_780_000_000_000
SECTIONS = ["news", "sport", "tech", "culture", "business", "travel", "science", "opinion"]
READS = (("section",),)
"""The paths the metric reads of the table (`p.section`): `project` keeps only these."""


def table_records(
    keys: int, versions: int, valid_from: Callable[[int, int], int]
) -> Iterator[tuple[bytes, bytes]]:
    """The table's records (Kafka key, value): every key's first version, then every key's
    second, and so on (a table updated over time); version `v` of key `i` valid from
    `valid_from(i, v)`, its `section` one of `SECTIONS` (another for each version), with a
    `title` no metric reads. The values are exact-size bytes, as a consumed record's are
    (orjson's keep ~1 KB of slack, which would count in the RSS)."""
    for version in range(versions):
        for i in range(keys):
            page = f"/page/{i}"
            value = {
                "page": page,
                "section": SECTIONS[(i + version) % len(SECTIONS)],
                "title": f"Page {i}, revision {version}",
                "valid_from": valid_from(i, version),
            }
            yield page.encode(), json.dumps(value, separators=(",", ":")).encode()


def malloc_trim() -> bool:
    """Return the freed heap to the system (glibc); whether it could."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def measure(keys: int, versions: int) -> None:
    """The subprocess: build, measure, prune, measure; prints the BENCH line."""
    import psutil

    from bench.common import log
    from shared.config import TableConfig
    from shared.events import Malformed
    from shared.tables import TableVersions, parse_table_record, project

    table = TableConfig(name="pages", topic="pages", key_field="page", time_field="valid_from")
    process = psutil.Process()
    gc_s = [0.0, 0.0]  # collections' total seconds, start of the running one

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]

    gc.collect()
    before = process.memory_info().rss
    table_versions = TableVersions()
    gc.callbacks.append(on_gc)
    add_s = 0.0
    offset = 0
    produced = table_records(keys, versions, lambda i, v: BASE_MS + v * HOUR)
    while chunk := list(itertools.islice(produced, CHUNK)):
        timestamp = int(time.time() * 1000)
        started = time.perf_counter()
        for key, value in chunk:
            record = parse_table_record(key, value, timestamp, table)
            assert not isinstance(record, Malformed), record
            if record.fields is not None:
                record = record._replace(fields=project(record.fields, READS))
            table_versions.add(record, 0, offset)
            offset += 1
        add_s += time.perf_counter() - started
        del chunk
    gc.callbacks.remove(on_gc)
    built = process.memory_info().rss
    total = len(table_versions)
    assert total == keys * versions and table_versions.keys == keys, (total, keys)
    used = built - before
    log(
        f"{keys:,} keys x {versions} versions: {total:,} versions in {used / 2**20:,.0f} MB "
        f"({used / total:.0f} B/version, {used / keys:.0f} B/key); add {add_s:.1f} s "
        f"({add_s / total * 1e6:.2f} us/record, of which the collector {gc_s[0]:.1f} s)"
    )
    started = time.perf_counter()
    assert table_versions.prune(BASE_MS - 1) == 0
    scan_s = time.perf_counter() - started
    log(
        f"prune before every version (drops nothing, as each of the worker's calls every "
        f"`watermark_refresh_s` while its keys have versions after W): {scan_s:.2f} s"
    )
    w = BASE_MS + (versions - 1) * HOUR
    started = time.perf_counter()
    dropped = table_versions.prune(w)
    prune_s = time.perf_counter() - started
    kept = len(table_versions)
    assert kept == keys, (kept, keys)
    pruned = process.memory_info().rss
    trimmed = pruned
    if malloc_trim():
        trimmed = process.memory_info().rss
    log(
        f"prune at the last version's valid-from: {dropped:,} dropped in {prune_s:.2f} s, "
        f"{kept:,} kept; RSS over the baseline {(pruned - before) / 2**20:,.0f} MB "
        f"({(trimmed - before) / 2**20:,.0f} MB after malloc_trim); "
        f"baseline {before / 2**20:.0f} MB"
    )
    print(
        f"BENCH tables keys={keys} versions={versions} records={total} "
        f"rss_mb={used / 2**20:.0f} bytes_per_version={used / total:.0f} "
        f"bytes_per_key={used / keys:.0f} add_us={add_s / total * 1e6:.2f} "
        f"prune_scan_s={scan_s:.2f} prune_s={prune_s:.2f} kept={kept} "
        f"rss_after_prune_mb={(pruned - before) / 2**20:.0f} "
        f"rss_after_trim_mb={(trimmed - before) / 2**20:.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 keys")
    parser.add_argument("--keys", type=int, default=None, help="default 1,000,000")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    keys = args.keys or (200_000 if args.quick else 1_000_000)
    if args.versions < 1 or keys < 1:
        parser.error("--keys and --versions must be at least 1")
    if args.child:
        measure(keys, args.versions)
        return
    command = [sys.executable, __file__, "--child", "--keys", str(keys)]
    sys.exit(subprocess.call([*command, "--versions", str(args.versions)]))


if __name__ == "__main__":
    main()
