"""The ``ferry`` command: ``serve`` (all in one), ``gateway``, ``worker``,
``speech`` (a streaming speech client) and ``lag`` (queue lag per model)."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

import uvloop

from broker.redis_url import is_redis_url
from ferry.cli import lag, speech
from ferry.cli.options import common_options, http_options, worker_options
from ferry.cli.settings import connection_limits, sagemaker, serve_settings, vertex, worker_process_settings
from ferry.processes.http_workers import default_http_workers, run_http_workers
from ferry.wiring.gateway import build_gateway_app
from ferry.wiring.serve import build_app
from ferry.wiring.worker import run_worker
from gateway.http_server import serve
from gateway.logs import configure_logging
from gateway.platforms.sagemaker import SageMakerSettings


SHARED = "redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,HOST:PORT...] or kafka://HOST:PORT[,HOST:PORT]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Serve models from a Triton-layout repository.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = common_options()
    http, worker = http_options(), worker_options()
    serve = commands.add_parser("serve", parents=[common, http, worker],
                                help="gateway and worker in one process (in-memory broker by default)")
    serve.add_argument("--broker", default="memory://", help=f"broker URL (memory://, {SHARED})")
    serve.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True,
                       help="on the embedded broker, hand plain requests straight to the worker "
                            "(--no-direct: through the in-memory broker, as on a fleet)")
    serve.add_argument("--worker-per-http", action=argparse.BooleanOptionalAction, default=False,
                       help="with --http-workers N: each HTTP process runs a worker of its own and answers its "
                            "plain requests itself, the processes sharing the broker for the rest (default: N "
                            "gateways and one worker)")
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
        multi_model = _check_platforms(args)
        # Shared memory regions (and SageMaker's multi-model list) live in one process, and SO_REUSEPORT
        # lets no client pick it.
        one_process = args.allow_client_shm or multi_model
        default_workers = 1 if one_process else default_http_workers()
        workers = default_workers if args.http_workers is None else args.http_workers
        if workers < 1:
            raise SystemExit("ferry: --http-workers must be at least 1")
        if workers > 1 and args.allow_client_shm:
            raise SystemExit("ferry: --allow-client-shm needs --http-workers 1: a shared memory region is "
                             "registered with one HTTP process, and a client cannot choose which one it reaches")
        if workers > 1 and multi_model:
            raise SystemExit("ferry: SageMaker's multi-model endpoints need --http-workers 1: the models loaded "
                             "through /models are listed by the one process that loaded them")
        limits = connection_limits(args)
        args.http_workers = workers  # each process's gRPC server shares its port with the others' above 1
        if workers > 1:
            raise SystemExit(run_http_workers(args, workers))
        build = build_app if args.command == "serve" else build_gateway_app
        settings = serve_settings(args)
        serve(build(settings), args.host, args.http_port, limits, extra_ports=settings.platform_ports)
    elif args.command == "worker":
        uvloop.run(run_worker(worker_process_settings(args)))


def _check_platforms(args: argparse.Namespace) -> bool:
    """Check the platform contracts' ports; switch SageMaker's multi-model endpoints to
    explicit model control, as Triton's SageMaker start-up does. Whether they are on."""
    platforms = [p for p in (sagemaker(args), vertex(args)) if p is not None]
    ports = [args.http_port, *(p.port for p in platforms)]
    if len(set(ports)) != len(ports):
        raise SystemExit(f"ferry: the HTTP port and the platform ports must differ, got {ports}")
    multi_model = any(isinstance(p, SageMakerSettings) and p.multi_model for p in platforms)
    if multi_model and args.model_control_mode == "none":
        args.model_control_mode = "explicit"
    return multi_model


if __name__ == "__main__":
    main()
