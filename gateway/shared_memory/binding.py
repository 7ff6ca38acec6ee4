"""One infer request's tensors through shared memory.

Every region the request names is resolved before anything moves, as Triton
does: an unknown region or a range past its end refuses the request at once.
Inputs are then read into the request (one copy: the envelope carries the
bytes to the worker); outputs are written when the reply comes, all of them or,
should any be refused, none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from broker.envelope import DEFAULT_LIMITS, Limits, Response, WireTensor
from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.shared_memory.refs import RegionInput
from gateway.shared_memory.regions import SharedMemoryRegions, Slice
from gateway.v2_codec import ParsedInfer
from workers.datatypes import element_count, split_bytes
from workers.errors import TensorError


@dataclass(frozen=True, slots=True)
class BoundRequest:
    parsed: ParsedInfer  # for the service: every input holds its bytes, no output names a region
    outputs: tuple[tuple[str, Slice], ...] = ()

    def for_job(self) -> ParsedInfer:
        """The request for an async job, whose reply no one is waiting to write."""
        if self.outputs:
            name, target = self.outputs[0]
            raise InvalidRequest(f"requested output '{name}': shared memory region '{target.region.name}' "
                                 f"cannot receive the outputs of an async job (Prefer: respond-async)")
        return self.parsed

    def write_outputs(self, reply: Response) -> None:
        """Write each bound output into its region. Nothing is written when the reply
        failed or lacks an output (the response names it); a refused output is
        found before any bytes move."""
        if reply.error is not None or not self.outputs:
            return
        by_name = {tensor.name: tensor for tensor in reply.outputs}
        writes = [(by_name[name], target) for name, target in self.outputs if name in by_name]
        if len(writes) != len(self.outputs):
            return
        for tensor, target in writes:
            target.check_write(tensor.data, f"output '{tensor.name}'")
        for tensor, target in writes:
            target.write(tensor.data, f"output '{tensor.name}'")


def bind(regions: SharedMemoryRegions, parsed: ParsedInfer, limits: Limits = DEFAULT_LIMITS) -> BoundRequest:
    """Resolve the regions ``parsed`` names and read its inputs from them."""
    wanted = [tensor for tensor in parsed.inputs if isinstance(tensor, RegionInput)]
    targets = [(output.name, output.region) for output in parsed.outputs if output.region is not None]
    if not wanted and not targets:
        return BoundRequest(parsed)
    _check_total(wanted, limits)
    sources = {tensor.name: regions.resolve(tensor.slice, f"input '{tensor.name}'") for tensor in wanted}
    outputs = tuple((name, regions.resolve(region, f"requested output '{name}'")) for name, region in targets)
    for name, target in outputs:
        target.check_target(f"output '{name}'")
    inputs = tuple(_read(tensor, sources[tensor.name]) if isinstance(tensor, RegionInput) else tensor
                   for tensor in parsed.inputs)
    plain = tuple(replace(output, region=None) for output in parsed.outputs)
    return BoundRequest(replace(parsed, inputs=inputs, outputs=plain), outputs)


def _check_total(wanted: list[RegionInput], limits: Limits) -> None:
    """Refused before reading: a region can be far larger than any envelope."""
    total = sum(tensor.slice.byte_size for tensor in wanted)
    if total > limits.max_message_bytes:
        names = ", ".join(f"'{tensor.name}'" for tensor in wanted)
        raise PayloadTooLarge(f"inputs {names} in shared memory add up to {total} bytes, more than the "
                              f"{limits.max_message_bytes} bytes a request envelope may carry")


def _read(tensor: RegionInput, source: Slice) -> WireTensor:
    where = f"input '{tensor.name}'"
    data = source.read(where)
    if tensor.datatype == "BYTES":
        try:
            split_bytes(tensor.name, data, element_count(tensor.shape))
        except TensorError as exc:
            raise InvalidRequest(f"{where}: {exc}") from None
    return WireTensor(tensor.name, tensor.datatype, tensor.shape, data)
