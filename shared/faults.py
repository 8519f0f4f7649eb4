"""Named fault points: `LAMBDA_FAULT=<name>` (or `<name>@<n>` for the n-th time the point is
reached) makes the process kill itself with SIGKILL right there, so fault tests hit the exact
moment (e.g. `before_generation_flip`) instead of mocking it."""

from __future__ import annotations

import os
import signal
from collections import Counter

_hits: Counter[str] = Counter()


def fault_point(name: str) -> None:
    """Crash here, like `kill -9`, when the environment asks for a fault at `name`."""
    wanted = os.environ.get("LAMBDA_FAULT")
    if not wanted:
        return
    for spec in wanted.split(","):
        point, _, nth = spec.strip().partition("@")
        if point != name:
            continue
        _hits[name] += 1
        if _hits[name] >= int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)
