"""The ``ferry`` command: ``serve`` (all in one), ``gateway``, ``worker``,
``speech`` (a streaming speech client) and ``lag`` (queue lag per model)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import uvloop
from pydantic import ValidationError

from broker import channels
from gateway.app import HttpSettings
from gateway.embedded import ServeSettings, build_app
from gateway.fleet import WorkerProcessSettings, build_gateway_app, run_worker
from gateway.http_server import ConnectionLimits, serve
from gateway.jobs import DEFAULT_TTL_S
from gateway.logs import configure_logging
from gateway.management import ManagementSettings
from gateway.management_http import Restriction
from gateway.service import ServiceSettings
from gateway import lag_cli, speech_cli
from workers.control import MODES, ControlSettings
from workers.deadletter import DeadLetterSettings
from workers.heartbeat import HeartbeatSettings
from workers.recovery import RecoverySettings
from workers.telemetry.settings import TRACE_EXPORTERS, TelemetrySettings, TraceSettings
from workers.worker import WorkerSettings


SHARED = "redis://HOST:PORT/DB or kafka://HOST:PORT[,HOST:PORT]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Serve models from a Triton-layout repository.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = _common_options()
    http, worker = _http_options(), _worker_options()
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
    speech_cli.add_parser(commands)
    lag_cli.add_parser(commands)
    return parser


def _common_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--model-repository", type=Path, required=True)
    options.add_argument("--log-level", default="info")
    options.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    options.add_argument("--channel-prefix", default=channels.PREFIX,
                         help="prefix of every stream, topic and key name (ferry.<model>.requests)")
    options.add_argument("--job-store", default="",
                         help="where async jobs live: redis://HOST:PORT/DB (default: the broker's Redis, "
                              "else the gateway's memory)")
    options.add_argument("--model-control-mode", choices=MODES, default="none",
                         help="none: load every model at start, refuse load/unload; poll: also reload what "
                              "changes in the repository; explicit: load --load-model models, then on request")
    options.add_argument("--repository-poll-secs", type=float, default=15.0,
                         help="poll mode: how often to scan the repository")
    options.add_argument("--load-model", action="append", default=[], metavar="MODEL",
                         help="explicit mode: a model to load at start (repeatable; '*' = all)")
    options.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True,
                         help="serve Prometheus metrics on /metrics (default: on)")
    options.add_argument("--backlog-interval-s", type=float, default=5.0,
                         help="how often queue depth and consumer lag are read from the broker")
    options.add_argument("--trace-exporter", choices=TRACE_EXPORTERS, default="none",
                         help="where OpenTelemetry spans go (default: none, tracing off)")
    options.add_argument("--trace-endpoint", default="",
                         help="otlp: the OTLP/HTTP traces URL (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
                              "else http://localhost:4318/v1/traces)")
    options.add_argument("--trace-file", type=Path, default=None, help="jsonl: the file spans are appended to")
    options.add_argument("--trace-rate", type=float, default=1.0,
                         help="share of new traces sampled, 0 to 1 (a caller's traceparent decides its own)")
    return options


def _http_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--http-port", type=int, default=8000)
    options.add_argument("--host", default="0.0.0.0")
    options.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    defaults = ConnectionLimits()
    options.add_argument("--header-timeout-s", type=float, default=defaults.header_timeout_s,
                         help="close a connection whose request headers are not complete this long after it "
                              "opens or its request begins (408 for a partial request)")
    options.add_argument("--body-timeout-s", type=float, default=defaults.body_timeout_s,
                         help="answer 408 and close when an unfinished request body sends nothing this long")
    options.add_argument("--max-connections", type=int, default=defaults.max_connections,
                         help="open HTTP connections at most; one more gets 503 and is closed")
    options.add_argument("--job-ttl-s", type=float, default=DEFAULT_TTL_S,
                         help="how long an async job and its result are kept")
    options.add_argument("--http-restricted-api", default="", metavar="model-repository:HEADER=VALUE",
                         help="the repository index, load and unload need this header and value (else 403)")
    options.add_argument("--model-load-timeout-s", type=float, default=120.0,
                         help="how long a load or unload waits for the workers")
    return options


def _worker_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--models", default="", help="comma-separated models to serve (default: all)")
    options.add_argument("--worker-id", default=None)
    options.add_argument("--heartbeat-s", type=float, default=1.0, help="heartbeat interval")
    options.add_argument("--claim-interval-s", type=float, default=1.0, help="how often to claim stale work")
    options.add_argument("--claim-idle-s", type=float, default=10.0,
                         help="claim a delivery once it has gone unacked this long")
    options.add_argument("--max-deliveries", type=int, default=5,
                         help="dead-letter a request after this many deliveries")
    options.add_argument("--retry-failures", action=argparse.BooleanOptionalAction, default=None,
                         help="when a model raises, let any worker retry the request (up to --max-deliveries) "
                              "instead of answering with the error; default: on with a shared broker")
    options.add_argument("--dead-letter-max-count", type=int, default=DeadLetterSettings().max_count,
                         help="the dead-letter channel keeps this many letters, the newest")
    options.add_argument("--dead-letter-max-bytes", type=int, default=DeadLetterSettings().max_bytes,
                         help="what those letters may add up to: each is at most this divided by "
                              "--dead-letter-max-count bytes, a longer payload cut to its first bytes")
    options.add_argument("--session-store", default="",
                         help="where stateful models checkpoint sequences: redis://HOST:PORT/DB (default: the "
                              "broker's Redis; on Kafka, none unless given)")
    return options


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "speech":
        raise SystemExit(speech_cli.run(args))
    configure_logging(args.log_level, args.log_format)
    if not args.model_repository.is_dir():
        raise SystemExit(f"ferry: --model-repository {args.model_repository} is not a directory")
    if args.command == "lag":
        raise SystemExit(lag_cli.run(args))
    if args.command in ("gateway", "worker") and urlsplit(args.broker).scheme not in ("redis", "kafka"):
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
        limits = _connection_limits(args)
        build = build_app if args.command == "serve" else build_gateway_app
        serve(build(_serve_settings(args)), args.host, args.http_port, limits)
    elif args.command == "worker":
        uvloop.run(run_worker(WorkerProcessSettings(
            args.model_repository, args.broker, _worker_settings(args), HeartbeatSettings(args.heartbeat_s),
            job_store_url=args.job_store, session_store_url=args.session_store,
            telemetry=_telemetry(args),
        )))


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    settings = ServeSettings(
        model_repository=args.model_repository,
        broker_url=args.broker,
        http=HttpSettings(max_body_bytes=args.max_body_bytes),
        service=ServiceSettings(channel_prefix=args.channel_prefix,
                                route_sequences=urlsplit(args.broker).scheme == "redis"),
        job_ttl_s=args.job_ttl_s,
        job_store_url=args.job_store,
        management=ManagementSettings(_control(args), args.model_load_timeout_s),
        telemetry=_telemetry(args),
    )
    if args.http_restricted_api:
        try:
            restriction = Restriction.parse(args.http_restricted_api)
        except ValueError as exc:
            raise SystemExit(f"ferry: --http-restricted-api: {exc}") from None
        settings = replace(settings, http=replace(settings.http, restriction=restriction))
    if args.command != "serve":
        return settings
    return replace(settings, worker=_worker_settings(args), heartbeat=HeartbeatSettings(args.heartbeat_s))


def _worker_settings(args: argparse.Namespace) -> WorkerSettings:
    retry = args.retry_failures
    if retry is None:
        # Only on a shared broker can another worker take the retry.
        retry = urlsplit(args.broker).scheme != "memory"
    recovery = RecoverySettings(args.claim_interval_s, args.claim_idle_s, args.max_deliveries, retry)
    models = tuple(name.strip() for name in args.models.split(",") if name.strip())
    settings = WorkerSettings(models=models, recovery=recovery, channel_prefix=args.channel_prefix,
                              control=_control(args), dead_letters=_dead_letters(args))
    return replace(settings, worker_id=args.worker_id) if args.worker_id else settings


def _dead_letters(args: argparse.Namespace) -> DeadLetterSettings:
    try:
        return DeadLetterSettings(args.dead_letter_max_count, args.dead_letter_max_bytes)
    except ValueError as exc:
        raise SystemExit(f"ferry: --dead-letter-max-count / --dead-letter-max-bytes: {exc}") from None


def _telemetry(args: argparse.Namespace) -> TelemetrySettings:
    trace = TraceSettings(args.trace_exporter, args.trace_endpoint, args.trace_file, args.trace_rate)
    worker_port = getattr(args, "metrics_port", 0) if args.command == "worker" else 0
    return TelemetrySettings(metrics=args.metrics, metrics_host=getattr(args, "metrics_host", "0.0.0.0"),
                             metrics_port=worker_port, backlog_interval_s=args.backlog_interval_s, trace=trace)


def _control(args: argparse.Namespace) -> ControlSettings:
    names = tuple(name.strip() for name in args.load_model if name.strip())
    return ControlSettings(args.model_control_mode, args.repository_poll_secs, names)


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    try:
        return ConnectionLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                                max_connections=args.max_connections)
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise SystemExit(f"ferry: {flag}: {error['msg']}") from None


if __name__ == "__main__":
    main()
