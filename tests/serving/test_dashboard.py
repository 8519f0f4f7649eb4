"""The dashboard in real headless Chromium: load it, pick a metric (its total first, every key
merged), pick a key, see the chart with batch and speed points and the W marker; group by a
dimension, filter by dimension values, choose step and time zone, and see what the API answers
for the same query (and its message when it rejects one); the W label and the axes' labels
stay inside the chart, the y ticks are round numbers. Screenshots are kept in
artifacts/dashboard.png, artifacts/dashboard-group-by.png and
artifacts/dashboard-w-near-edge.png."""

from __future__ import annotations

import json
import math
import random
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any
from urllib.parse import parse_qs
from zoneinfo import ZoneInfo

import pytest

from serving_layer import create_app
from shared.config import Settings
from tests.browser import ARTIFACTS, chrome, open_dashboard, served
from tests.conftest import Platform
from tests.serving.views import Event, batch_rows, publish, random_events, write_speed

pytestmark = [pytest.mark.services, pytest.mark.timeout(900)]  # room to install chromium

MINUTE = 60_000
HOUR = 60 * MINUTE
GRID = "views_by_country_page"
"""A two-dimensional metric with an hourly base window: group-by and filters have something to
choose between, and Asia/Kolkata's midnight (18:30 UTC) is not on an hour boundary."""
GRID_METRIC = {
    "name": GRID,
    "source": "pageviews",
    "where": "latency_ms >= 0",  # every generated event: shown beside the chart (rule 10)
    "fields": {"latency_s": "latency_ms / 1000"},
    "key": ["country", "page"],
    "value": "latency_ms",
    "aggregations": ["count", "sum", "avg", "distinct(user_id)"],
    "windows": ["1h", "1d"],
    "grace": "2m",
}
COUNTRIES = ["ar", "br", "ca", "de", "es", "fr", "in", "jp", "nl", "us"]
PAGES = ["/", "/home", "/search", "/cart"]


@dataclass
class Site:
    url: str
    events: dict[str, list[Event]]
    """The events each metric's cells were written from (the brute-force reference)."""
    requests: list[str] = field(default_factory=list)
    """`path?query` of every request the app received, in order."""

    def get(self, path_query: str) -> tuple[int, Any]:
        """The API's own answer to a request (status, JSON body)."""
        try:
            with urllib.request.urlopen(self.url + path_query, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)


def _grid_events(rng: random.Random, start: int, end: int, n: int) -> list[Event]:
    """Events keyed (country, page), countries with distinct weights (clear top groups)."""
    weights = list(range(1, len(COUNTRIES) + 1))
    rng.shuffle(weights)
    return [
        Event(
            rng.randrange(start, end),
            (rng.choices(COUNTRIES, weights)[0], rng.choice(PAGES)),
            round(rng.uniform(-50, 500), 3),
            f"u{rng.randrange(300)}",
        )
        for _ in range(n)
    ]


@pytest.fixture
def server(platform: Platform) -> Iterator[Site]:
    metrics = [
        {**m, "retention": {"1m": "12h"}} if m["name"] == "views_by_page" else m
        for m in platform.config["metrics"]
    ]
    config = {**platform.config, "metrics": [*metrics, GRID_METRIC]}
    settings = Settings(**config)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    events = random_events(
        random.Random(1), now - 6 * 60 * MINUTE, now, 4000, ["/", "/home", "/search", "/cart"]
    )
    site_events: dict[str, list[Event]] = {}
    rows, ws = [], {}
    for metric in settings.plans.values():
        if metric.name == GRID:
            mine = _grid_events(random.Random(2), now - 24 * HOUR, now, 3000)
            watermark = (now - 3 * HOUR) // HOUR * HOUR
        else:
            mine, watermark = events, now - 90 * MINUTE
        site_events[metric.name] = mine
        rows += batch_rows(settings, metric, mine, watermark)
        ws[metric.name] = watermark
        write_speed(settings, metric, mine, watermark)
    publish(settings, rows, ws)
    requests: list[str] = []
    with served(create_app(settings), requests) as url:
        yield Site(url, site_events, requests)


@pytest.fixture
def driver() -> Iterator[Any]:
    with chrome() as browser:
        yield browser


