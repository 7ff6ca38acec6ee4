"""The dashboard in a real headless Chromium: against ``ferry serve``, and
against a gateway with two worker processes over Redis.

Traffic of known batch sizes goes through the official tritonclient while
the page polls; the test reads the values the page drew (``data-*``
attributes on its table cells, chart lines and bars), checks the page logged
no error and fetched nothing from anywhere but the gateway, and leaves a
screenshot in ``$FERRY_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.dashboard.browser import CHROMIUM, Chromium, Page
from tests.fleet.processes import Fleet
from tests.models import write_add_sub
from tests.redis_server import flushdb
from tests.servers import ferry_serve

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MODEL = "add_sub"
TRAFFIC_S = 6.0  # at least this long, so the charts show a few points of it
UPDATE_TIMEOUT_S = 45.0

# What the page shows, read from the attributes it puts on its elements.
READ_PAGE = """(() => {
  const q = s => document.querySelector(s);
  const row = q('#models-table tr[data-model="%(model)s"]');
  const line = q('#chart-throughput path[data-model="%(model)s"][data-series="inferences_per_s"]');
  const bars = [...document.querySelectorAll('#chart-batch rect.bar[data-model="%(model)s"]')];
  const workers = [...document.querySelectorAll('#workers-table tr[data-worker]')];
  return {
    status: q('#status').dataset.state,
    updated_ms: Number(q('#last-updated').dataset.ms || 0),
    renders: Number(q('#footer').dataset.renders || 0),
    ready: row ? row.dataset.ready : null,
    points: Number(q('#chart-throughput').dataset.points || 0),
    throughput_max: line ? Number(line.dataset.max) : 0,
    bars: Object.fromEntries(bars.map(r => [r.dataset.le, Number(r.dataset.count)])),
    inferences: Number(q('#kpi-inferences').dataset.value || 0),
    p50: Number(q('#kpi-p50').dataset.value || 0),
    p99: Number(q('#kpi-p99').dataset.value || 0),
    workers: Object.fromEntries(workers.map(r => [r.dataset.worker, {
      stats: r.dataset.stats === "true",
      inferences: Number(r.querySelector('[data-field="inferences_per_s"]').dataset.value || 0)}])),
  };
})()""" % {"model": MODEL}


class Traffic:
    """One client thread sending requests one at a time, cycling through
    ``sizes`` rows; one at a time, so each request is a batch of its own."""

    def __init__(self, url: str, sizes: tuple[int, ...]) -> None:
        self._url = url
        self._sizes = sizes
        self.sent: Counter[int] = Counter()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-traffic")

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self._url)
        try:
            index = 0
            while not self._stop.is_set():
                rows = self._sizes[index % len(self._sizes)]
                inputs = [httpclient.InferInput(name, [rows, 16], "FP32") for name in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
                client.infer(MODEL, inputs)
                self.sent[rows] += 1
                index += 1
        except BaseException as exc:  # the test thread reports it
            self.errors.append(exc)
        finally:
            client.close()


@pytest.fixture
def artifacts() -> Path:
    path = Path(os.environ.get("FERRY_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} not found: run `make system-packages` (the Debian package chromium)")
    (tmp_path / "browser").mkdir()
    with Chromium(tmp_path / "browser") as chromium:
        yield chromium


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_add_sub(repo, MODEL, max_batch_size=8)
    return repo


def read(page: Page) -> dict[str, Any]:
    return dict(page.evaluate(READ_PAGE))


def open_dashboard(page: Page, url: str) -> dict[str, Any]:
    page.navigate(f"http://{url}/dashboard?interval=1")
    page.wait_for(f"{READ_PAGE}.ready === 'true'", 30, f"{MODEL} listed as ready")
    return read(page)


def wait_until(page: Page, check: Any, what: str, timeout_s: float = UPDATE_TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    state = read(page)
    while not check(state):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the page shows {state}; errors {page.errors()}")
        time.sleep(0.5)
        state = read(page)
    return state


def assert_page_clean(page: Page, url: str) -> None:
    assert page.errors() == []
    elsewhere = [u for u in page.requested_urls() if not u.startswith(f"http://{url}/")]
    assert elsewhere == [], "the dashboard fetched from somewhere other than its gateway"


def test_the_dashboard_charts_traffic_of_known_batch_sizes_on_ferry_serve(
        tmp_path: Path, repository: Path, browser: Chromium, artifacts: Path) -> None:
    with ferry_serve(repository, log_path=tmp_path / "serve.log") as url:
        page = browser.page()
        before = open_dashboard(page, url)
        assert before["status"] == "ok"
        assert before["bars"] == {} and before["inferences"] == 0 and before["p50"] == 0
        assert len(before["workers"]) == 1

        with Traffic(url, (1, 4, 8)) as traffic:
            started = time.monotonic()
            during = wait_until(page, lambda s: s["throughput_max"] > 0 and s["inferences"] > 0 and s["p50"] > 0,
                                "throughput and latency above 0")
            time.sleep(max(0.0, TRAFFIC_S - (time.monotonic() - started)))
        assert traffic.errors == []
        sent = {str(size): count for size, count in traffic.sent.items()}
        # Every batch sent lands in the distribution once the page has polled after the last one.
        after = wait_until(page, lambda s: s["bars"] == {**sent, "2": 0}, f"batch-size bars {sent}")

        assert during["p99"] >= during["p50"] > 0
        assert after["points"] > before["points"] and after["updated_ms"] > before["updated_ms"]
        assert after["renders"] > before["renders"]
        # Rows per second: at least one 8-row batch per cycle of 13 rows in three requests.
        assert after["throughput_max"] > 0
        png = page.screenshot(artifacts / "dashboard-serve.png")
        assert png.startswith(b"\x89PNG") and len(png) > 20_000
        assert_page_clean(page, url)


def test_the_dashboard_shows_both_workers_of_a_fleet_and_their_summed_throughput(
        tmp_path: Path, repository: Path, browser: Chromium, artifacts: Path, redis_url: str) -> None:
    flushdb(redis_url)
    (tmp_path / "logs").mkdir()
    with Fleet(redis_url, repository, tmp_path / "logs") as fleet:
        gateway = fleet.gateway()
        for worker in ("dash-w1", "dash-w2"):
            fleet.worker(worker)
        fleet.wait_model_ready(gateway, MODEL)
        page = browser.page()
        open_dashboard(page, gateway.url)
        page.wait_for(f"Object.keys({READ_PAGE}.workers).length === 2", 30, "both workers listed")

        with Traffic(gateway.url, (2, 8)) as traffic:
            busy = wait_until(page, lambda s: all(w["inferences"] > 0 for w in s["workers"].values()),
                              "both workers' throughput above 0")
        assert traffic.errors == []
        assert sorted(busy["workers"]) == ["dash-w1", "dash-w2"]
        assert all(w["stats"] for w in busy["workers"].values())
        # The headline throughput is the two workers' throughput summed.
        summed = sum(w["inferences"] for w in busy["workers"].values())
        assert busy["inferences"] == pytest.approx(summed, rel=1e-9)
        sent = {str(size): count for size, count in traffic.sent.items()}
        wait_until(page, lambda s: s["bars"] == {**sent, "1": 0, "4": 0}, f"batch-size bars {sent} from both workers")
        page.screenshot(artifacts / "dashboard-fleet.png")
        assert_page_clean(page, gateway.url)
        flushdb(redis_url)
