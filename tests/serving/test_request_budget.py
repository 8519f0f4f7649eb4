"""`RequestBudget` and the header bounds of `RequestLimits` on an app of their own (no
services): past `serving.max_inflight_requests` a request is answered 503 at once, past
`serving.request_timeout_s` a 503 goes out at the deadline (an async route is cancelled, a sync
one's thread runs on and its answer is dropped), both with `Retry-After` and counted; health,
readiness and metrics are exempt; too many or too large headers are a 431."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from serving_layer.limits import RequestBudget, RequestLimits
from serving_layer.observability import ServingMetrics
from shared.config import ServingSettings


class Harness:
    """An app with the serving layer's limits whose routes wait for the test to let them go."""

    def __init__(self, **limits: float) -> None:
        self.release = asyncio.Event()
        self.cancelled: list[str] = []
        self.sync_done = threading.Event()
        self.metrics = ServingMetrics()
        serving = ServingSettings(**limits)  # type: ignore[arg-type]
        app = FastAPI()
        app.add_api_route("/slow", self.slow)
        app.add_api_route("/sync", self.sync)
        app.add_api_route("/streamed", self.streamed)
        app.add_api_route("/healthz", self.slow)
        app.add_middleware(RequestBudget, serving=serving, metrics=self.metrics)
        app.add_middleware(RequestLimits, serving=serving)
        self.app = app

    async def slow(self) -> PlainTextResponse:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append("slow")
            raise
        return PlainTextResponse("done")

    def sync(self) -> PlainTextResponse:
        time.sleep(0.6)
        self.sync_done.set()
        return PlainTextResponse("late")

    async def streamed(self) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"first "
            await asyncio.sleep(0.4)
            yield b"last"

        return StreamingResponse(body())

    def budget(self) -> RequestBudget:
        stack = self.app.middleware_stack
        while not isinstance(stack, RequestBudget):
            stack = stack.app  # type: ignore[union-attr]
        return stack

    def counted(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def run(harness: Harness, scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=harness.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            await scenario(client)

    asyncio.run(main())


def test_past_the_in_flight_limit_requests_are_shed_at_once() -> None:
    harness = Harness(max_inflight_requests=2, request_timeout_s=30)

    async def scenario(client: httpx.AsyncClient) -> None:
        held = [asyncio.create_task(client.get("/slow")) for _ in range(2)]
        while harness.app.middleware_stack is None or harness.budget().in_flight < 2:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        shed = await client.get("/slow")
        assert time.monotonic() - started < 1
        assert shed.status_code == 503 and shed.headers["retry-after"] == "1"
        assert "LAMBDA_SERVING__MAX_INFLIGHT_REQUESTS" in shed.json()["detail"]
        assert "retry in 1 s (Retry-After)" in shed.json()["detail"]
        health = asyncio.create_task(client.get("/healthz"))  # exempt: not shed
        await asyncio.sleep(0.1)
        harness.release.set()
        assert [r.status_code for r in await asyncio.gather(*held, health)] == [200, 200, 200]
        assert (await client.get("/slow")).status_code == 200
        assert harness.budget().in_flight == 0

    run(harness, scenario)
    assert harness.counted("lambda_serving_shed_requests_total") == 1


def test_an_async_route_past_its_budget_is_cancelled_and_answered_503() -> None:
    harness = Harness(request_timeout_s=0.3)

    async def scenario(client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        late = await client.get("/slow")
        assert 0.3 <= time.monotonic() - started < 2
        assert late.status_code == 503 and late.headers["retry-after"] == "1"
        assert "time budget of 0.3 s (LAMBDA_SERVING__REQUEST_TIMEOUT_S)" in late.json()["detail"]
        assert "narrow [start, end)" in late.json()["detail"]
        await asyncio.sleep(0.05)
        assert harness.cancelled == ["slow"] and harness.budget().in_flight == 0

    run(harness, scenario)
    assert harness.counted("lambda_serving_timed_out_requests_total", route="/slow") == 1


def test_a_sync_route_past_its_budget_runs_on_in_flight_and_its_answer_is_dropped() -> None:
    harness = Harness(request_timeout_s=0.2, max_inflight_requests=1)

    async def scenario(client: httpx.AsyncClient) -> None:
        late = await client.get("/sync")
        assert late.status_code == 503 and not harness.sync_done.is_set()
        assert harness.budget().in_flight == 1  # its thread still works: it still sheds load
        assert (await client.get("/sync")).status_code == 503
        while harness.budget().in_flight:
            await asyncio.sleep(0.02)
        assert harness.sync_done.is_set()

    run(harness, scenario)
    assert harness.counted("lambda_serving_timed_out_requests_total", route="/sync") == 1
    assert harness.counted("lambda_serving_shed_requests_total") == 1


def test_a_started_response_is_not_cut_off() -> None:
    harness = Harness(request_timeout_s=0.2)

    async def scenario(client: httpx.AsyncClient) -> None:
        streamed = await client.get("/streamed")
        assert streamed.status_code == 200 and streamed.text == "first last"

    run(harness, scenario)


def test_too_many_or_too_large_headers_are_a_431() -> None:
    harness = Harness()
    limits = ServingSettings()

    async def scenario(client: httpx.AsyncClient) -> None:
        harness.release.set()
        many = {f"x-h{n}": "v" for n in range(2000)}
        refused = await client.get("/slow", headers=many)
        assert refused.status_code == 431, refused.text
        assert refused.json()["detail"].startswith("the request has 200")
        assert "LAMBDA_SERVING__MAX_HEADERS); send fewer headers" in refused.json()["detail"]
        big = await client.get("/slow", headers={"x-big": "a" * (1 << 20)})
        assert big.status_code == 431, big.text
        assert "LAMBDA_SERVING__MAX_HEADER_BYTES" in big.json()["detail"]
        fits = {"x-fits": "a" * (limits.max_header_bytes - 200)}
        assert (await client.get("/slow", headers=fits)).status_code == 200

    run(harness, scenario)
