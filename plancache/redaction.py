"""Keeping secrets out of every message, ``repr`` and log line plancache writes (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

SECRET_WORDS = ("secret", "token", "password", "key", "credential", "session", "auth")
MASK = "***"


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of storage options safe to log: values of secret-looking keys are masked."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if any(w in str(k).lower() for w in SECRET_WORDS) and "endpoint" not in str(k).lower():
            out[k] = MASK
        elif isinstance(v, Mapping):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


def secret_values(options: Mapping[str, Any]) -> Iterator[str]:
    """The values of secret-looking storage options (4 characters or more), to scrub them
    out of messages."""
    masked = redact(options)
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from secret_values(value)
        elif masked.get(key) == MASK and len(str(value)) >= 4:  # shorter ones: no secret
            yield str(value)


def scrub(message: str, secrets: Iterator[str] | list[str]) -> str:
    """``message`` with each of ``secrets`` masked."""
    for secret in secrets:
        message = message.replace(secret, MASK)
    return message


def without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"
