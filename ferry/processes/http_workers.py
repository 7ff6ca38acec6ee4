"""``--http-workers N``: N HTTP gateway processes on one port, each its own gateway
(its own id and reply channel), beside the worker of ``ferry serve``; with
``--worker-per-http``, N processes each with a worker of its own that answers
the plain requests its connections bring (no broker between them), the
processes sharing the broker for async jobs, sequences and model control.

With the embedded broker, the processes meet on a bundled Valkey server
(``valkey.py``) instead; ``ferry serve`` keeps the embedded broker's default of
answering a model's error at once rather than retrying it elsewhere. The
supervisor binds the port first, so a port that is taken fails the command at
once, and holds it while its children come and go.
"""

from __future__ import annotations

import argparse
import os

from contextlib import ExitStack
from dataclasses import replace
from urllib.parse import urlsplit

import uvloop

from ferry.cli.settings import connection_limits, serve_settings, worker_process_settings
from ferry.processes.supervisor import Child, Supervisor
from ferry.processes.valkey import EmbeddedValkey
from ferry.wiring.gateway import build_gateway_app
from ferry.wiring.serve import build_app
from ferry.wiring.worker import run_worker
from gateway.http_server import serve, shared_port_socket

MAX_DEFAULT = 8


def default_http_workers(cores: int | None = None) -> int:
    """A quarter of the cores this process may run on (at least 1, at most 8): the
    rest are left to the worker, its model and the broker."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT, cores // 4))


def run_http_workers(args: argparse.Namespace, count: int) -> int:
    """Serve ``ferry serve`` or ``ferry gateway`` as ``count`` HTTP processes until SIGTERM/SIGINT."""
    with ExitStack() as stack:
        args = argparse.Namespace(**vars(args))
        kept: list[EmbeddedValkey] = []
        if urlsplit(args.broker).scheme == "memory":
            if args.retry_failures is None:
                args.retry_failures = False  # as on the embedded broker: one worker, no one else to retry
            if not args.claim_check_store:
                args.claim_check_store = "shm"  # every process is on this host (docs/claim-check.md)
            valkey = stack.enter_context(EmbeddedValkey())
            kept.append(valkey)
            args.broker = valkey.url
        port = _reserve(stack, args.host, args.http_port)
        for platform_port in serve_settings(args).platform_ports:
            _reserve(stack, args.host, platform_port)
        per_http = args.command == "serve" and args.worker_per_http
        children = [_http(args, port, index, with_worker=per_http) for index in range(count)]
        if args.command == "serve" and not per_http:
            children.insert(0, _worker(args))
        return Supervisor(children, kept=kept).run()


def _reserve(stack: ExitStack, host: str, port: int) -> int:
    """Bind ``port`` for the command's life (the children share it); its number."""
    try:
        reserved = stack.enter_context(shared_port_socket(host, port))
    except OSError as exc:
        raise SystemExit(f"ferry: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return int(reserved.getsockname()[1])


def _http(args: argparse.Namespace, port: int, index: int, with_worker: bool) -> Child:
    """One of the HTTP processes: a gateway, or with ``with_worker`` (``--worker-per-http``) a
    gateway with a worker of its own, as one ``ferry serve`` process is, on the shared broker."""
    http_args = argparse.Namespace(**{**vars(args), "command": "serve" if with_worker else "gateway",
                                      "http_port": port})
    build = build_app if with_worker else build_gateway_app

    def run() -> None:
        # Built in the child, so that each process has gateway (and worker) ids of its own.
        settings = serve_settings(http_args)
        serve(build(settings), http_args.host, port, connection_limits(http_args), reuse_port=True,
              extra_ports=settings.platform_ports)

    return Child(f"http-{index}", run)


def _worker(args: argparse.Namespace) -> Child:
    worker_args = argparse.Namespace(**{**vars(args), "command": "worker"})
    settings = worker_process_settings(worker_args)
    # Its metrics reach the gateways through its heartbeats, as in a fleet: no port of its own.
    settings = replace(settings, telemetry=replace(settings.telemetry, metrics_port=0))
    return Child("worker", lambda: uvloop.run(run_worker(settings)))
