"""``--cache-config``, as Triton spells it: ``<cache>,<key>=<value>``, repeatable, the
keys of one cache added up over the flags.

    --cache-config local,size=104857600          this worker's memory, bytes at most
    --cache-config redis,host=cache,port=6379    a Redis the fleet shares (also user, password,
                                                 db, tls=true, ttl_s; or url=redis://... last)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workers.errors import ConfigError

_KEYS = {"local": {"size"}, "redis": {"host", "port", "user", "password", "db", "tls", "ttl_s", "url"}}


class CacheSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local", "redis"]
    size_bytes: int = Field(0, ge=0)  # local
    url: str = ""  # redis
    ttl_s: float = Field(0.0, ge=0)  # redis: 0 keeps answers until Redis evicts them

    @model_validator(mode="after")
    def _complete(self) -> CacheSettings:
        if self.kind == "local" and self.size_bytes <= 0:
            raise ValueError("the local cache needs size=<bytes> above 0")
        if self.kind == "redis" and not self.url:
            raise ValueError("the redis cache needs host=<host> (or url=redis://...)")
        return self


def parse_cache_config(flags: Sequence[str]) -> CacheSettings | None:
    """The cache the ``--cache-config`` flags describe; ``ConfigError`` names the one at fault."""
    if not flags:
        return None
    kind = ""
    values: dict[str, str] = {}
    for flag in flags:
        name, _, rest = flag.partition(",")
        name = name.strip()
        if name not in _KEYS:
            raise _error(flag, f"unknown cache '{name}'; expected local or redis")
        if kind and name != kind:
            raise _error(flag, f"one cache at a time: '{kind}' was named before")
        kind = name
        while rest:
            pair, _, rest = rest.partition(",")
            key, equals, value = pair.strip().partition("=")
            if key == "url" and equals:  # a cluster's URL has commas of its own: the rest of the flag
                value, rest = ",".join((value, rest)).rstrip(","), ""
            elif not pair.strip():
                continue
            if not equals or key not in _KEYS[name]:
                raise _error(flag, f"'{pair}': expected one of {', '.join(sorted(_KEYS[name]))} as key=value")
            values[key] = value
    try:
        if kind == "local":
            return CacheSettings(kind="local", size_bytes=_number(values.get("size", "0"), "size"))
        return CacheSettings(kind="redis", url=_redis_url(values), ttl_s=float(values.get("ttl_s", "0")))
    except (ValidationError, ValueError) as exc:
        message = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise _error(",".join(flags), message) from None


def _redis_url(values: dict[str, str]) -> str:
    if "url" in values:
        return values["url"]
    if "host" not in values:
        return ""
    scheme = "rediss" if values.get("tls", "").lower() == "true" else "redis"
    user, password = values.get("user", ""), values.get("password", "")
    auth = f"{quote(user)}:{quote(password)}@" if user or password else ""
    return f"{scheme}://{auth}{values['host']}:{_number(values.get('port', '6379'), 'port')}/" \
           f"{_number(values.get('db', '0'), 'db')}"


def _number(text: str, key: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{key}={text!r} is not a whole number")
    return int(text)


def _error(flag: str, message: str) -> ConfigError:
    return ConfigError("--cache-config", flag, message)  # names the flag and what is wrong with it
