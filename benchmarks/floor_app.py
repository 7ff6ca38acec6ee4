"""The floor under ferry's HTTP path: a bare Starlette app on uvicorn (httptools, uvloop, as
ferry's gateway runs) that reads an inference request's whole body and answers a small JSON.

Whatever ferry spends per request beyond this app is ferry's own: parsing, the broker, the
model call, the reply's tensor. The reply carries ``Inference-Header-Content-Length`` (the
whole body: no binary output follows), so ``loadgen.py`` reads it as it reads ferry's.

    python benchmarks/floor_app.py --port 8000
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def infer(request: Request) -> Response:
    body = await request.body()
    reply = json.dumps({"model_name": request.path_params["model"], "outputs": [], "received_bytes": len(body)},
                       separators=(",", ":")).encode()
    return Response(reply, media_type="application/json",
                    headers={"Inference-Header-Content-Length": str(len(reply))})


async def ready(request: Request) -> Response:
    return Response(status_code=200)


app = Starlette(routes=[
    Route("/v2/models/{model}/infer", infer, methods=["POST"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", lifespan="off",
                access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
