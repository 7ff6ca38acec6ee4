"""``ferry lag``'s choice of models and its two renderings."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import pytest

from ferry.cli import lag as lag_cli
from gateway.backlog import QueueBacklog
from workers.repository.layout import ModelRepository

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"


def args(repo: Path, broker: str, *models: str, fmt: str = "json") -> argparse.Namespace:
    return argparse.Namespace(broker=broker, model_repository=repo, model=list(models), format=fmt,
                              channel_prefix="ferry")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: -3\n')
    return tmp_path


def test_models_come_from_the_repository_or_the_named_ones(repo: Path):
    index = ModelRepository(repo).scan()
    assert lag_cli.chosen_models(index, [], repo) == [("add_sub", 0)]
    assert lag_cli.chosen_models(index, ["add_sub", "add_sub"], repo) == [("add_sub", 0)]
    with pytest.raises(lag_cli.LagError, match="--model nope: no such model"):
        lag_cli.chosen_models(index, ["nope"], repo)
    with pytest.raises(lag_cli.LagError, match="--model broken: its config is invalid"):
        lag_cli.chosen_models(index, ["broken"], repo)


def test_an_unknown_model_or_broker_fails_with_exit_1(repo: Path, redis_url: str, capsys):
    assert lag_cli.run(args(repo, redis_url, "nope")) == 1
    assert "--model nope" in capsys.readouterr().err
    assert lag_cli.run(args(repo, "memory://")) == 1
    assert "expected redis://" in capsys.readouterr().err


def test_renderings_carry_every_column():
    rows = [QueueBacklog("add_sub", "ferry.add_sub.requests", "ferry.add_sub.workers", 7, 2)]
    assert json.loads(lag_cli.render_json(rows)) == [
        {"model": "add_sub", "channel": "ferry.add_sub.requests", "group": "ferry.add_sub.workers",
         "lag": 7, "pending": 2, "depth": 9}]
    header, line = lag_cli.render_table(rows).splitlines()
    assert header.split() == ["model", "channel", "group", "lag", "pending"]
    assert line.split() == ["add_sub", "ferry.add_sub.requests", "ferry.add_sub.workers", "7", "2"]


def test_it_reads_an_empty_redis_as_zero(repo: Path, redis_url: str):
    out = io.StringIO()
    assert lag_cli.run(args(repo, redis_url, "add_sub"), out) == 0
    [row] = json.loads(out.getvalue())
    assert (row["model"], row["lag"], row["pending"]) == ("add_sub", 0, 0)


def test_it_reads_each_priority_level_of_a_model_on_a_redis_cluster(tmp_path: Path, redis_cluster_url: str):
    from broker import channels
    from broker.redis_url import sync_client
    from tests.redis_cluster import flush_cluster

    flush_cluster(redis_cluster_url)
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    config = tmp_path / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "dynamic_batching {", "dynamic_batching { priority_levels: 2 default_priority_level: 2"))
    high, low = channels.request_channels("add_sub", 2)
    client = sync_client(redis_cluster_url)
    try:
        for _ in range(3):
            client.xadd(channels.redis_key(low), {b"d": b"x"})
        client.xgroup_create(channels.redis_key(low), channels.worker_group("add_sub"), id="0")
        client.xreadgroup(channels.worker_group("add_sub"), "w", {channels.redis_key(low): ">"}, count=1)
    finally:
        client.close()
    out = io.StringIO()
    assert lag_cli.run(args(tmp_path, redis_cluster_url, "add_sub"), out) == 0
    assert [(row["channel"], row["lag"], row["pending"]) for row in json.loads(out.getvalue())] == [
        (high, 0, 0), (low, 2, 1)]
