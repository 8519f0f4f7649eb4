"""The dashboard in real headless Chromium: load it, pick a metric (its total first, every key
merged), pick a key, see the chart with batch and speed points and the W marker; a screenshot
is kept in artifacts/dashboard.png."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from serving_layer import create_app
from shared.config import Settings
from tests.conftest import Platform
from tests.serving.views import batch_rows, publish, random_events, write_speed

pytestmark = [pytest.mark.services, pytest.mark.timeout(900)]  # room to install chromium

MINUTE = 60_000
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
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
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if (browser is None or driver is None) and os.geteuid() == 0:
        install = ["apt-get", "install", "-y", "chromium", "chromium-driver"]
        if subprocess.run(install, check=False, capture_output=True, timeout=600).returncode:
            # A fresh machine may never have read the package lists.
            subprocess.run(["apt-get", "update"], check=False, capture_output=True, timeout=600)
            subprocess.run(install, check=False, capture_output=True, timeout=600)
        browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(
            "chromium and chromium-driver are needed: apt-get install -y chromium chromium-driver",
            pytrace=False,
        )
    return browser, driver


@pytest.fixture
def server(platform: Platform) -> Iterator[str]:
    settings: Settings = platform.settings
    now = int(time.time() * 1000) // MINUTE * MINUTE
    watermark = now - 90 * MINUTE
    events = random_events(
        random.Random(1), now - 6 * 60 * MINUTE, now, 4000, ["/", "/home", "/search", "/cart"]
    )
    rows, ws = [], {}
    for metric in settings.plans.values():
        rows += batch_rows(settings, metric, events, watermark)
        ws[metric.name] = watermark
        write_speed(settings, metric, events, watermark)
    publish(settings, rows, ws)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(10)


def test_dashboard_shows_chart_with_w_marker(server: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="lp-chrome-")
    for flag in [*CHROME_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(server + "/")
        wait = WebDriverWait(driver, 20)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "metric")).options) == 2)
        Select(driver.find_element(By.ID, "metric")).select_by_value("views_by_page")
        wait.until(
            lambda d: (
                Select(d.find_element(By.ID, "key")).first_selected_option.text == "(all: total)"
            )
        )
        wait.until(lambda d: "total" in d.find_element(By.ID, "chart-title").text)
        Select(driver.find_element(By.ID, "key")).select_by_visible_text("/home")
        wait.until(ec.presence_of_element_located((By.ID, "w-marker")))
        wait.until(lambda d: "/home" in d.find_element(By.ID, "chart-title").text)
        sources = {
            c.get_attribute("data-source")
            for c in driver.find_elements(By.CSS_SELECTOR, "#points circle")
        }
        assert sources == {"batch", "speed"}
        marker = driver.find_element(By.ID, "w-marker")
        assert marker.get_attribute("data-w")
        assert marker.find_element(By.TAG_NAME, "text").text.startswith("W ")
        assert "speed: ok" in driver.find_element(By.ID, "speed-status").text
        Select(driver.find_element(By.ID, "field")).select_by_value("avg")
        wait.until(lambda d: "avg" in d.find_element(By.ID, "chart-title").text)
        driver.find_element(By.ID, "queue").click()
        wait.until(lambda d: "queued" in d.find_element(By.ID, "run-message").text)
        wait.until(
            lambda d: (
                "full" in d.find_element(By.ID, "runs").text
                or "incremental" in d.find_element(By.ID, "runs").text
            )
        )
        Select(driver.find_element(By.ID, "field")).select_by_value("count")
        wait.until(lambda d: "count" in d.find_element(By.ID, "chart-title").text)
        assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
