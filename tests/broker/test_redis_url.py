"""Redis URLs: one server or a Redis Cluster, and the keys a cluster needs on one slot."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from broker import channels
from broker.redis_url import RedisUrlError, is_redis_url, parse_redis_url


def test_a_cluster_url_names_its_startup_nodes_and_credentials():
    target = parse_redis_url("rediss+cluster://ops:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002/0")
    assert target.cluster and target.tls
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert (target.username, target.password) == ("ops", "p@ss")


def test_a_single_server_url_is_one_node():
    target = parse_redis_url("redis://127.0.0.1:6380/3")
    assert not target.cluster and target.nodes == (("127.0.0.1", 6380),) and not target.tls


@pytest.mark.parametrize("url, fault", [
    ("redis+cluster://a:1/2", "a Redis Cluster has only database 0"),
    ("redis+cluster://a:port", "node 'a:port' is not host:port"),
    ("redis+cluster://", "name at least one node"),
    ("redis://a:x/0", "the port is not a number"),
    ("kafka://a:1", "expected redis://, rediss://, redis+cluster:// or rediss+cluster://"),
])
def test_a_url_ferry_cannot_use_is_refused_naming_it(url: str, fault: str):
    with pytest.raises(RedisUrlError) as refused:
        parse_redis_url(url)
    assert url in str(refused.value) and fault in str(refused.value)


def test_which_urls_are_redis():
    assert all(is_redis_url(u) for u in ("redis://h", "rediss://h", "redis+cluster://h:1", "rediss+cluster://h:1"))
    assert not any(is_redis_url(u) for u in ("memory://", "kafka://h:9092", "shm", ""))


@pytest.mark.parametrize("model", ["add_sub", "a.b", "un{closed"])
@pytest.mark.parametrize("levels", [0, 3])
def test_a_models_request_and_session_streams_share_one_slot(model: str, levels: int):
    # (A name with a {tag} of its own may spread them; the transport then polls across slots.)
    keys = [channels.redis_key(c) for c in channels.request_channels(model, levels)]
    keys += [channels.redis_key(channels.session_channel(model, worker)) for worker in ("w1", "host.w2")]
    assert len({key_slot(key.encode()) for key in keys}) == 1, keys


def test_level_keys_carry_the_base_channel_as_their_tag_and_other_channels_keep_their_names():
    assert channels.redis_key("ferry.m.requests.p2") == "{ferry.m.requests}.p2"
    assert key_slot(b"{ferry.m.requests}.p2") == key_slot(b"ferry.m.requests")
    for channel in ("ferry.m.requests", "ferry.replies.gw1", "ferry.deadletter", "ferry.jobs.replies"):
        assert channels.redis_key(channel) == channel


@pytest.mark.parametrize("sequence_id", [7, "7", "a}b"])
def test_a_sequences_session_and_state_keys_share_one_slot(sequence_id: int | str):
    session, state = channels.session_key("m", sequence_id), channels.state_key("m", sequence_id)
    assert session != state and key_slot(session.encode()) == key_slot(state.encode())
