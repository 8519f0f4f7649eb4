"""The dashboard's tests' browser and site: real headless Chromium driven by Selenium
(installed with apt-get when root and missing; never skipped), and the API app served by
uvicorn on a thread of the test process, every request it gets recorded."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from lambdactl.stack import apt_install
from shared.errors import ServiceUnavailableError

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
"""Where the tests keep their screenshots."""
CHROME_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
    "--disable-dev-shm-usage",
]


def _chromium() -> tuple[str, str]:
    """Paths of chromium and chromedriver, installing them with apt-get when root; fails
    loudly (never skips) when they cannot be had."""
    needed = "chromium and chromium-driver are needed: apt-get install -y chromium chromium-driver"
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        try:
            apt_install(["chromium", "chromium-driver"], needed)
        except ServiceUnavailableError as exc:
            pytest.fail(str(exc), pytrace=False)
        browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(needed, pytrace=False)
    return browser, driver


@contextmanager
def chrome() -> Iterator[Any]:
    """A headless Chromium WebDriver with a profile of its own, quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="lp-chrome-")
    for flag in [*CHROME_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_dashboard(driver: Any, url: str, timeout_s: float = 20) -> Any:
    """Load the dashboard at `url` with its auto-refresh off, and a wait for what it shows.

    Every 10 s the page redraws the chart and tables: an element found just before a redraw
    is stale when read just after it (a CI run failed so). A test checks what one query
    draws, so it stops the redraws; a wait also retries an element gone stale meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    auto = driver.find_element(By.ID, "auto")
    if auto.is_selected():
        auto.click()
    return WebDriverWait(driver, timeout_s, ignored_exceptions=[StaleElementReferenceException])


class _Recorder:
    """ASGI wrapper keeping `path?query` of every HTTP request the app gets, exactly as sent,
    so a test can assert on the URLs the page requested."""

    def __init__(self, app: Any, requests: list[str]) -> None:
        self.app, self.requests = app, requests

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"").decode("latin-1")
            self.requests.append(scope["path"] + ("?" + query if query else ""))
        await self.app(scope, receive, send)


@contextmanager
def served(app: Any, requests: list[str]) -> Iterator[str]:
    """The base URL of `app` served by uvicorn on a thread, `path?query` of each request it
    gets appended to `requests`; stopped afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        _Recorder(app, requests), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
