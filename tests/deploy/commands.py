"""Checking a ferry command line from a deployment file against ferry's real parser."""

from __future__ import annotations

import argparse
import contextlib
import io
from urllib.parse import urlsplit

from broker.redis_url import RedisUrlError, is_redis_url, parse_redis_url
from ferry.cli.main import build_parser


class BadCommand(AssertionError):
    pass


def parse_ferry(argv: list[str], where: str) -> argparse.Namespace:
    """ferry's own argparse on ``argv`` (the arguments after ``ferry``); BadCommand says why not."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return build_parser().parse_args(argv)
    except SystemExit:
        raise BadCommand(f"{where}: ferry {' '.join(argv)!r} does not parse: {errors.getvalue().strip()}") from None


def broker_endpoint(url: str, where: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a redis://, redis+cluster:// (its first node) or kafka:// URL
    ferry would accept as a shared broker."""
    if is_redis_url(url):
        try:
            target = parse_redis_url(url)
        except RedisUrlError as exc:
            raise BadCommand(f"{where}: {exc}") from None
        (host, port), = target.nodes[:1]
        return urlsplit(url).scheme, host, port
    parts = urlsplit(url)
    if parts.scheme != "kafka" or parts.hostname is None or parts.port is None:
        raise BadCommand(f"{where}: {url!r} is not a redis://HOST:PORT, redis+cluster://HOST:PORT[,...] "
                         "or kafka://HOST:PORT broker URL")
    return parts.scheme, parts.hostname, parts.port