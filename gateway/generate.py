"""Triton's generate extension: a flat JSON body in, a flat JSON object out.

    POST /v2/models/{m}/generate         {"PROMPT": "hi", "parameters": {...}}
    -> {"model_name": "m", "model_version": "1", "TEXT": "...", "COUNT": 3}

Each key but ``id`` and ``parameters`` names an input; its value (a scalar or
a list) becomes a tensor of the datatype the model's config gives, shaped
like the value, with a batch dimension of 1 when the model batches. The body
is turned into a V2 infer body, so every check of ``/infer`` applies. An
output with one element comes back as a scalar, others as flat lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from broker.envelope import Response
from gateway.errors import InvalidRequest
from gateway.json_body import json_object
from gateway.v2_codec import ParsedInfer, parse_infer_request, render_infer_response
from workers.repository.config import ModelConfig

_RESERVED = ("id", "parameters")


def parse_generate_request(body: bytes, config: ModelConfig) -> ParsedInfer:
    fields = json_object(body, "generate body", "a JSON object of input names and values", allow_empty=False)
    inputs = [_input(config, name, value) for name, value in fields.items() if name not in _RESERVED]
    infer_body = {"inputs": inputs, "parameters": fields.get("parameters") or {}}
    if "id" in fields:
        infer_body["id"] = fields["id"]
    return parse_infer_request(orjson.dumps(infer_body), None)


def render_generate_response(response: Response) -> dict[str, Any]:
    header, _ = render_infer_response(response, (), binary_default=False)
    rendered = orjson.loads(header)
    body: dict[str, Any] = {"model_name": rendered["model_name"], "model_version": rendered["model_version"]}
    if "id" in rendered:
        body["id"] = rendered["id"]
    for output in rendered["outputs"]:
        data = output["data"]
        body[output["name"]] = data[0] if len(data) == 1 else data
    return body


def _input(config: ModelConfig, name: str, value: Any) -> dict[str, Any]:
    spec = config.input(name)
    if spec is None:
        raise InvalidRequest(f"model '{config.name}' has no input '{name}' "
                             f"(inputs: {', '.join(i.name for i in config.inputs)})")
    try:
        shape = list(np.shape(value)) or [1]
    except ValueError:
        raise InvalidRequest(f"input '{name}': a ragged nested list has no shape") from None
    if config.max_batch_size > 0:
        shape = [1, *shape]
    data = np.ravel(np.asarray(value, dtype=object)).tolist()
    return {"name": name, "datatype": spec.datatype, "shape": shape, "data": data}
