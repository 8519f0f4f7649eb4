"""The engines users would pick instead of the speed worker, run by `bench/speed.py --peers`
on the bench's own topic: a Kafka Streams topology (`kstreams/`, Java 17, Maven) and a
quix-streams application (`quix_peer.py`, in a virtualenv of its own). Both compute, per page,
1-minute tumbling windows on event time with count, sum, min and max of `latency_ms`.

Each is prepared on first use, into folders git ignores:

- Kafka Streams: `mvn package` writes `kstreams/build/kstreams-peer.jar` and its jars in
  `kstreams/build/lib/` (about 30 s and 130 MB into ~/.m2 on a fresh machine; rebuilt when the
  pom or a source file is newer than the jar). Needs `java` (17+) and `mvn` on the PATH.
- quix-streams: `python -m venv .venv-quix` + `pip install quixstreams==3.28.*` (about a
  minute; redone when the pinned requirement changes).

`run_kstreams` / `run_quix` run one peer over a topic until it has aggregated or dropped as
late all `events` records, under a fresh application id / consumer group (so it reads from the
beginning), and return its figures. A peer deletes its internal topics (repartition,
changelog) and local state when it exits.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KSTREAMS = HERE / "kstreams"
KSTREAMS_BUILD = KSTREAMS / "build"
KSTREAMS_JAR = KSTREAMS_BUILD / "kstreams-peer.jar"
QUIX_VENV = HERE / ".venv-quix"
QUIX_REQUIREMENT = "quixstreams==3.28.*"
QUIX_APP = HERE / "quix_peer.py"
MIN_JAVA = 17
BUILD_TIMEOUT_S = 900


class PeerError(RuntimeError):
    """A peer could not be prepared or did not finish; the message says why."""


@dataclass(frozen=True)
class PeerRun:
    """One peer's run, as its JSON line reports it."""

    peer: str
    guarantee: str
    events: int
    aggregated: int
    late: int
    """Records dropped as late for their window (aggregated + late = events)."""
    seconds: float
    """From the first record read to the last of `events` aggregated or dropped."""
    events_per_s: float
    warmup_events: int
    warm_seconds: float
    """From the moment `warmup_events` records were aggregated or dropped to the last."""
    warm_events_per_s: float
    cpu_us_per_event: float
    """The peer process's CPU time (all threads) over the warm span, per record."""
    pages: dict[str, list[float]]
    """Per page, [count, sum, min, max] of `latency_ms` over all its windows."""


def fresh_app_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One preparation at a time (a bench and a test may start together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise PeerError(
            f"the Kafka Streams peer needs Java {MIN_JAVA}+ (`java` is not on the PATH); "
            "on Debian: apt-get install openjdk-17-jdk-headless maven"
        )
    shown = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', shown.stderr)
    major = 0 if match is None else int(match.group(1))
    if major == 1 and match is not None and match.group(2):  # "1.8.0_..." is Java 8
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise PeerError(
            f"the Kafka Streams peer needs Java {MIN_JAVA}+, but {java} is "
            f"{shown.stderr.strip().splitlines()[0] if shown.stderr.strip() else 'unknown'}"
        )
    return java


def kstreams_jar() -> Path:
    """The Kafka Streams peer's jar, built with Maven if missing or older than its sources."""
    _java()
    sources = [KSTREAMS / "pom.xml", *sorted((KSTREAMS / "src").rglob("*.java"))]
    newest = max(p.stat().st_mtime for p in sources)
    with _locked(KSTREAMS_BUILD / ".lock"):
        if KSTREAMS_JAR.exists() and KSTREAMS_JAR.stat().st_mtime >= newest:
            return KSTREAMS_JAR
        mvn = shutil.which("mvn")
        if mvn is None:
            raise PeerError(
                "the Kafka Streams peer is built with Maven, and `mvn` is not on the PATH; "
                "on Debian: apt-get install maven"
            )
        command = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(KSTREAMS / "pom.xml")]
        command.append("package")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PeerError(
                f"`{' '.join(command)}` did not finish in {BUILD_TIMEOUT_S} s; check that this "
                "machine reaches Maven Central (or a mirror in ~/.m2/settings.xml)"
            ) from exc
        if done.returncode != 0 or not KSTREAMS_JAR.exists():
            output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
            raise PeerError(
                f"could not build the Kafka Streams peer: `{' '.join(command)}` exited "
                f"{done.returncode}\n{output}"
            )
        return KSTREAMS_JAR


