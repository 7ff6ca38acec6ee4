"""``ferry lag``: each model's queue lag and pending count, read once from the
broker: the numbers KEDA's redis-streams and kafka scalers scale on, for an
operator to check by hand."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import orjson

from broker import channels
from broker.errors import BrokerError
from broker.redis_url import is_redis_url
from broker.transports import open_transport
from gateway.backlog import QueueBacklog, index_models, read_backlog
from workers.repository.layout import ModelRepository, RepositoryIndex

COLUMNS = ("model", "channel", "group", "lag", "pending")


class LagError(Exception):
    pass


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    lag = commands.add_parser("lag", help="print each model's queue lag and pending count (what KEDA sees)")
    lag.add_argument("--broker", required=True, help="the fleet's broker: redis://HOST:PORT/DB, "
                     "redis+cluster://HOST:PORT[,HOST:PORT...] or kafka://HOST:PORT")
    lag.add_argument("--model-repository", type=Path, required=True,
                     help="where model names and priority levels come from")
    lag.add_argument("--model", action="append", default=[], metavar="NAME",
                     help="only this model (repeatable; default: every model in the repository)")
    lag.add_argument("--format", choices=["table", "json"], default="table")
    lag.add_argument("--channel-prefix", default=channels.PREFIX)
    lag.add_argument("--log-level", default="warning")
    lag.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        if not is_redis_url(args.broker) and urlsplit(args.broker).scheme != "kafka":
            raise LagError(f"--broker {args.broker}: expected redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,...] "
                           "or kafka://HOST:PORT")
        index = ModelRepository(args.model_repository).scan()
        models = chosen_models(index, args.model, args.model_repository)
        rows = asyncio.run(_read(args.broker, models, args.channel_prefix))
    except (LagError, BrokerError) as exc:
        print(f"ferry lag: {exc}", file=sys.stderr)
        return 1
    out.write(render_json(rows) if args.format == "json" else render_table(rows))
    return 0


def chosen_models(index: RepositoryIndex, names: list[str], root: Path) -> list[tuple[str, int]]:
    models = index_models(index)
    if not names:
        return models
    levels = dict(models)
    for name in names:
        if name not in levels:
            reason = index.errors.get(name)
            raise LagError(f"--model {name}: " + (f"its config is invalid: {reason}" if reason
                                                  else f"no such model in {root}"))
    return [(name, levels[name]) for name in dict.fromkeys(names)]


async def _read(url: str, models: list[tuple[str, int]], prefix: str) -> list[QueueBacklog]:
    transport = open_transport(url)
    try:
        return await read_backlog(transport, models, prefix)
    finally:
        await transport.aclose()


def render_json(rows: list[QueueBacklog]) -> str:
    return orjson.dumps([row.to_json() for row in rows], option=orjson.OPT_INDENT_2).decode() + "\n"


def render_table(rows: list[QueueBacklog]) -> str:
    cells = [COLUMNS, *((r.model, r.channel, r.group, str(r.lag), str(r.pending)) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    numeric = {COLUMNS.index("lag"), COLUMNS.index("pending")}
    lines = ["  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in cells]
    return "\n".join(lines) + "\n"
