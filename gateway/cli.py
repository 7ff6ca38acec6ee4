"""The ``ferry`` command."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from gateway.app import HttpSettings
from gateway.embedded import ServeSettings, build_app
from gateway.logs import configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Serve models from a Triton-layout repository.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="gateway, workers and an in-memory broker in one process")
    serve.add_argument("--model-repository", type=Path, required=True)
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--broker", default="memory://", help="broker URL (memory://)")
    serve.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if args.command == "serve":
        _serve(args)


def _serve(args: argparse.Namespace) -> None:
    if not args.model_repository.is_dir():
        raise SystemExit(f"ferry: --model-repository {args.model_repository} is not a directory")
    settings = ServeSettings(
        model_repository=args.model_repository,
        broker_url=args.broker,
        http=HttpSettings(max_body_bytes=args.max_body_bytes),
    )
    config = uvicorn.Config(
        build_app(settings), host=args.host, port=args.http_port, loop="uvloop", http="httptools",
        lifespan="on", access_log=False, log_level="warning",
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
