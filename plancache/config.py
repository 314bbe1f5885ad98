"""Settings from the environment, and the store they describe.

- ``PLANCACHE_URL``: store URL or local path
  (default ``{VLLM_CACHE_ROOT or ~/.cache/vllm}/startup_plan``)
- ``PLANCACHE_TIMEOUT``: seconds a lookup or a record may take in all (default 2.0)
- ``PLANCACHE_READ_ONLY``: never write the remote store (default 0)
- ``PLANCACHE_LOCAL_TIER``: local tier in front of a remote store: 1, 0 or a directory
  (default 1: the default local directory)
- ``PLANCACHE_STORAGE_OPTIONS``: JSON object of storage options for the backend
- ``PLANCACHE_SIGNING_KEY`` or ``PLANCACHE_SIGNING_KEY_FILE``: the key that signs what this
  node writes; ``PLANCACHE_VERIFY_KEYS`` or ``PLANCACHE_VERIFY_KEYS_FILE``: further keys whose
  signatures are accepted (rotation). With any key, only validly signed records are applied
  (see ``plancache.signing``).

fsspec's own ``FSSPEC_<PROTOCOL>_<OPTION>`` variables are applied by fsspec itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from plancache.backends import open_store
from plancache.defaults import DEFAULT_BUDGET_S, MAX_SECONDS, default_dir
from plancache.errors import ConfigError
from plancache.redaction import redact, without_userinfo
from plancache.signing import NO_KEYS, Keyring, parse_keys
from plancache.store import PlanStore

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(name: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive); else ``ConfigError``."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
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


def parse_storage_options(text: str, source: str) -> dict[str, Any]:
    """A JSON object of storage options from ``source`` (a variable or flag name); else
    ``ConfigError``. The text itself is never echoed: it may hold secrets."""
    try:
        options = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        raise ConfigError(f"{source} is not valid JSON") from None
    if not isinstance(options, dict):
        raise ConfigError(f"{source} must be a JSON object")
    return options


def _keys(env: Mapping[str, str], name: str) -> list[str]:
    """The keys in variable ``name``, or in the file ``{name}_FILE`` names (not both)."""
    value, path = env.get(name, ""), env.get(f"{name}_FILE", "").strip()
    if value.strip() and path:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if not path:
        return parse_keys(value, name)
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"{name}_FILE={path!r}: cannot read it: {why}") from None
    return parse_keys(text, f"{name}_FILE")


def keyring_from_env(environ: Mapping[str, str] | None = None) -> Keyring:
    """The keys ``PLANCACHE_SIGNING_KEY[_FILE]`` and ``PLANCACHE_VERIFY_KEYS[_FILE]`` hold
    (``NO_KEYS`` when none is set); ``ConfigError`` naming the variable, never the key, for a
    malformed or unreadable one."""
    env = os.environ if environ is None else environ
    signing = _keys(env, "PLANCACHE_SIGNING_KEY")
    if len(signing) > 1:
        raise ConfigError(f"PLANCACHE_SIGNING_KEY holds {len(signing)} keys; it takes one")
    verify = _keys(env, "PLANCACHE_VERIFY_KEYS")
    if not (signing or verify):
        return NO_KEYS
    return Keyring(signing[0] if signing else None, verify)


def is_remote(url: str) -> bool:
    """True for URLs that name something other than a local directory."""
    return "://" in url and not url.startswith("file://")


@dataclass(frozen=True)
class Settings:
    """Where plans live and how long a boot may spend on them."""

    url: str = field(default_factory=lambda: str(default_dir()))
    timeout: float = DEFAULT_BUDGET_S
    """Seconds one lookup or record may take in all (the boot-path budget)."""
    read_only: bool = False
    local_tier: str | None = None
    """Directory of the local tier in front of a remote store, or None for no tier."""
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    keyring: Keyring = NO_KEYS
    """The signing and verify keys (``plancache.signing``); ``repr`` shows their ids only."""

    def __repr__(self) -> str:
        return (
            f"Settings(url={without_userinfo(self.url)!r}, timeout={self.timeout}, "
            f"read_only={self.read_only}, "
            f"local_tier={self.local_tier!r}, storage_options={redact(self.storage_options)!r}, "
            f"keyring={self.keyring!r})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the ``PLANCACHE_*`` variables; raises ``ConfigError`` naming a bad one."""
        env = os.environ if environ is None else environ
        local = str(default_dir(env))
        url = env.get("PLANCACHE_URL") or local
        timeout = parse_timeout(
            "PLANCACHE_TIMEOUT", env.get("PLANCACHE_TIMEOUT", str(DEFAULT_BUDGET_S))
        )
        read_only = parse_bool("PLANCACHE_READ_ONLY", env.get("PLANCACHE_READ_ONLY", "0"))
        tier_value = env.get("PLANCACHE_LOCAL_TIER", "1")
        tier: str | None = None
        if is_remote(url):
            lowered = tier_value.strip().lower()
            if lowered in _TRUE:
                tier = local
            elif lowered not in _FALSE:
                tier = os.path.expanduser(tier_value)
        options = parse_storage_options(
            env.get("PLANCACHE_STORAGE_OPTIONS", ""), "PLANCACHE_STORAGE_OPTIONS"
        )
        return cls(url, timeout, read_only, tier, options, keyring_from_env(env))

    @property
    def local_dir(self) -> str:
        """This node's own directory: the local tier, else the store itself when it is local,
        else the default directory (crash marks live under it)."""
        if self.local_tier is not None:
            return self.local_tier
        if not is_remote(self.url):
            return self.url.removeprefix("file://")
        return str(default_dir())

    def open_store(self) -> PlanStore:
        """The configured store: the remote one behind a local tier when one is set, signing
        and judging records with the configured keys. A remote store opens on first use (a
        ``LazyStore``: each use waits at most its ``open_timeout``), so that the local tier
        answers without waiting for the remote client."""
        store: PlanStore
        if is_remote(self.url):
            from plancache.backends.lazy import open_lazily

            store = open_lazily(self.url, **self.storage_options)
        else:
            store = open_store(self.url, **self.storage_options)
        if self.local_tier is not None or self.read_only:
            from plancache.backends.tiered import TieredStore

            local = open_store(self.local_tier) if self.local_tier is not None else None
            store = TieredStore(store, local=local, read_only=self.read_only)
        store.use_keyring(self.keyring)
        return store
