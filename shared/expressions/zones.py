"""The IANA time zones the language knows (`hour(ts, 'Europe/Berlin')`): those of the pinned
`tzdata` package, read from it alone. zoneinfo would read the host's `/usr/share/zoneinfo`
first, so two hosts (a speed worker and a Spark executor) could hold different editions, and
would accept names that are not zones (`localtime`, the host's own; `posix/...`, `right/...`
with leap seconds). One database for every process of both layers keeps them agreeing."""

from __future__ import annotations

from functools import cache
from importlib import resources
from zoneinfo import ZoneInfo

_IANA = frozenset(resources.files("tzdata").joinpath("zones").read_text().split())


def zone_info(name: str) -> ZoneInfo | None:
    """The zone named `name` from the `tzdata` package, or None when it names none (any text,
    a query parameter's included: only known names are loaded and kept)."""
    return _load(name) if name in _IANA else None


@cache
def _load(name: str) -> ZoneInfo:
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as data:
        return ZoneInfo.from_file(data, key=name)