def quix_python() -> Path:
    """The quix-streams virtualenv's interpreter, made on first use (never the platform's)."""
    python = QUIX_VENV / "bin" / "python"
    ready = QUIX_VENV / ".requirement"
    with _locked(HERE / ".venv-quix.lock"):
        if python.exists() and ready.exists() and ready.read_text() == QUIX_REQUIREMENT:
            return python
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(QUIX_VENV)],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                QUIX_REQUIREMENT,
            ],
        ]
        for command in steps:
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise PeerError(f"`{' '.join(command)}` took over {BUILD_TIMEOUT_S} s") from exc
            if done.returncode != 0:
                output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
                raise PeerError(
                    f"could not prepare the quix-streams peer: `{' '.join(command)}` exited "
                    f"{done.returncode}\n{output}"
                )
        ready.write_text(QUIX_REQUIREMENT)
        return python


def _arguments(
    bootstrap: str, topic: str, events: int, grace_ms: int, app_id: str, warmup_events: int
) -> list[str]:
    warmup_events = min(warmup_events, events // 2)  # a warm span of half the run at least
    return [
        *("--bootstrap", bootstrap, "--topic", topic, "--events", str(events)),
        *("--grace-ms", str(grace_ms), "--app-id", app_id),
        *("--warmup-events", str(warmup_events)),
    ]


def run_kstreams(
    bootstrap: str,
    topic: str,
    events: int,
    grace_ms: int,
    app_id: str | None = None,
    guarantee: str = "at_least_once",
    warmup_events: int = 0,
    timeout_s: float = 600,
    log_path: Path | None = None,
) -> PeerRun:
    """Kafka Streams (`guarantee`: `at_least_once` or `exactly_once_v2`) over `topic`."""
    jar = kstreams_jar()
    app_id = app_id or fresh_app_id("peer-kstreams")
    command = [
        _java(),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-jar",
        str(jar),
        *_arguments(bootstrap, topic, events, grace_ms, app_id, warmup_events),
        *("--guarantee", guarantee, "--timeout-s", str(timeout_s)),
    ]
    log_path = log_path or Path(f"/tmp/bench-peer-kstreams-{guarantee}.log")
    return _run("Kafka Streams", command, timeout_s, log_path)


def run_quix(
    bootstrap: str,
    topic: str,
    events: int,
    grace_ms: int,
    app_id: str | None = None,
    warmup_events: int = 0,
    timeout_s: float = 600,
    log_path: Path | None = None,
) -> PeerRun:
    """quix-streams (at-least-once, its default) over `topic`."""
    python = quix_python()
    app_id = app_id or fresh_app_id("peer-quix")
    command = [
        str(python),
        str(QUIX_APP),
        *_arguments(bootstrap, topic, events, grace_ms, app_id, warmup_events),
        *("--timeout-s", str(timeout_s)),
    ]
    log_path = log_path or Path("/tmp/bench-peer-quix.log")
    return _run("quix-streams", command, timeout_s, log_path)


def _run(name: str, command: list[str], timeout_s: float, log_path: Path) -> PeerRun:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with log_path.open("wb") as log:
        try:
            done = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=log, env=env, timeout=timeout_s + 120
            )
        except subprocess.TimeoutExpired as exc:
            raise PeerError(f"{name} took over {timeout_s + 120:.0f} s; see {log_path}") from exc
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(log_path.read_text(errors="replace").strip().splitlines()[-15:])
        raise PeerError(f"{name} exited {done.returncode} without its figures; {log_path}:\n{tail}")
    figures = json.loads(lines[-1])
    return PeerRun(**figures)
