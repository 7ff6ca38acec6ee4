"""A request's cache key: a BLAKE2b digest of everything that decides its answer.

That is the model and the version that runs it, every input (name, datatype,
shape and bytes, in name order), the outputs asked for, and the request's
parameters, but for those that schedule it rather than shape its answer
(``priority``, ``timeout``, the sequence flags and the flags ferry sets on its
own messages). Each part is length-prefixed, so no two requests share a key
by running one part into the next.
"""

from __future__ import annotations

import hashlib

import msgpack

from broker.envelope import Request

SCHEDULING = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                        "sequence_channel", "triton_final_response", "triton_enable_empty_final_response",
                        "binary_data_output"})


def cache_key(request: Request, model: str, version: int) -> bytes:
    digest = hashlib.blake2b(digest_size=32, person=b"ferry-cache-v1")

    def part(data: bytes | memoryview) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    part(model.encode())
    part(str(version).encode())
    inputs = sorted(request.inputs, key=lambda tensor: tensor.name)
    part(len(inputs).to_bytes(4, "little"))
    for tensor in inputs:
        part(tensor.name.encode())
        part(tensor.datatype.encode())
        part(msgpack.packb(list(tensor.shape)))
        part(tensor.data)
    part(msgpack.packb(sorted(request.outputs)))
    kept = sorted((k, v) for k, v in request.parameters.items() if k not in SCHEDULING)
    part(msgpack.packb([[k, v] for k, v in kept]))
    return digest.digest()
