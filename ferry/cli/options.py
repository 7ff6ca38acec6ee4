"""The options of ``ferry serve``, ``ferry gateway`` and ``ferry worker``, in the
three groups they share."""

from __future__ import annotations

import argparse
from pathlib import Path

from broker import channels
from broker.claims.check import ClaimSettings
from gateway.http_server import ConnectionLimits
from gateway.jobs import DEFAULT_TTL_S
from gateway.metadata import SERVER_NAME
from workers.control.messages import MODES
from workers.deadletter import DeadLetterSettings
from workers.rate_limit import MODES as RATE_LIMIT_MODES
from workers.telemetry.settings import TRACE_EXPORTERS
from workers.worker.settings import WorkerSettings


def common_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--model-repository", type=Path, required=True)
    options.add_argument("--log-level", default="info")
    options.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    options.add_argument("--channel-prefix", default=channels.PREFIX,
                         help="prefix of every stream, topic and key name (ferry.<model>.requests)")
    options.add_argument("--job-store", default="",
                         help="where async jobs live: redis://HOST:PORT/DB (default: the broker's Redis, "
                              "else the gateway's memory)")
    options.add_argument("--claim-check-store", default="",
                         help="where tensors of --claim-check-bytes or more travel instead of inside the broker "
                              "message: redis://HOST:PORT/DB, shm (/dev/shm, every process on one host), or none "
                              "(default: the broker's Redis, on Kafka the --job-store Redis, else none)")
    options.add_argument("--claim-check-bytes", type=int, default=None,
                         help="the size from which a tensor is claim-checked (default: 65536 through shm, "
                              "524288 through Redis; 0: never)")
    options.add_argument("--claim-check-ttl-s", type=float, default=ClaimSettings().ttl_s,
                         help="how long claim-checked bytes a crash left behind are kept")
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


def http_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--http-port", type=int, default=8000)
    options.add_argument("--http-workers", type=int, default=None, metavar="N",
                         help="HTTP processes sharing the port, each its own gateway (default: a quarter of the "
                              "cores, 1 to 8); above 1, `ferry serve` runs its broker as a bundled Valkey server")
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
    options.add_argument("--allow-client-shm", type=_true_or_false, nargs="?", const=True, default=False,
                         metavar="true|false", help="let clients register system shared memory regions "
                                                     "(Triton's flag; off by default, as in Triton)")
    options.add_argument("--grpc-port", type=int, default=8001,
                         help="port of Triton's gRPC service (0: any free port, which the log names)")
    options.add_argument("--allow-grpc", type=_true_or_false, nargs="?", const=True, default=True,
                         metavar="true|false", help="serve Triton's gRPC protocol beside HTTP (Triton's flag)")
    options.add_argument("--server-name", default=SERVER_NAME,
                         help="the name GET /v2 reports (say `triton`, for tools that check it)")
    platform_options(options)
    return options


def platform_options(options: argparse.ArgumentParser) -> None:
    """SageMaker's and Vertex AI's container contracts, each on a port of its own (docs/platforms.md)."""
    options.add_argument("--sagemaker", action=argparse.BooleanOptionalAction, default=None,
                         help="answer SageMaker's /ping, /invocations and multi-model /models routes (default: on "
                              "when SageMaker's SAGEMAKER_* environment is set)")
    options.add_argument("--sagemaker-port", type=int, default=None,
                         help="their port (default: SAGEMAKER_BIND_TO_PORT, else 8080)")
    options.add_argument("--sagemaker-default-model", default="",
                         help="the model /invocations serves (default: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, "
                              "else the repository's only model)")
    options.add_argument("--vertex-ai", action=argparse.BooleanOptionalAction, default=None,
                         help="answer Vertex AI's AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE (default: on when "
                              "AIP_MODE=PREDICTION)")
    options.add_argument("--vertex-ai-port", type=int, default=None,
                         help="their port (default: AIP_HTTP_PORT, else 8080)")
    options.add_argument("--vertex-ai-default-model", default="",
                         help="the model predictions come from (default: the repository's only model)")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _true_or_false(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def worker_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--models", default="", help="comma-separated models to serve (default: all)")
    options.add_argument("--worker-id", default=None)
    options.add_argument("--heartbeat-s", type=float, default=1.0, help="heartbeat interval")
    options.add_argument("--claim-interval-s", type=float, default=1.0, help="how often to claim stale work")
    options.add_argument("--claim-idle-s", type=float, default=10.0,
                         help="claim a delivery once it has gone unacked this long")
    options.add_argument("--max-deliveries", type=int, default=5,
                         help="dead-letter a request after this many deliveries")
    options.add_argument("--prefetch", type=_at_least_one, default=WorkerSettings().prefetch,
                         help="rounds of a model's instance capacity a worker takes from the broker at once "
                              "(in flight and waiting here); more hides the broker's latency, fewer leaves "
                              "more of a queue on the broker for other workers")
    options.add_argument("--retry-failures", action=argparse.BooleanOptionalAction, default=None,
                         help="when a model raises, let any worker retry the request (up to --max-deliveries) "
                              "instead of answering with the error; default: on with a shared broker")
    options.add_argument("--dead-letter-max-count", type=int, default=DeadLetterSettings().max_count,
                         help="the dead-letter channel keeps this many letters, the newest")
    options.add_argument("--dead-letter-max-bytes", type=int, default=DeadLetterSettings().max_bytes,
                         help="what those letters may add up to: each is at most this divided by "
                              "--dead-letter-max-count bytes, a longer payload cut to its first bytes")
    options.add_argument("--rate-limit", choices=RATE_LIMIT_MODES, default="off",
                         help="execution_count: a model instance runs only when the resources its instance_group's "
                              "rate_limiter names are free (Triton's rate limiter); off: they run when idle")
    options.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                         help="how much of a rate-limiter resource there is (default: the most any instance needs); "
                              "repeatable")
    options.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                         help="the response cache for models with response_cache { enable: true }: "
                              "local,size=BYTES (this worker's memory) or redis,host=H[,port=P,db=N,user=U,"
                              "password=X,tls=true,ttl_s=S] (shared by the fleet); repeatable, as in Triton")
    options.add_argument("--session-store", default="",
                         help="where stateful models checkpoint sequences: redis://HOST:PORT/DB (default: the "
                              "broker's Redis; on Kafka, none unless given)")
    return options
