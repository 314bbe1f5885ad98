"""Setting values parsed from text: booleans and seconds (pure, and cheap to import: the vLLM
plugin reads its switches with them in every process vLLM starts)."""

from __future__ import annotations

import math

from plancache._defaults import MAX_SECONDS
from plancache.errors import ConfigError

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def parse_bool(name: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive); else ``ConfigError``."""
    v = value.strip().lower()
    if v in TRUE_WORDS:
        return True
    if v in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off")


def parse_seconds(text: str) -> float:
    """``text`` as a number of seconds in (0, ``MAX_SECONDS``], the range of every time
    setting (``PLANCACHE_TIMEOUT``, ``plancache --timeout``); else ``ConfigError`` saying
    what is expected."""
    try:
        t = float(text)
    except ValueError:
        raise ConfigError("expected seconds as a number") from None
    if not (math.isfinite(t) and 0 < t <= MAX_SECONDS):
        raise ConfigError(f"expected a positive number of seconds, at most {MAX_SECONDS:g}")
    return t


def parse_timeout(name: str, value: str) -> float:
    """Variable ``name``'s ``value`` as seconds (``parse_seconds``); else ``ConfigError``
    naming it."""
    try:
        return parse_seconds(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}={value!r}: {exc}") from None
