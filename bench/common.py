"""What several benchmarks share: a cheap keep-alive HTTP client for load generation, the
percentile and error tally they report with, and small helpers for a benchmark's own world
(a free port, a database URL, a timestamped log line)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

clock = time.perf_counter
"""Latencies use a precise clock: uvloop's `loop.time()` has millisecond resolution and is
cached for a whole loop iteration."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_db(url: str, name: str) -> str:
    """`url` (PostgreSQL or Redis) with another database name or number."""
    return url.rpartition("/")[0] + "/" + name


class Errors(Counter[int]):
    """Failed requests by HTTP status (0: no answer: the connection failed or closed)."""

    def __str__(self) -> str:
        if not self:
            return "0"
        kinds = (f"{'no answer' if s == 0 else f'HTTP {s}'} x{n}" for s, n in sorted(self.items()))
        return f"{self.total()} ({', '.join(kinds)})"


class RawHttp:
    """A minimal keep-alive HTTP/1.1 GET client on asyncio streams (cheaper than httpx, so
    the load generator steals less CPU from the server it shares the cores with)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str) -> int:
        return (await self.fetch(path))[0]

    async def send(self, target: str | tuple[str, bytes]) -> int:
        """The status of `GET path`, or of `POST` of a JSON body when given `(path, body)`."""
        if isinstance(target, str):
            return await self.get(target)
        return (await self.fetch(*target))[0]

    async def fetch(self, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body) of `GET path`, or of `POST path` with a JSON `body`."""
        while True:
            reused = bool(self._idle)
            if reused:
                reader, writer = self._idle.pop()
                if reader.at_eof():  # closed by the server while idle (keep-alive timeout)
                    writer.close()
                    continue
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                if body is None:
                    writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
                else:
                    writer.write(
                        f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: "
                        f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                head = await reader.readuntil(b"\r\n\r\n")
                break
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                if not reused:
                    raise
                # the server closed an idle keep-alive connection: try the next one (a loop:
                # after an overload thousands may be closed, too many to recurse through)
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status, body

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()


SESSION_METRIC: dict[str, Any] = {
    "name": "user_sessions",
    "source": "pageviews",
    "key": ["user_id"],
    "value": "latency_ms",
    "aggregations": ["count", "sum", "avg"],
    "session": {"gap": "30m", "max_duration": "4h"},
    "windows": ["1h", "1d"],
    "grace": "2m",
}
"""`--sessions` (bench/speed.py, bench/batch.py): sessions per user (rule 13 in
docs/semantics.md), run beside the bench's metrics."""
