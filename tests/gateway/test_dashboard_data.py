"""The dashboard's numbers: windows over stats snapshots, percentiles, sums
across workers, the sampler, and the routes through ASGI."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from broker.errors import TransportError
from gateway.dashboard_data import Sample, WorkerSnapshot, pending, window, worker_windows
from gateway.dashboard_sampler import DashboardSettings, StatsSampler
from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings
from workers.heartbeat import Beat
from workers.telemetry.stats import StatsBook
from workers.telemetry.timeline import BatchRecord, Timeline

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
NS = 1_000_000_000


def record(book: StatsBook, rows: int, seconds: float = 0.004, outcome: str = "success",
           model: str = "add_sub", version: str = "1") -> None:
    """One request of ``rows`` rows, alone in its batch, answered after ``seconds``."""
    timeline = Timeline("r", model, version, "w", enqueued_ns=NS, received_ns=NS)
    book.received(timeline)
    batch = BatchRecord(model, version, "b", rows, 1, NS, NS + int(seconds * NS / 2))
    book.batch_ran(batch)
    timeline.ran_in(batch)
    timeline.rows, timeline.outcome, timeline.done_ns = rows, outcome, NS + int(seconds * NS)
    book.finished(timeline)


def sample(at_s: float, **workers: tuple[float, StatsBook]) -> Sample:
    return Sample(at_s, {worker: WorkerSnapshot(taken_s, book.to_wire())
                         for worker, (taken_s, book) in workers.items()})


def bars(counts: list[dict]) -> dict[int | None, int]:
    return {bar["le"]: bar["count"] for bar in counts if bar["count"]}


def test_a_window_is_the_difference_between_snapshots_over_the_worker_clock():
    book = StatsBook()
    record(book, 8)  # before the window: not counted
    first = sample(100.0, w1=(50.0, book))
    for rows in (1, 4, 4, 8):
        record(book, rows, seconds=0.004)
    record(book, 2, outcome="internal")  # a failure counts as a request, not as inferences
    numbers = window([first, sample(110.0, w1=(55.0, book))], since_s=100.0)["add_sub"].to_json()
    # 5 s on the worker's clock, whatever the gateway's says.
    assert numbers["requests_per_s"] == pytest.approx(5 / 5)
    assert numbers["inferences_per_s"] == pytest.approx(17 / 5)
    assert bars(numbers["batch_sizes"]) == {1: 1, 2: 1, 4: 2, 8: 1}
    # Every request took 4 ms: both quantiles fall in the (2.5 ms, 5 ms] bucket.
    assert 2.5 < numbers["p50_ms"] <= numbers["p99_ms"] <= 5.0


def test_no_requests_in_a_window_means_no_latency_rather_than_zero():
    book = StatsBook()
    record(book, 1)
    numbers = window([sample(0, w1=(0, book)), sample(2, w1=(2, book))], since_s=0)["add_sub"].to_json()
    assert numbers["requests_per_s"] == 0 and numbers["p50_ms"] is None and numbers["p99_ms"] is None


def test_percentiles_follow_the_slow_tail():
    book = StatsBook()
    base = sample(0, w1=(0, book))
    for _ in range(98):
        record(book, 1, seconds=0.0008)
    for _ in range(2):
        record(book, 1, seconds=2.0)
    numbers = window([base, sample(10, w1=(10, book))], since_s=0)["add_sub"]
    assert numbers.latency_ms(0.5) < 1.0  # in the (0.5 ms, 1 ms] bucket
    assert 1000 < numbers.latency_ms(0.99) <= 2500  # the 99th of 100 is one of the two slow ones


def test_rates_are_summed_across_workers_each_over_its_own_interval():
    one, two = StatsBook(), StatsBook()
    before = sample(0, w1=(1000.0, one), w2=(7.0, two))
    for _ in range(10):
        record(one, 4)  # 40 rows in 10 s
    for _ in range(5):
        record(two, 2)  # 10 rows in 1 s: the second worker's beat is only 1 s newer
    after = sample(10, w1=(1010.0, one), w2=(8.0, two))
    per_worker = worker_windows([before, after], since_s=0)
    assert per_worker["w1"]["add_sub"].inferences_per_s == pytest.approx(4.0)
    assert per_worker["w2"]["add_sub"].inferences_per_s == pytest.approx(10.0)
    total = window([before, after], since_s=0)["add_sub"]
    assert total.inferences_per_s == pytest.approx(14.0)
    assert total.requests_per_s == pytest.approx(1.0 + 5.0)
    assert bars(total.to_json()["batch_sizes"]) == {2: 5, 4: 10}


def test_versions_of_a_model_are_summed_and_models_kept_apart():
    book = StatsBook()
    before = sample(0, w1=(0, book))
    record(book, 2, version="1")
    record(book, 2, version="2")
    record(book, 8, model="other")
    windows = window([before, sample(1, w1=(1, book))], since_s=0)
    assert windows["add_sub"].inferences_per_s == pytest.approx(4.0)
    assert windows["other"].inferences_per_s == pytest.approx(8.0)


def test_the_window_starts_at_the_last_snapshot_before_it():
    book = StatsBook()
    history = [sample(0, w1=(0, book))]
    record(book, 8)
    history.append(sample(10, w1=(10, book)))
    record(book, 1)
    history.append(sample(20, w1=(20, book)))
    assert bars(window(history, since_s=10)["add_sub"].to_json()["batch_sizes"]) == {1: 1}
    assert bars(window(history, since_s=5)["add_sub"].to_json()["batch_sizes"]) == {1: 1, 8: 1}


def test_a_worker_that_joined_during_the_window_counts_from_its_first_snapshot():
    old, new = StatsBook(), StatsBook()
    record(new, 8)  # before its first snapshot
    history = [sample(0, w1=(0, old)), sample(2, w1=(2, old), w2=(2, new))]
    record(new, 4)
    history.append(sample(4, w1=(4, old), w2=(4, new)))
    assert bars(window(history, since_s=-60)["add_sub"].to_json()["batch_sizes"]) == {4: 1}


def test_a_restarted_worker_is_left_out_rather_than_counted_negative():
    book = StatsBook()
    for _ in range(10):
        record(book, 4)
    restarted = StatsBook()
    record(restarted, 1)
    healthy = StatsBook()
    before = sample(0, w1=(0, book), w2=(0, healthy))
    record(healthy, 2)
    windows = worker_windows([before, sample(5, w1=(5, restarted), w2=(5, healthy))], since_s=0)
    assert sorted(windows) == ["w2"]


def test_pending_is_summed_across_workers_and_never_negative():
    one, two = StatsBook(), StatsBook()
    one.pending["add_sub"] = 3
    two.pending["add_sub"] = 2
    two.pending["other"] = -1  # a finish counted before its receive
    assert pending(sample(0, w1=(0, one), w2=(0, two))) == {"add_sub": 5, "other": 0}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """Two workers' books, read as beats; ``broken`` makes the read fail like a broker outage."""

    def __init__(self, clock: Clock) -> None:
        self.books = {"w1": StatsBook(), "w2": StatsBook()}
        self.clock = clock
        self.broken = False

    async def __call__(self) -> dict[str, Beat]:
        if self.broken:
            raise TransportError("redis is down")
        sent_ns = int(self.clock.now * NS)
        return {w: Beat(w, {"add_sub": (1,)}, book.to_wire(), sent_ns) for w, book in self.books.items()}


