"""What the local Apache Kafka broker costs while a benchmark measures: its CPU seconds and peak
RSS, sampled from /proc by psutil. A benchmark against a remote cluster reports none."""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType

import psutil

from lambdactl.kafka_broker import MAIN_CLASS


class BrokerUsage(threading.Thread):
    """`with BrokerUsage() as broker: ...` then `broker.figures()` for the BENCH line."""

    def __init__(self, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.process = _local_broker()
        self.cpu_s = 0.0
        self.peak_rss = 0
        self._cpu_at_start = 0.0
        self._done = threading.Event()

    def __enter__(self) -> BrokerUsage:
        if self.process is not None:
            self._cpu_at_start = _cpu_seconds(self.process)
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is None:
            return
        self._done.set()
        self.join()
        with contextlib.suppress(psutil.Error):
            self.cpu_s = _cpu_seconds(self.process) - self._cpu_at_start

    def run(self) -> None:
        assert self.process is not None
        while not self._done.wait(self.interval_s):
            with contextlib.suppress(psutil.Error):
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)

    def figures(self, prefix: str = "broker") -> str:
        """`broker_cpu_s=.. broker_rss_mb=..` (`na` when no local broker was found)."""
        if self.process is None:
            return f"{prefix}_cpu_s=na {prefix}_rss_mb=na"
        return f"{prefix}_cpu_s={self.cpu_s:.1f} {prefix}_rss_mb={self.peak_rss / 2**20:.0f}"


def _local_broker() -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline"]):
        if MAIN_CLASS in (process.info["cmdline"] or []):
            return process
    return None


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)
