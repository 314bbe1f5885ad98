"""Keeping secrets out of every message, ``repr`` and log line plancache writes (pure).

Two layers: where the storage options are known, their secret values are masked wherever
they appear (:func:`secret_values`, :func:`scrub`), with the Basic-auth encodings of URL user
information (the object-store backends add the credentials their client resolved itself);
everywhere, URL user information and the values of secret-looking URL query parameters are
masked too (``access_token=...``, ``X-Amz-Signature=...``, ``sig=...``), whatever produced
the text.
"""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote

SECRET_WORDS = (
    "secret",
    "token",
    "password",
    "passwd",
    "passphrase",
    "key",
    "credential",
    "session",
    "auth",
    "connection_string",
    "sas",
    "signature",
    "cookie",
)
MASK = "***"
#: shorter values are no secret worth masking (and masking them would garble messages)
MIN_SECRET_LENGTH = 4

_USERINFO = re.compile(r"(?<=://)[^/\s@'\"]+@")
_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:[\w.-]*(?:token|secret|key|sig|signature|password|credential|auth)[\w.-]*)=)"
    r"[^&;\s'\")]+"
)


def is_secret_name(name: object) -> bool:
    """True for an option name that looks like it holds a secret."""
    lowered = str(name).lower()
    return any(w in lowered for w in SECRET_WORDS) and not lowered.endswith("_kwargs")


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of storage options safe to log: values of secret-looking names are masked and
    every string value loses its URL user information (``user:password@``)."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if is_secret_name(k):
            out[k] = MASK
        elif isinstance(v, Mapping):
            out[k] = redact(v)
        elif isinstance(v, str):
            out[k] = scrub(v)
        else:
            out[k] = v
    return out


def secret_values(options: Mapping[str, Any]) -> Iterator[str]:
    """The secrets in storage options, to scrub them out of messages: the values of
    secret-looking names and the user information of URL values (4 characters or more)."""
    for key, value in options.items():
        if isinstance(value, Mapping):
            yield from secret_values(value)
        elif is_secret_name(key) and value is not None and not isinstance(value, bool):
            text = str(value)
            if len(text) >= MIN_SECRET_LENGTH:
                yield text
        elif isinstance(value, str):
            yield from url_secrets(value)


def url_secrets(url: str) -> Iterator[str]:
    """The user information of ``url`` (``user:password``, and the password alone), as
    written and percent-decoded, and the Basic-auth encodings of it that an HTTP client
    sends for such a URL (``base64(user:password)``)."""
    for match in _USERINFO.finditer(url):
        for userinfo in {match.group()[:-1], unquote(match.group()[:-1])}:
            user, _, password = userinfo.partition(":")
            for secret in (userinfo, password, *basic_auth(user, password)):
                if len(secret) >= MIN_SECRET_LENGTH:
                    yield secret


def basic_auth(user: str, password: str) -> set[str]:
    """The ``Authorization: Basic`` credentials of ``user`` and ``password``, in the
    encodings clients use (latin-1, as aiohttp does, and UTF-8)."""
    pair = f"{user}:{password}"
    out = {base64.b64encode(pair.encode()).decode()}
    with contextlib.suppress(UnicodeEncodeError):
        out.add(base64.b64encode(pair.encode("latin-1")).decode())
    return out


def scrub(message: str, secrets: Iterable[str] = ()) -> str:
    """``message`` with each of ``secrets``, URL user information and the values of
    secret-looking query parameters masked."""
    for secret in sorted(set(secrets), key=len, reverse=True):  # longest first
        message = message.replace(secret, MASK)
    message = _USERINFO.sub("", message)
    return _SECRET_PARAM.sub(rf"\1{MASK}", message)


def scrub_exception(exc: BaseException, secrets: Iterable[str] = ()) -> BaseException:
    """``exc`` with the messages of it and of every exception it was raised from or during
    scrubbed in place (so that its traceback text holds no secret); returns ``exc``."""
    secrets = list(secrets)
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):  # its text is made of these, not of its args
            for attr in ("strerror", "filename", "filename2"):
                value = getattr(e, attr)
                if isinstance(value, str):
                    setattr(e, attr, scrub(value, secrets))
            e.args = tuple(scrub(a, secrets) if isinstance(a, str) else a for a in e.args)
        try:
            text = str(e)
        except Exception:  # a broken __str__ is no reason to fail
            text = ""
        clean = scrub(text, secrets)
        if clean != text:
            e.args = (clean,)
        todo += [e.__cause__, e.__context__]
    return exc


def printable(text: str) -> str:
    """``text`` with every character that ``str.isprintable`` rejects (control and format
    characters, separators other than the space: what could move the cursor, clear the
    screen, set a title or reorder text) written as its escape: ``\\x1b``, ``\\r``,
    ``\\u202e``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"