async def test_the_sampler_adds_a_point_per_sample_and_forgets_old_ones():
    clock = Clock()
    fleet = Fleet(clock)
    sampler = StatsSampler(fleet, DashboardSettings(interval_s=2, rate_window_s=4, summary_window_s=10,
                                                    history_s=20), clock)
    await sampler.sample()
    assert sampler.points() == [] and sampler.summary() == {}
    for step in range(1, 21):
        clock.now += 2
        record(fleet.books["w1"], 4)
        record(fleet.books["w2"], 8)
        await sampler.sample()
    points = sampler.points()
    assert len(points) == 11  # 20 s of history at one point per 2 s
    # Each point covers the last 4 s: two requests per worker, 24 rows, over 4 s.
    assert points[-1].models["add_sub"].inferences_per_s == pytest.approx(6.0)
    # The summary covers 10 s: five batches of each size.
    assert bars(sampler.summary()["add_sub"].to_json()["batch_sizes"]) == {4: 5, 8: 5}
    assert {w: m["add_sub"].inferences_per_s for w, m in sampler.by_worker().items()} == \
        pytest.approx({"w1": 2.0, "w2": 4.0})
    assert sorted(sampler.beats()) == ["w1", "w2"]


async def test_a_failed_read_keeps_the_last_sample():
    clock = Clock()
    fleet = Fleet(clock)
    sampler = StatsSampler(fleet, DashboardSettings(), clock)
    await sampler.sample()
    fleet.broken = True
    clock.now += 2
    await sampler.sample()
    assert sorted(sampler.beats()) == ["w1", "w2"]
    assert sampler.latest() is not None and sampler.latest().at_s == 1000.0


@pytest.fixture
async def client(tmp_path: Path):
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: -3\n')
    app = build_app(ServeSettings(model_repository=tmp_path))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ferry") as http:
            yield http


async def test_the_page_is_served_self_contained(client):
    page = await client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert 'id="chart-throughput"' in page.text and 'id="models-table"' in page.text
    assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page.text


async def test_the_data_lists_models_workers_and_queues(client):
    data = (await client.get("/dashboard/data")).json()
    add_sub, broken = data["models"]
    assert add_sub == {"name": "add_sub", "versions": [1], "ready_versions": [1], "ready": True, "reason": ""}
    assert broken["name"] == "broken" and broken["ready"] is False and "config.pbtxt" in broken["reason"]
    assert len(data["workers"]) == 1 and data["workers"][0]["models"] == {"add_sub": [1]}
    assert data["workers"][0]["stats"] is True
    assert data["now"]["add_sub"]["inferences_per_s"] == 0 and data["now"]["add_sub"]["p50_ms"] is None
    assert set(data["series"]) == {"t_ms", "models"}
    assert data["settings"]["interval_s"] == 2.0
