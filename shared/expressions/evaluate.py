"""The semantics of expressions on Python values (rule 10 in docs/semantics.md).

The scalar functions below define the language for Python values (`syntax.Scalar`): every
failure — a kind an operator does not take, an overflow, a division by zero, a non-finite
result — is NULL (None), never an exception. The speed layer's evaluator (`pycode`, generated
Python) calls them; the batch layer's Spark compiler implements the same functions on columns,
and the tests hold the two to identical answers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

from shared.expressions.syntax import (
    BIGINT_MAX,
    BIGINT_MIN,
    MAX_EVENT_MS,
    MIN_EVENT_MS,
    TIME_FUNCTIONS,
    ArithOp,
    CompareOp,
    Function,
    Kind,
    LikePattern,
    Scalar,
)
from shared.expressions.zones import zone_info

MISSING: Any = object()
"""What `read_path` returns for a path the event does not have."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TWO_63 = 2.0**63


def read_path(fields: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The JSON value at `path`, or MISSING when a step is absent or not an object."""
    node: Any = fields
    for part in path:
        if type(node) is not dict:
            return MISSING
        node = node.get(part, MISSING)
        if node is MISSING:
            return MISSING
    return node


def from_json(raw: Any) -> Scalar:
    """A JSON value as the language reads it: a string, a boolean, an integer within 64 bits
    as BIGINT, any other finite number as DOUBLE; null, objects, arrays, MISSING and numbers
    beyond a double's range are NULL."""
    kind = type(raw)
    if kind is str or kind is bool:
        return raw
    if kind is int:
        if BIGINT_MIN <= raw <= BIGINT_MAX:
            return raw
        try:
            return float(raw)
        except OverflowError:
            return None
    if kind is float:
        return raw if math.isfinite(raw) else None
    return None


def _number(x: Scalar) -> bool:
    kind = type(x)
    return kind is int or kind is float


def _bigint(x: int) -> int | None:
    return x if BIGINT_MIN <= x <= BIGINT_MAX else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def arith(op: ArithOp, a: Scalar, b: Scalar) -> Scalar:
    """`a op b`: BIGINT when both are BIGINT (except `/`, always DOUBLE), else DOUBLE."""
    if not (_number(a) and _number(b)):
        return None
    x: Any = a
    y: Any = b
    if op is ArithOp.DIV:
        return None if y == 0 else _finite(float(x) / float(y))
    if type(x) is int and type(y) is int:
        if op is ArithOp.ADD:
            return _bigint(x + y)
        if op is ArithOp.SUB:
            return _bigint(x - y)
        if op is ArithOp.MUL:
            return _bigint(x * y)
        if y == 0:
            return None
        remainder = abs(x) % abs(y)
        return -remainder if x < 0 else remainder
    fx, fy = float(x), float(y)
    if op is ArithOp.ADD:
        return _finite(fx + fy)
    if op is ArithOp.SUB:
        return _finite(fx - fy)
    if op is ArithOp.MUL:
        return _finite(fx * fy)
    return None if fy == 0 else math.fmod(fx, fy)


def negate(a: Scalar) -> Scalar:
    if type(a) is int:
        return _bigint(-a)
    if type(a) is float:
        return -a
    return None


def compare(op: CompareOp, a: Scalar, b: Scalar) -> bool | None:
    """Numbers with numbers (a BIGINT against a DOUBLE as DOUBLE), strings with strings (by
    code point), booleans with booleans (FALSE < TRUE); anything else is NULL."""
    ka, kb = type(a), type(b)
    x: Any
    y: Any
    if ka is kb and ka is not type(None):
        x, y = a, b
    elif _number(a) and _number(b):
        x, y = float(a), float(b)  # type: ignore[arg-type]
    else:
        return None
    if op is CompareOp.EQ:
        return bool(x == y)
    if op is CompareOp.NE:
        return bool(x != y)
    if op is CompareOp.LT:
        return bool(x < y)
    if op is CompareOp.LE:
        return bool(x <= y)
    if op is CompareOp.GT:
        return bool(x > y)
    return bool(x >= y)


def cast(a: Scalar, to: Kind) -> Scalar:
    """`CAST(a AS to)`: text converts only when it is exactly a number's (or 'true'/'false'),
    a DOUBLE to BIGINT truncates within range, a DOUBLE has no text; else NULL."""
    if a is None:
        return None
    if to is Kind.BIGINT:
        return _to_bigint(a)
    if to is Kind.DOUBLE:
        if isinstance(a, str):
            return _finite(float(a)) if _DECIMAL_TEXT.fullmatch(a) else None
        return float(a)
    if to is Kind.STRING:
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, float):
            return None
        return a if isinstance(a, str) else str(a)
    if isinstance(a, str):
        return {"true": True, "false": False}.get(a)
    return a != 0


