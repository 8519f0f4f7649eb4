"""A local Redis Cluster of three masters (no replicas), for the tests that keep the speed view
on one. Started from the redis-server the stack uses, on free ports, in a directory of its own;
killed on exit."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis

from tests.serving.api_process import free_port


@contextmanager
def local_redis_cluster(directory: Path, masters: int = 3) -> Iterator[list[str]]:
    """The masters' URLs, the first one being where clients discover the cluster, once every
    slot is served (`cluster_state:ok` on every node)."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert server and cli, "redis-server or redis-cli is missing: `lambdactl stack up` installs it"
    ports = [free_port() for _ in range(masters)]
    with ExitStack() as nodes:
        for port in ports:
            home = directory / f"redis-{port}"
            home.mkdir(parents=True)
            log = (home / "redis.log").open("wb")
            nodes.callback(log.close)
            node = subprocess.Popen(
                [
                    server,
                    *("--port", str(port), "--cluster-port", str(free_port())),
                    *("--cluster-enabled", "yes", "--cluster-node-timeout", "2000"),
                    *("--save", "", "--appendonly", "no", "--dir", str(home)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            nodes.callback(_kill, node)
        for port in ports:
            _wait(lambda port=port: redis.Redis(port=port).ping(), f"node {port} answers")
        addresses = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in ports:
            _wait(
                lambda port=port: redis.Redis(port=port).cluster("info")["cluster_state"] == "ok",
                f"node {port} serves every slot",
            )
        yield [f"redis://{address}/0" for address in addresses]


def _wait(check: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        assert time.monotonic() < deadline, f"the local Redis Cluster never got ready: {what}"
        time.sleep(0.1)


def _kill(node: subprocess.Popen[bytes]) -> None:
    node.kill()
    node.wait(10)
