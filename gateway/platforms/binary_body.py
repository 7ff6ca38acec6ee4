"""Binary tensor bodies on a platform port, where the platform fixes the
headers: the JSON header's length travels in the ``Content-Type``
(``<mime>;json-header-size=N``) instead of ``Inference-Header-Content-Length``,
both ways, as Triton's SageMaker and Vertex AI front ends carry it."""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import InvalidRequest
from gateway.platforms.forward import Headers, without
from workers.decimal_text import ascii_int

HEADER_LENGTH = b"inference-header-content-length"
CONTENT_TYPE = b"content-type"


class BinaryBody:
    def __init__(self, mime: str) -> None:
        self.prefix = f"{mime};json-header-size="

    def request_headers(self, content_type: str | None) -> dict[bytes, bytes | None]:
        """The header replacements a request with ``content_type`` needs on the V2 route."""
        if content_type is None or self.prefix not in content_type:
            return {HEADER_LENGTH: None}  # a JSON body; a client's own length header is not this contract
        if not content_type.startswith(self.prefix):
            raise InvalidRequest(f"expect MIME type for binary data starts with '{self.prefix}', got: {content_type}")
        size = content_type[len(self.prefix):].split(";", 1)[0].strip()
        length = ascii_int(size)
        if length is None:
            raise InvalidRequest(f"Unable to parse inference header size, got: {size}")
        return {HEADER_LENGTH: str(length).encode()}

    def response_headers(self) -> Callable[[Headers], Headers]:
        """A rewrite of the V2 answer's headers: its header length into the ``Content-Type``."""
        def rewrite(headers: Headers) -> Headers:
            length = next((v for k, v in headers if k.lower() == HEADER_LENGTH), None)
            if length is None:
                return headers
            return [*without(headers, HEADER_LENGTH, CONTENT_TYPE), (CONTENT_TYPE, self.prefix.encode() + length)]
        return rewrite
