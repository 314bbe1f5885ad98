"""Settings from the environment, and the store they describe.

Each ``PLANCACHE_*`` variable is read as ``plancache._defaults`` declares it (its type,
default and parser). The keys: ``PLANCACHE_SIGNING_KEY`` or ``PLANCACHE_SIGNING_KEY_FILE``
sign what this node writes; ``PLANCACHE_VERIFY_KEYS`` or ``PLANCACHE_VERIFY_KEYS_FILE`` are
further keys whose signatures are accepted (rotation). With any key, only validly signed
records are applied (see ``plancache._signing``). A key variable that is set (even empty)
but holds no key is a ``ConfigError``, never "no signing"; ``#`` starts a comment in key
files only (``read_key_file``: regular files of at most ``MAX_KEY_FILE_BYTES``).

fsspec's own ``FSSPEC_<PROTOCOL>_<OPTION>`` variables are applied by fsspec itself.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancache._backends import LOCAL_SCHEME, check_url, open_layer, url_scheme
from plancache._defaults import (
    DEFAULT_BUDGET_S,
    FALSE_WORDS,
    LOCAL_TIER,
    READ_ONLY,
    SIGNING_KEY,
    STORAGE_OPTIONS,
    TIMEOUT,
    TRUE_WORDS,
    TRUST_PRECONDITIONS,
    URL,
    VERIFY_KEYS,
    default_dir,
)
from plancache._neighbours import OddFileError, read_followed
from plancache._objects import ObjectLayer
from plancache._redaction import redact, without_userinfo
from plancache._signing import NO_KEYS, Keyring, parse_keys
from plancache._store import PlanStore
from plancache.errors import ConfigError

log = logging.getLogger("plancache")

MAX_KEY_FILE_BYTES = 64 * 1024
"""Largest key file read (a key of ``openssl rand -hex 32`` is 64 bytes)."""


def read_key_file(path: str, source: str) -> str:
    """The text of the key file at ``path``, which ``source`` (a variable or option) names:
    a regular file (links are followed: Kubernetes mounts secrets through them) of at most
    ``MAX_KEY_FILE_BYTES``, opened without blocking, so that a FIFO or a device is refused at
    once, never waited on or read without end; owned by this user or root and writable by
    no one else, judged on the file opened (``plancache._neighbours.read_followed``: the one
    bounded read and the one rule, links followed; a key another user could have written
    would sign or accept what they chose). A file that others may
    read is read, with a warning. Else ``ConfigError`` naming ``source`` and ``path``, never
    the content."""
    where = f"{source} {path!r}"
    try:
        read = read_followed(Path(os.path.expanduser(path)), MAX_KEY_FILE_BYTES)
    except OddFileError as exc:
        if exc.errno == errno.EFBIG:
            raise ConfigError(
                f"{where} is over {MAX_KEY_FILE_BYTES} bytes: not a key file"
            ) from None
        raise ConfigError(f"cannot read {where}: not a regular file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
    if read.foreign is not None:
        raise ConfigError(f"{where} is not used: {read.foreign}; make it this user's, 0600")
    data, st = read.data, read.st
    if st.st_mode & 0o044:
        log.warning(
            "plancache: %s can be read by users other than its owner (mode %04o); "
            "make it 0600 or 0400",
            where,
            stat.S_IMODE(st.st_mode),
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read {where}: not UTF-8 text") from None


def _keys(env: Mapping[str, str], name: str) -> list[str]:
    """The keys in variable ``name``, or in the file ``{name}_FILE`` names (not both); none
    if neither is set. One that is set (even empty) but holds no key is a ``ConfigError``:
    a mistyped key never turns signing off."""
    value, path = env.get(name), env.get(f"{name}_FILE")
    if value is not None and path is not None:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if value is not None:
        source, keys = name, parse_keys(value, name)
    elif path is not None:
        source = f"{name}_FILE"
        keys = parse_keys(read_key_file(path.strip(), source), source, comments=True)
    else:
        return []
    if not keys:
        note = " (in a key file, # starts a comment)" if path else ""
        raise ConfigError(f"{source} is set but holds no key{note}; unset it to run without keys")
    return keys


def keyring_from_env(environ: Mapping[str, str] | None = None) -> Keyring:
    """The keys ``PLANCACHE_SIGNING_KEY[_FILE]`` and ``PLANCACHE_VERIFY_KEYS[_FILE]`` hold
    (``NO_KEYS`` when none is set); ``ConfigError`` naming the variable, never the key, for a
    malformed, empty or unreadable one."""
    env = os.environ if environ is None else environ
    signing = _keys(env, SIGNING_KEY.name)
    if len(signing) > 1:
        raise ConfigError(f"PLANCACHE_SIGNING_KEY holds {len(signing)} keys; it takes one")
    verify = _keys(env, VERIFY_KEYS.name)
    if not (signing or verify):
        return NO_KEYS
    return Keyring(signing[0] if signing else None, verify)


def is_remote(url: str) -> bool:
    """True for URLs that name something other than a local directory (parsed strictly:
    ``url_scheme``)."""
    return url_scheme(url) != LOCAL_SCHEME


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
    """The signing and verify keys (``plancache._signing``); ``repr`` shows their ids only."""
    trust_preconditions: bool = False
    """Write to a remote store without probing that it honours conditional writes."""
    write_patience: float | None = None
    """Seconds a write to a remote store waits for the conformance probe's verdict, probing
    again after each backoff (None: ``guarded.WRITE_PATIENCE_S``; the command gives 0)."""
    url_given: bool = True
    """False where no ``PLANCACHE_URL`` (or ``--url``) named the store: the local default
    serves, and ``described`` says so."""

    def __repr__(self) -> str:
        return (
            f"Settings(url={without_userinfo(self.url)!r}, timeout={self.timeout}, "
            f"read_only={self.read_only}, "
            f"local_tier={self.local_tier!r}, storage_options={redact(self.storage_options)!r}, "
            f"keyring={self.keyring!r}, trust_preconditions={self.trust_preconditions})"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the ``PLANCACHE_*`` variables; raises ``ConfigError`` naming a bad one."""
        env = os.environ if environ is None else environ
        local = str(default_dir(env))
        url = check_url(URL.read(env) or local)
        tier_value = LOCAL_TIER.read(env)
        tier: str | None = None
        if is_remote(url):
            lowered = tier_value.strip().lower()
            if lowered in TRUE_WORDS:
                tier = local
            elif lowered not in FALSE_WORDS:
                tier = os.path.expanduser(tier_value)
        return cls(
            url,
            TIMEOUT.read(env),
            READ_ONLY.read(env),
            tier,
            STORAGE_OPTIONS.read(env),
            keyring_from_env(env),
            TRUST_PRECONDITIONS.read(env),
            url_given=bool(URL.read(env)),
        )

    def described(self) -> str:
        """The store in words, for a command's first line and a log line: its URL (without
        user info), and whether anything leaves this machine."""
        if is_remote(self.url):
            tier = "" if self.local_tier is None else f"; local tier {self.local_tier}"
            return f"{without_userinfo(self.url)} (remote{tier})"
        if not self.url_given:
            return (
                f"{self.url} (the local default: PLANCACHE_URL is not set; nothing leaves this "
                "machine)"
            )
        return f"{self.url} (a local path)"

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
        answers without waiting for the remote client; an object store is written only once
        the conformance probe found it honest (``plancache._backends.guarded``; verdicts
        cached under ``local_dir``). Every kind is built on the object layers this opens:
        the plans kind here, the others on ``layer`` and ``local_tier``."""
        layer: ObjectLayer
        if is_remote(self.url):
            from plancache._backends.guarded import open_guarded
            from plancache._backends.lazy import LazyStore

            layer = LazyStore(
                self.url,
                functools.partial(
                    open_guarded,
                    self.url,
                    self.storage_options,
                    self.local_dir,
                    trust=self.trust_preconditions,
                    writable=not self.read_only,
                    patience=self.write_patience,
                    keyring=self.keyring,
                ),
            )
        else:
            layer = open_layer(self.url, **self.storage_options)
        store = PlanStore(layer)
        if self.local_tier is not None or self.read_only:
            from plancache._backends.tiered import TieredStore

            local = None if self.local_tier is None else PlanStore(open_layer(self.local_tier))
            store = TieredStore(store, local=local, read_only=self.read_only)
        store.use_keyring(self.keyring)
        return store
