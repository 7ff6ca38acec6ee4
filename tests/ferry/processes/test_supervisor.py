"""The supervisor behind ``--http-workers``: children that keep failing at start stop
the group instead of being forked again for ever."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.processes.supervisor import QUICK_EXITS_TO_GIVE_UP, Child, Supervisor


@pytest.fixture(autouse=True)
def keep_signal_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_child_that_keeps_failing_at_start_stops_the_group(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    starts.mkdir()

    def failing() -> None:
        (starts / str(os.getpid())).touch()
        raise SystemExit(3)

    began = time.monotonic()
    assert Supervisor([Child("failing", failing)]).run() == 1
    assert len(list(starts.iterdir())) == QUICK_EXITS_TO_GIVE_UP
    assert time.monotonic() - began < 30


def test_the_other_children_are_stopped_when_one_gives_up(tmp_path: Path) -> None:
    marker = tmp_path / "steady"

    def steady() -> None:
        marker.write_text(str(os.getpid()))
        time.sleep(600)

    assert Supervisor([Child("steady", steady), Child("failing", lambda: os._exit(2))]).run() == 1
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
