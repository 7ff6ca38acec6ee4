"""The settings objects of each command, built once from its parsed options;
a value no setting accepts ends the command with the flag that gave it."""

from __future__ import annotations

import argparse
from dataclasses import replace
from urllib.parse import urlsplit

from pydantic import ValidationError

from broker.claims.check import ClaimSettings
from broker.redis_url import is_redis_url
from ferry.wiring.settings import ServeSettings, WorkerProcessSettings
from gateway.app import HttpSettings
from gateway.grpc.server import GrpcSettings
from gateway.http_server import ConnectionLimits
from gateway.management import ManagementSettings
from gateway.management_http import Restriction
from gateway.platforms.sagemaker import SageMakerSettings, in_sagemaker
from gateway.platforms.vertex import VertexSettings, in_vertex
from gateway.service import ServiceSettings
from workers.cache.settings import CacheSettings, parse_cache_config
from workers.control.messages import ControlSettings
from workers.errors import ConfigError
from workers.deadletter import DeadLetterSettings
from workers.heartbeat import HeartbeatSettings
from workers.rate_limit import parse_resource
from workers.recovery import RecoverySettings
from workers.telemetry.settings import TelemetrySettings, TraceSettings
from workers.worker import WorkerSettings


def worker_process_settings(args: argparse.Namespace) -> WorkerProcessSettings:
    return WorkerProcessSettings(
        args.model_repository, args.broker, worker_settings(args), HeartbeatSettings(args.heartbeat_s),
        job_store_url=args.job_store, session_store_url=args.session_store, telemetry=telemetry(args),
        claim_store_url=args.claim_check_store, claims=claims(args), cache=cache(args),
    )


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    settings = ServeSettings(
        model_repository=args.model_repository,
        broker_url=args.broker,
        http=HttpSettings(max_body_bytes=args.max_body_bytes, allow_client_shm=args.allow_client_shm,
                          server_name=args.server_name),
        grpc=GrpcSettings(enabled=args.allow_grpc, host=args.host, port=args.grpc_port,
                          shared_port=(args.http_workers or 1) > 1, max_message_bytes=args.max_body_bytes),
        service=ServiceSettings(channel_prefix=args.channel_prefix,
                                route_sequences=is_redis_url(args.broker),
                                direct=getattr(args, "direct", True),
                                direct_on_shared_broker=getattr(args, "worker_per_http", False)),
        job_ttl_s=args.job_ttl_s,
        job_store_url=args.job_store,
        claim_store_url=args.claim_check_store,
        claims=claims(args),
        management=ManagementSettings(control(args), args.model_load_timeout_s),
        telemetry=telemetry(args),
        sagemaker=sagemaker(args),
        vertex=vertex(args),
    )
    if args.http_restricted_api:
        try:
            restriction = Restriction.parse(args.http_restricted_api)
        except ValueError as exc:
            raise SystemExit(f"ferry: --http-restricted-api: {exc}") from None
        settings = replace(settings, http=replace(settings.http, restriction=restriction))
    if args.command != "serve":
        return settings
    return replace(settings, worker=worker_settings(args), heartbeat=HeartbeatSettings(args.heartbeat_s),
                   cache=cache(args))


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    retry = args.retry_failures
    if retry is None:
        # Only on a shared broker can another worker take the retry.
        retry = urlsplit(args.broker).scheme != "memory"
    recovery = RecoverySettings(args.claim_interval_s, args.claim_idle_s, args.max_deliveries, retry)
    models = tuple(name.strip() for name in args.models.split(",") if name.strip())
    try:
        resources = tuple(parse_resource(text) for text in args.rate_limit_resource)
    except ValueError as exc:
        raise SystemExit(f"ferry: {exc}") from None
    settings = WorkerSettings(models=models, recovery=recovery, channel_prefix=args.channel_prefix,
                              prefetch=args.prefetch, control=control(args), dead_letters=dead_letters(args),
                              rate_limit=args.rate_limit, rate_limit_resources=resources)
    return replace(settings, worker_id=args.worker_id) if args.worker_id else settings


def claims(args: argparse.Namespace) -> ClaimSettings:
    if args.claim_check_store not in ("", "none", "shm") and not is_redis_url(args.claim_check_store):
        raise SystemExit("ferry: --claim-check-store: expected redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,...], "
                         "shm or none, "
                         f"got {args.claim_check_store!r}")
    try:
        return ClaimSettings(args.claim_check_bytes, args.claim_check_ttl_s)
    except ValueError as exc:
        raise SystemExit(f"ferry: --claim-check-bytes / --claim-check-ttl-s: {exc}") from None


def dead_letters(args: argparse.Namespace) -> DeadLetterSettings:
    try:
        return DeadLetterSettings(args.dead_letter_max_count, args.dead_letter_max_bytes)
    except ValueError as exc:
        raise SystemExit(f"ferry: --dead-letter-max-count / --dead-letter-max-bytes: {exc}") from None


def telemetry(args: argparse.Namespace) -> TelemetrySettings:
    trace = TraceSettings(args.trace_exporter, args.trace_endpoint, args.trace_file, args.trace_rate)
    worker_port = getattr(args, "metrics_port", 0) if args.command == "worker" else 0
    return TelemetrySettings(metrics=args.metrics, metrics_host=getattr(args, "metrics_host", "0.0.0.0"),
                             metrics_port=worker_port, backlog_interval_s=args.backlog_interval_s, trace=trace)


def control(args: argparse.Namespace) -> ControlSettings:
    names = tuple(name.strip() for name in args.load_model if name.strip())
    return ControlSettings(args.model_control_mode, args.repository_poll_secs, names)


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    try:
        return ConnectionLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                                max_connections=args.max_connections)
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise SystemExit(f"ferry: {flag}: {error['msg']}") from None


def sagemaker(args: argparse.Namespace) -> SageMakerSettings | None:
    """SageMaker's routes: on with ``--sagemaker`` or in SageMaker's environment, off with ``--no-sagemaker``."""
    if not (in_sagemaker() if args.sagemaker is None else args.sagemaker):
        return None
    try:
        return SageMakerSettings.from_environment(port=args.sagemaker_port,
                                                  default_model=args.sagemaker_default_model or None)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SystemExit(f"ferry: --sagemaker: {error['loc'][0]}: {error['msg']}") from None


def vertex(args: argparse.Namespace) -> VertexSettings | None:
    """Vertex AI's routes: on with ``--vertex-ai`` or with ``AIP_MODE=PREDICTION``, off with ``--no-vertex-ai``."""
    if not (in_vertex() if args.vertex_ai is None else args.vertex_ai):
        return None
    try:
        return VertexSettings.from_environment(port=args.vertex_ai_port,
                                               default_model=args.vertex_ai_default_model or None,
                                               max_body_bytes=args.max_body_bytes)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SystemExit(f"ferry: --vertex-ai: {error['loc'][0]}: {error['msg']}") from None
    except ValueError as exc:
        raise SystemExit(f"ferry: --vertex-ai: {exc}") from None


def cache(args: argparse.Namespace) -> CacheSettings | None:
    try:
        return parse_cache_config(args.cache_config)
    except ConfigError as exc:
        raise SystemExit(f"ferry: {exc}") from None
