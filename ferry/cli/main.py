"""The ``ferry`` command: ``serve`` (all in one), ``gateway``, ``worker``,
``speech`` (a streaming speech client) and ``lag`` (queue lag per model)."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

import uvloop

from broker.redis_url import is_redis_url
from ferry.cli import lag, speech
from ferry.cli.options import common_options, http_options, worker_options
from ferry.cli.settings import connection_limits, serve_settings, worker_process_settings
from ferry.processes.http_workers import default_http_workers, run_http_workers
from ferry.wiring.gateway import build_gateway_app
from ferry.wiring.serve import build_app
from ferry.wiring.worker import run_worker
from gateway.http_server import serve
from gateway.logs import configure_logging


SHARED = "redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,HOST:PORT...] or kafka://HOST:PORT[,HOST:PORT]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Serve models from a Triton-layout repository.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = common_options()
    http, worker = http_options(), worker_options()
    serve = commands.add_parser("serve", parents=[common, http, worker],
                                help="gateway and worker in one process (in-memory broker by default)")
    serve.add_argument("--broker", default="memory://", help=f"broker URL (memory://, {SHARED})")
    gateway = commands.add_parser("gateway", parents=[common, http], help="the HTTP gateway alone")
    gateway.add_argument("--broker", required=True, help=f"shared broker URL ({SHARED})")
    alone = commands.add_parser("worker", parents=[common, worker], help="a worker alone, no HTTP")
    alone.add_argument("--broker", required=True, help=f"shared broker URL ({SHARED})")
    alone.add_argument("--metrics-port", type=int, default=8002,
                       help="the port of this worker's /metrics and /v2/health endpoints (0: none)")
    alone.add_argument("--metrics-host", default="0.0.0.0", help="the address of that port")
    speech.add_parser(commands)
    lag.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "speech":
        raise SystemExit(speech.run(args))
    configure_logging(args.log_level, args.log_format)
    if not args.model_repository.is_dir():
        raise SystemExit(f"ferry: --model-repository {args.model_repository} is not a directory")
    if args.command == "lag":
        raise SystemExit(lag.run(args))
    if args.command in ("gateway", "worker") and not is_redis_url(args.broker) \
            and urlsplit(args.broker).scheme != "kafka":
        raise SystemExit(f"ferry {args.command}: --broker must be a shared broker ({SHARED})")
    if args.load_model and args.model_control_mode != "explicit":
        raise SystemExit("ferry: --load-model requires --model-control-mode=explicit")
    if args.repository_poll_secs <= 0:
        raise SystemExit("ferry: --repository-poll-secs must be above 0")
    if not 0.0 <= args.trace_rate <= 1.0:
        raise SystemExit("ferry: --trace-rate must be between 0 and 1")
    if args.trace_exporter == "jsonl" and args.trace_file is None:
        raise SystemExit("ferry: --trace-exporter jsonl needs --trace-file")
    if args.command in ("serve", "gateway"):
        # Shared memory regions are registered with one process, and SO_REUSEPORT lets no client pick it.
        default_workers = 1 if args.allow_client_shm else default_http_workers()
        workers = default_workers if args.http_workers is None else args.http_workers
        if workers < 1:
            raise SystemExit("ferry: --http-workers must be at least 1")
        if workers > 1 and args.allow_client_shm:
            raise SystemExit("ferry: --allow-client-shm needs --http-workers 1: a shared memory region is "
                             "registered with one HTTP process, and a client cannot choose which one it reaches")
        limits = connection_limits(args)
        args.http_workers = workers  # each process's gRPC server shares its port with the others' above 1
        if workers > 1:
            raise SystemExit(run_http_workers(args, workers))
        build = build_app if args.command == "serve" else build_gateway_app
        serve(build(serve_settings(args)), args.host, args.http_port, limits)
    elif args.command == "worker":
        uvloop.run(run_worker(worker_process_settings(args)))


if __name__ == "__main__":
    main()
