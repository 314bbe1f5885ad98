"""How a subcommand on a store opens the store it names, and whose keys it uses.

Every subcommand on a store opens the store it names (or ``PLANCACHE_URL``) directly, without
the local tier, so what it shows is what that store itself holds (a remote store opens on
first use, waiting at most its ``LazyStore``'s ``open_timeout`` for its client), with the
keys of the environment (``PLANCACHE_SIGNING_KEY``, ...) or of ``--keys-file``: writes (``cp``,
``prune``) are signed with the signing key, and records the keys reject are shown as such,
never copied or pruned. No key is ever printed; key ids are.

Every ``cmd_*`` function of the command takes the parsed arguments
(``plancache._command.cli.build_parser``) with two more attributes that
``plancache._command.cli`` sets: ``opened``, a list to which every store it opens is appended
(the caller closes them), and ``keyring``, None until the command reads its keys. It returns
the exit status (0 ok, 1 findings) and raises on any failure.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from plancache._artifacts.engine import CompileSettings
from plancache._config import (
    Settings,
    is_remote,
    keyring_from_env,
    read_key_file,
)
from plancache._defaults import parse_storage_options
from plancache._forwarding import beneath
from plancache._signing import Keyring, parse_keys
from plancache._store import PlanStore
from plancache.errors import CliError


def open_named(
    args: argparse.Namespace,
    url: str | None,
    options: str | None = None,
    *,
    flag: str = "--storage-options",
    must_exist: bool = True,
    shared_for_local: bool = True,
) -> PlanStore:
    """Open ``url`` (default: ``PLANCACHE_URL``) with ``options`` (the JSON given to ``flag``),
    else ``--storage-options`` (unless ``shared_for_local`` is False and the store is local),
    else, for a remote store, those of the environment; appended to ``args.opened``, which the
    caller closes. A remote store opens on first use (``LazyStore``), and an object store
    is written only once the conformance probe found it honest (``open_guarded``: a write to
    one that ignores preconditions raises, unless ``PLANCACHE_TRUST_PRECONDITIONS=1``). A
    local store that must exist but does not is a ``CliError``."""
    url, storage_options = _where(args, url, options, flag, shared_for_local)
    env = Settings.from_env()
    settings = dataclasses.replace(
        env,
        url=url,
        storage_options=storage_options,
        local_tier=None,
        keyring=command_keyring(args),
        write_patience=0.0,  # a command says at once that it could not write
    )
    store = settings.open_store()
    args.opened.append(store)
    local = None if is_remote(url) else list(beneath(store.layer))[-1].local_directory()
    if must_exist and local is not None and not local.exists():
        raise CliError(f"{store.url}: no store there (the directory does not exist)")
    return store


def _where(
    args: argparse.Namespace, url: str | None, options: str | None, flag: str, shared: bool
) -> tuple[str, dict[str, Any]]:
    """The URL and storage options ``open_named`` opens (see there)."""
    settings = Settings.from_env() if url is None else None
    url = settings.url if settings is not None else url
    assert url is not None
    if options is None and (shared or is_remote(url)):
        options, flag = args.storage_options, "--storage-options"
    storage_options: dict[str, Any] = {}
    if options is not None:
        storage_options = parse_storage_options(options, flag)
    elif is_remote(url):
        storage_options = dict((settings or Settings.from_env()).storage_options)
    return url, storage_options


def max_artifact_bytes() -> int:
    """This process's cap on a compile artifact's size (``PLANCACHE_COMPILE_MAX_BYTES``)."""
    return CompileSettings.from_env().max_bytes


def command_keyring(args: argparse.Namespace) -> Keyring:
    """The keys of the command: those of ``--keys-file`` (verify keys), else of the
    environment; read once (kept in ``args.keyring``)."""
    if args.keyring is None:
        name = getattr(args, "keys_file", None)
        if name is None:
            args.keyring = keyring_from_env()
        else:
            text = read_key_file(name, "--keys-file")
            args.keyring = Keyring(verify_keys=parse_keys(text, "--keys-file", comments=True))
    keyring: Keyring = args.keyring
    return keyring