def _to_bigint(a: bool | int | float | str) -> int | None:
    if isinstance(a, str):
        if not _INTEGER_TEXT.fullmatch(a):
            return None
        digits = a.lstrip("+-").lstrip("0")
        if len(digits) > 19:  # beyond 64 bits (and int() refuses texts of 4,300+ digits)
            return None
        value = int(digits or "0")
        return _bigint(-value if a[0] == "-" else value)
    if isinstance(a, float):
        return int(a) if -_TWO_63 <= a < _TWO_63 else None
    return int(a)


@cache
def like_regex(pattern: LikePattern) -> re.Pattern[str]:
    """The pattern as a regular expression matched against the whole text."""
    body = "".join(
        (".*" if part == "%" else ".") if wild else re.escape(part)
        for part, wild in zip(pattern.parts, pattern.wildcard, strict=True)
    )
    return re.compile(body, re.DOTALL)


def round_half_away(x: float) -> float:
    """The integral DOUBLE nearest `x`, halves away from zero (exact: no `x + 0.5`)."""
    low = math.floor(x)
    return float(low + 1 if x - low > 0.5 or (x - low == 0.5 and x > 0) else low) if x == x else x


def call(function: Function, args: list[Scalar], zone: str | None) -> Scalar:
    first = args[0]
    if function in _TEXT_FUNCTIONS:
        if type(first) is not str:
            return None
        text: str = first
        if function is Function.LOWER:
            return text.translate(_ASCII_LOWER)
        if function is Function.UPPER:
            return text.translate(_ASCII_UPPER)
        if function is Function.TRIM:
            return text.strip(" ")
        if function is Function.LENGTH:
            return len(text)
        return _substr(text, args[1:])
    if function in TIME_FUNCTIONS:
        return _date_part(function, first, 0 if zone is None else zone_offset_ms(first, zone))
    if type(first) is int:
        if function is Function.ABS:
            return _bigint(abs(first))
        return first
    if type(first) is not float:
        return None
    x: float = first
    if function is Function.ABS:
        return abs(x)
    if function is Function.ROUND:
        return round_half_away(x)
    if not -_TWO_63 <= x < _TWO_63:
        return None
    value = math.floor(x) if function is Function.FLOOR else math.ceil(x)
    return _bigint(value)


_TEXT_FUNCTIONS = frozenset(
    {Function.LOWER, Function.UPPER, Function.TRIM, Function.LENGTH, Function.SUBSTR}
)


def _substr(text: str, bounds: list[Scalar]) -> Scalar:
    """SQL's 1-based `substr(text, start[, length])`; a start below 1 or a negative length
    is NULL."""
    start = bounds[0]
    if type(start) is not int or start < 1:
        return None
    if len(bounds) == 1:
        return text[start - 1 :]
    length = bounds[1]
    if type(length) is not int or length < 0:
        return None
    return text[start - 1 : start - 1 + length]


def _zone(name: str) -> ZoneInfo:
    zone = zone_info(name)
    if zone is None:
        raise ValueError(f"unknown time zone {name!r}")  # refused when the config loads
    return zone


def zone_offset_ms(ms: Scalar, zone: str) -> int | None:
    """The UTC offset of `zone` at the epoch-ms instant `ms`, from Python's tz database, or
    None when `ms` is no instant of the years 1-9999. Both layers take a zone's offsets from
    here (the batch layer's data source computes them beside the event), so they agree on every
    instant whatever tz database the JVM carries."""
    if type(ms) is not int or not MIN_EVENT_MS <= ms <= MAX_EVENT_MS:
        return None
    try:
        moment = (_EPOCH + timedelta(milliseconds=ms)).astimezone(_zone(zone))
    except (OverflowError, ValueError):
        return None
    offset = moment.utcoffset()
    return None if offset is None else offset // timedelta(milliseconds=1)


def _date_part(function: Function, ms: Scalar, offset: Scalar) -> Scalar:
    """hour (0-23), ISO day of week (Monday 1 ... Sunday 7) or date ('YYYY-MM-DD') of the local
    time `ms + offset` (epoch ms); NULL unless both the instant and the local time lie in the
    years 1-9999."""
    if type(ms) is not int or type(offset) is not int:
        return None
    local = ms + offset
    if not (MIN_EVENT_MS <= ms <= MAX_EVENT_MS and MIN_EVENT_MS <= local <= MAX_EVENT_MS):
        return None
    if function is Function.HOUR:
        return local // 3_600_000 % 24
    days = local // 86_400_000
    if function is Function.DAY_OF_WEEK:
        return (days + 3) % 7 + 1  # 1970-01-01 was a Thursday (4)
    return date.fromordinal(_EPOCH_ORDINAL + days).isoformat()


_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