def test_dashboard_shows_chart_with_w_marker(server: Site, driver: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select

    wait = open_dashboard(driver, server.url)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "metric")).options) == 3)
    Select(driver.find_element(By.ID, "metric")).select_by_value("views_by_page")
    wait.until(
        lambda d: Select(d.find_element(By.ID, "key")).first_selected_option.text == "(all: total)"
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

    # views_by_page keeps its 1m cells 12 h back from W (rule 14): over the last day the page
    # offers only the windows kept over the whole range (1,440 1m windows would fit), and the
    # API refuses that 1m query, naming what is kept.
    def windows_offered(d: Any) -> list[str]:
        return [o.text for o in Select(d.find_element(By.ID, "window")).options]

    assert "1m" in windows_offered(driver)
    Select(driver.find_element(By.ID, "range")).select_by_visible_text("last day")
    wait.until(lambda d: windows_offered(d) == ["1h", "1d"])
    day = f"start={int(time.time() * 1000) - 24 * HOUR}&end={int(time.time() * 1000)}"
    status, refused = server.get(f"/v1/metrics/views_by_page/series?window=1m&{day}&page=/home")
    assert status == 400 and "keeps its 1m cells back to" in refused["detail"]
    Select(driver.find_element(By.ID, "range")).select_by_visible_text("last 6 hours")
    wait.until(lambda d: "1m" in windows_offered(d))
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


NICE = {1.0, 2.0, 5.0}
"""A nice tick step is 1, 2 or 5 times a power of ten (as d3's `ticks`)."""
TICK = re.compile(r"-?\d+(\.\d+)?[kM]?")


def _tick_value(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6}.get(text[-1], 1.0)
    return float(text.rstrip("kM")) * scale


def _assert_round_ticks(labels: list[str]) -> None:
    """The y axis's labels, top to bottom: round numbers, one nice step apart, whole numbers
    without decimals."""
    assert len(labels) >= 3, labels
    assert all(TICK.fullmatch(t) for t in labels), labels
    values = [_tick_value(t) for t in labels]
    steps = {round(a - b, 9) for a, b in pairwise(values)}
    assert len(steps) == 1, labels  # evenly spaced, descending
    (step,) = steps
    assert step > 0, labels
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    assert round(mantissa, 6) in NICE, labels
    for text, value in zip(labels, values, strict=True):
        assert abs(value / step - round(value / step)) < 1e-6, labels  # a multiple of the step
        number = text.rstrip("kM")
        assert ("." in number) == (float(number) != int(float(number))), labels


def _chart_geometry(driver: Any) -> dict[str, Any]:
    """Client rectangles of the chart's SVG, of its plot (a grid line spans the plot's width),
    of the W label, and the axes' labels (the y ticks top to bottom)."""
    result: dict[str, Any] = driver.execute_script(
        """
        const rect = (e) => { const r = e.getBoundingClientRect();
          return { left: r.left, right: r.right, top: r.top, bottom: r.bottom }; };
        const svg = document.getElementById("chart-svg");
        const w = document.querySelector("#w-marker text");
        const ticks = [...svg.querySelectorAll("text.y-tick")]
          .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
        return {
          svg: rect(svg), plot: rect(svg.querySelector(".grid-line")),
          w: w && { ...rect(w), text: w.textContent, side: w.dataset.side },
          y: ticks.map((t) => t.textContent),
          labels: [...svg.querySelectorAll("text.x-tick, text.y-tick")].map(rect),
        };
        """
    )
    return result


def test_dashboard_w_label_inside_the_plot_and_round_y_ticks(server: Site, driver: Any) -> None:
    """The W label lies inside the plot wherever W falls: right of the line, or left of it near
    the plot's right edge (W 90 min before now over the last 7 days); every axis label lies
    inside the SVG; the y ticks are round numbers (1, 2 or 5 times a power of ten apart)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def pick(element_id: str, text: str) -> None:
        Select(driver.find_element(By.ID, element_id)).select_by_visible_text(text)

    wait = open_dashboard(driver, server.url)
    # The chart's helpers themselves, against d3's choices (d3.ticks over d3's nice domain).
    cases = driver.execute_script(
        """
        return [[0, 1814], [0, 1360.5], [0, 0.37], [-37, 512], [0, 12345], [0, 7], [0, 0]]
          .map(([lo, hi]) => { const a = niceTicks(lo, hi, 5);
            return a.ticks.map((v) => tickLabel(v, a.step, Math.max(-a.lo, a.hi))); });
        """
    )
    assert cases == [
        ["0", "500", "1000", "1500", "2000"],
        ["0", "200", "400", "600", "800", "1000", "1200", "1400"],
        ["0", "0.1", "0.2", "0.3", "0.4"],
        ["-100", "0", "100", "200", "300", "400", "500", "600"],
        ["0", "2k", "4k", "6k", "8k", "10k", "12k", "14k"],
        ["0", "1", "2", "3", "4", "5", "6", "7"],
        ["0", "0.2", "0.4", "0.6", "0.8", "1"],
    ]

    wait.until(lambda d: len(Select(d.find_element(By.ID, "metric")).options) == 3)
    Select(driver.find_element(By.ID, "metric")).select_by_value("views_by_page")
    sides = {}
    for range_text, field_name in [
        ("last 6 hours", "count"),
        ("last day", "avg"),
        ("last 7 days", "count"),
        ("last 7 days", "sum"),
    ]:
        pick("range", range_text)
        pick("field", field_name)
        span = {"last 6 hours": 6, "last day": 24, "last 7 days": 168}[range_text] * HOUR
        _shown(driver, wait, lambda q, span=span: _ms(q["end"][0]) - _ms(q["start"][0]) == span)
        wait.until(lambda d, f=field_name: f"· {f} ·" in d.find_element(By.ID, "chart-title").text)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#w-marker text"))
        shape = _chart_geometry(driver)
        svg, plot, w = shape["svg"], shape["plot"], shape["w"]
        where = f"{range_text}, {field_name}: {shape}"
        assert w["text"].startswith("W "), where
        assert plot["left"] <= w["left"] and w["right"] <= plot["right"], where
        assert svg["top"] <= w["top"] and w["bottom"] <= svg["bottom"], where
        for label in shape["labels"]:
            assert svg["left"] <= label["left"] and label["right"] <= svg["right"], where
            assert svg["top"] <= label["top"] and label["bottom"] <= svg["bottom"], where
        _assert_round_ticks(shape["y"])
        sides[range_text] = w["side"]
    # W is 90 minutes before now: 1/4 of 6 h and 1/16 of a day before the right edge (the
    # label fits right of the line), 1/112 of 7 days (it goes left of the line).
    assert sides == {"last 6 hours": "right", "last day": "right", "last 7 days": "left"}
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "dashboard-w-near-edge.png"))
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []


def _shown(driver: Any, wait: Any, ready: Callable[[dict[str, list[str]]], bool]) -> str:
    """The query string of the series answer the chart shows (or the error it shows), once it
    is one `ready` accepts."""
    from selenium.webdriver.common.by import By

    def shown(d: Any) -> str | bool:
        query = d.find_element(By.ID, "chart").get_attribute("data-query") or ""
        return query if query and ready(parse_qs(query)) else False

    result: str = wait.until(shown)
    return result


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _total(points: list[dict[str, Any]], field: str = "count") -> float:
    return sum(p[field] for p in points)


def test_dashboard_group_by_filters_step_and_tz(server: Site, driver: Any) -> None:
    """What a user sees for group-by, filters, step and time zone is what the API answers for
    the same query the page sent (and what the events say), and a rejected combination shows
    the API's own message."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def pick(element_id: str, text: str) -> None:
        Select(driver.find_element(By.ID, element_id)).select_by_visible_text(text)

    def pick_filter(dim: str, text: str) -> None:
        element = driver.find_element(By.CSS_SELECTOR, f'#filters select[data-dim="{dim}"]')
        Select(element).select_by_visible_text(text)

    def filter_values(dim: str) -> list[str]:
        element = driver.find_element(By.CSS_SELECTOR, f'#filters select[data-dim="{dim}"]')
        return [o.text for o in Select(element).options if o.text != "any"]

    def selected(element_id: str) -> str:
        return str(Select(driver.find_element(By.ID, element_id)).first_selected_option.text)

    def text(element_id: str) -> str:
        return str(driver.find_element(By.ID, element_id).text)

    series = f"/v1/metrics/{GRID}/series?"
    keys = f"/v1/metrics/{GRID}/keys?"
    events = server.events[GRID]
    wait = open_dashboard(driver, server.url)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "metric")).options) == 3)
    pick("metric", GRID)
    wait.until(lambda d: GRID in d.find_element(By.ID, "chart-title").text)
    assert text("definition") == "where latency_ms >= 0 · latency_s = latency_ms / 1000"
    assert selected("key") == "(all: total)"
    assert [o.text for o in Select(driver.find_element(By.ID, "group-by")).options] == [
        "(none)",
        "country",
        "page",
    ]
    assert selected("tz") == "UTC" and selected("step") == "= window"

    # -- group by country over the last day: one line and one legend entry per top group.
    pick("range", "last day")
    _shown(driver, wait, lambda q: _ms(q["end"][0]) - _ms(q["start"][0]) == 24 * HOUR)
    pick("group-by", "country")
    query = _shown(driver, wait, lambda q: q.get("group_by") == ["country"])
    assert series + query in server.requests  # what the page sent, as the server received it
    params = parse_qs(query)
    assert params["limit"] == ["100"] and params["window"] == ["1h"]
    assert "step" not in params and "tz" not in params
    status, answer = server.get(series + query)
    assert status == 200 and answer["truncated"] is False
    totals = {g["key"]["country"]: _total(g["points"]) for g in answer["groups"]}
    start, end = _ms(params["start"][0]), _ms(params["end"][0])
    assert totals == Counter(e.key[0] for e in events if start <= e.time_ms < end)
    assert len(totals) == len(COUNTRIES)
    top = sorted(totals, key=lambda k: (-totals[k], k))[:8]  # the dashboard's rule
    entries = driver.find_elements(By.CSS_SELECTOR, "#series-legend .entry")
    assert [e.find_element(By.CLASS_NAME, "name").text for e in entries] == top
    assert [float(e.get_attribute("data-total")) for e in entries] == [totals[k] for k in top]
    assert [e.find_element(By.CLASS_NAME, "total").text for e in entries] == [
        str(totals[k]) for k in top
    ]
    lines = driver.find_elements(By.CSS_SELECTOR, "#chart-svg g.series")
    assert [g.get_attribute("data-key") for g in lines] == top
    points = {g["key"]["country"]: [p["start"] for p in g["points"]] for g in answer["groups"]}
    for line in lines:
        drawn = [c.get_attribute("data-start") for c in line.find_elements(By.TAG_NAME, "circle")]
        assert drawn == points[line.get_attribute("data-key")]
    assert text("group-count") == "8"
    assert "top 8 of 10 groups by count" in text("series-legend")
    assert "by country" in text("chart-title")
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "dashboard-group-by.png"))

    # -- filter country=de: the series and keys requests carry it; the total is the API's.
    pick("group-by", "(none)")
    _shown(driver, wait, lambda q: "group_by" not in q)
    sent = len(server.requests)
    pick_filter("country", "de")
    query = _shown(driver, wait, lambda q: q.get("country") == ["de"])
    params = parse_qs(query)
    assert "page" not in params and "group_by" not in params
    start, end = _ms(params["start"][0]), _ms(params["end"][0])
    status, answer = server.get(series + query)
    assert status == 200 and answer["key"] == {"country": "de"}
    expected = _total(answer["points"])
    assert expected == sum(1 for e in events if e.key[0] == "de" and start <= e.time_ms < end)
    assert float(driver.find_element(By.ID, "total").get_attribute("data-value")) == expected
    assert text("total") == str(expected)
    assert "country=de" in text("chart-title")
    # The page picker offers the pages seen with country=de: the keys endpoint's answer to
    # the keys request the page sent with that filter.
    wait.until(lambda d: any(r.startswith(keys) for r in server.requests[sent:]))
    assert series + query in server.requests[sent:]
    sent_keys = [r for r in server.requests[sent:] if r.startswith(keys)]
    filtered = [r for r in sent_keys if parse_qs(r.partition("?")[2]).get("country") == ["de"]]
    assert filtered, sent_keys
    status, found = server.get(filtered[-1])
    assert status == 200
    pages = sorted({k["page"] for k in found["keys"]})
    assert pages and all(k["country"] == "de" for k in found["keys"])
    wait.until(lambda d: filter_values("page") == pages)
    assert selected("key") == "(filtered)"
    # Fixing the other dimension too names one key; the key picker shows it.
    pick_filter("page", "/home")
    query = _shown(driver, wait, lambda q: q.get("page") == ["/home"] and "country" in q)
    status, answer = server.get(series + query)
    assert status == 200 and answer["key"] == {"country": "de", "page": "/home"}
    wait.until(lambda d: selected("key") == "de / /home")
    assert float(driver.find_element(By.ID, "total").get_attribute("data-value")) == _total(
        answer["points"]
    )
    assert "de / /home" in text("chart-title")
    # The key picker's total clears every filter.
    pick("key", "(all: total)")
    _shown(driver, wait, lambda q: "country" not in q and "page" not in q)
    wait.until(lambda d: filter_values("country") == COUNTRIES)
    for dim in ("country", "page"):
        element = driver.find_element(By.CSS_SELECTOR, f'#filters select[data-dim="{dim}"]')
        assert Select(element).first_selected_option.text == "any"
    assert "total" in text("chart-title")

    # -- step: 1d windows every 6h are sent and drawn as the API answers them.
    pick("window", "1d")
    options = [o.text for o in Select(driver.find_element(By.ID, "step")).options]
    assert options == ["= window", "1h", "6h", "12h"]
    pick("step", "6h")
    query = _shown(driver, wait, lambda q: q.get("step") == ["6h"] and q["window"] == ["1d"])
    assert series + query in server.requests
    status, answer = server.get(series + query)
    assert status == 200 and answer["step"] == "6h"
    drawn = [
        c.get_attribute("data-start")
        for c in driver.find_elements(By.CSS_SELECTOR, "#points circle")
    ]
    assert drawn == [p["start"] for p in answer["points"]] and drawn  # 1 just after 00:00
    assert {_ms(b) - _ms(a) for a, b in pairwise(drawn)} <= {6 * HOUR}
    assert "every 6h" in text("chart-title")
    assert not driver.find_elements(By.ID, "total")  # overlapping windows have no total

    # -- tz: Berlin days over the last 7 days start at Berlin's midnight.
    pick("step", "= window")
    pick("range", "last 7 days")
    pick("tz", "Europe/Berlin")
    query = _shown(driver, wait, lambda q: q.get("tz") == ["Europe/Berlin"])
    assert "step" not in parse_qs(query) and parse_qs(query)["window"] == ["1d"]
    assert series + query in server.requests
    status, answer = server.get(series + query)
    assert status == 200 and answer["tz"] == "Europe/Berlin"
    drawn = [
        c.get_attribute("data-start")
        for c in driver.find_elements(By.CSS_SELECTOR, "#points circle")
    ]
    assert drawn == [p["start"] for p in answer["points"]] and drawn
    berlin = ZoneInfo("Europe/Berlin")
    for start_text in drawn:
        local = datetime.fromtimestamp(_ms(start_text) / 1000, berlin)
        assert (local.hour, local.minute) == (0, 0), start_text
    assert "Europe/Berlin" in text("chart-title")

    # -- a combination the API rejects: its message is shown, nothing breaks.
    pick("tz", "Asia/Kolkata")
    query = _shown(driver, wait, lambda q: q.get("tz") == ["Asia/Kolkata"])
    status, answer = server.get(series + query)
    assert status == 400 and "Asia/Kolkata" in answer["detail"]
    wait.until(lambda d: d.find_element(By.ID, "error").is_displayed())
    assert text("error") == f"400: {answer['detail']}"
    assert text("chart-error") == f"400: {answer['detail']}"
    pick("tz", "UTC")
    _shown(driver, wait, lambda q: "tz" not in q)
    assert not driver.find_element(By.ID, "error").is_displayed()
    assert driver.find_elements(By.CSS_SELECTOR, "#points circle")
    errors = [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "Asia%2FKolkata" not in e["message"]
    ]
    assert errors == []
