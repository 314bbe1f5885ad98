"""Listing, verifying, copying and pruning the compile artifacts of any store, on its object
layer (a library for the command line).

The rules every kind's inventory keeps (``plancache._inventory.plans`` keeps them for plans):

- a delete is conditional on the version that was judged: an artifact written under the
  same name since is kept;
- nothing this process cannot read is deleted: an unknown format, a codec not installed here
  or a size over this process's cap is reported as *unreadable here* and kept; ``prune``
  deletes by age only, ``verify(fix=True)`` only what is provably corrupt (a digest that does
  not match, a truncated or malformed stream) or, where signatures are required, what no
  accepted key signed;
- ``copy`` never makes code more trusted than it was (see ``copy``).

``scan`` reads only each artifact's head (its manifest); ``verify`` reads every byte, checks
it against the manifest and its signature, and installs nothing (it extracts into a temp
directory that it removes).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from plancache._artifacts.archive import install, read_manifest
from plancache._artifacts.manifest import (
    DEFAULT_MAX_BYTES,
    NAME_PREFIX,
    Manifest,
    parse_object_name,
)
from plancache._inventory import UNREADABLE_HERE, prunable
from plancache._objects import ObjectLayer
from plancache._signing import NO_KEYS, Keyring, SignatureVerdict
from plancache.errors import ArtifactError, UnreadableHereError


@dataclass(frozen=True)
class ArtifactRecord:
    """One stored artifact as read: its manifest, or why it could not be read (``error``;
    ``unreadable``: by this process only, so kept), and the version judged."""

    name: str
    manifest: Manifest | None = None
    error: str | None = None
    unreadable: bool = False
    version: object = None

    @property
    def model(self) -> str:
        return "-" if self.manifest is None else str(self.manifest.labels.get("model", "-"))


def names(layer: ObjectLayer) -> list[str]:
    """The artifacts' object names in ``layer``, in order (listing bounds: the store's)."""
    return sorted(n for n in layer.list_objects(NAME_PREFIX) if parse_object_name(n) is not None)


def read_entry(
    layer: ObjectLayer, name: str, max_bytes: int = DEFAULT_MAX_BYTES
) -> ArtifactRecord | None:
    """The entry of ``name`` (its manifest, read from the object's head); None if it is gone."""
    opened = layer.open_object(name)
    if opened is None:
        return None
    try:
        manifest = read_manifest(opened, max_bytes=max_bytes)
    except UnreadableHereError as exc:
        return ArtifactRecord(name, error=str(exc), unreadable=True, version=opened.version)
    except ArtifactError as exc:
        return ArtifactRecord(name, error=str(exc), version=opened.version)
    finally:
        opened.close()
    if (manifest.key, manifest.rank) != parse_object_name(name):
        return ArtifactRecord(
            name, error="its manifest names another key or rank", version=opened.version
        )
    return ArtifactRecord(name, manifest, version=opened.version)


def resolve(layer: ObjectLayer, refs: Sequence[str]) -> list[str]:
    """The object names that ``refs`` name, each uniquely: ``<key or key prefix>/<rank>``
    or an object name; ``ValueError`` naming the first that matches none or several."""
    known = names(layer)
    found = []
    for ref in refs:
        prefix, _, rank = ref.strip().lower().partition("/")
        matches = [
            n
            for n in known
            if n == ref
            or ((p := parse_object_name(n)) and p[0].startswith(prefix) and p[1] == rank)
        ]
        if len(matches) != 1 or not prefix:
            what = "no compile artifact" if not matches else f"{len(matches)} compile artifacts"
            raise ValueError(f"{what} match {ref!r} in {layer.url} (give KEY/rank_R_D)")
        found.append(matches[0])
    return list(dict.fromkeys(found))


def scan(layer: ObjectLayer, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[ArtifactRecord]:
    """Every artifact of ``layer``, in name order."""
    for name in names(layer):
        entry = read_entry(layer, name, max_bytes)
        if entry is not None:
            yield entry


@dataclass(frozen=True)
class Problem:
    """What ``verify`` found wrong with an artifact. ``corrupt``: provably so (a digest that
    does not match, a truncated or malformed stream), or rejected by required signatures;
    else it is only unreadable here (kept)."""

    text: str
    corrupt: bool
    version: object = None


def verify(
    layer: ObjectLayer,
    name: str,
    keyring: Keyring = NO_KEYS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Problem | None:
    """None if every byte of ``name`` matches its manifest, the archive follows every
    extraction rule and (with keys) an accepted key validly signed it; else the problem; a
    vanished object is no problem."""
    parsed = parse_object_name(name)
    if parsed is None:
        return Problem("not an artifact's name", corrupt=False)
    opened = layer.open_object(name)
    if opened is None:
        return None

    def signed(manifest: Manifest) -> str | None:
        if not keyring.requires_signature:
            return None
        verdict = manifest.verdict(keyring)
        return None if verdict is SignatureVerdict.VALID else f"invalid:signature ({verdict})"

    try:
        with tempfile.TemporaryDirectory(prefix="plancache-verify-") as temp:
            install(opened, Path(temp) / parsed[0], *parsed, accept=signed, max_bytes=max_bytes)
    except UnreadableHereError as exc:
        return Problem(f"{UNREADABLE_HERE} ({exc})", corrupt=False, version=opened.version)
    except ArtifactError as exc:
        return Problem(str(exc), corrupt=True, version=opened.version)
    finally:
        opened.close()
    return None


def delete(layer: ObjectLayer, name: str, version: object) -> bool:
    """Delete ``name`` only if it is still the version judged; False if it changed or went."""
    return layer.delete_object(name, version)


def copy(
    source: ObjectLayer,
    target: ObjectLayer,
    name: str,
    *,
    keyring: Keyring = NO_KEYS,
    trust_unsigned: bool = False,
) -> bool | str | None:
    """Stream ``name`` from ``source`` to ``target``, create-if-absent, as stored (nothing
    is re-signed). Artifacts are code, and a node installs unsigned ones from a local store
    without a key: so an artifact is copied only if ``keyring`` holds keys and an accepted
    one validly signed it, or with ``trust_unsigned`` (the operator's explicit word); else
    it is skipped. True if created, False if ``target`` had it, None if ``source`` has not,
    and the reason as text where it was skipped."""
    opened = source.open_object(name)
    if opened is None:
        return None
    try:
        if not trust_unsigned:
            try:
                manifest = read_manifest(opened)
            except ArtifactError as exc:
                return f"unreadable here ({exc})"
            verdict = manifest.verdict(keyring) if keyring.requires_signature else None
            if verdict is not SignatureVerdict.VALID:
                why = "unsigned" if manifest.signature is None else f"signature {verdict}"
                return f"{why} (copying unsigned code needs --trust-unsigned, or keys)"
            opened.close()
            opened = source.open_object(name)
            if opened is None:
                return None
        reader = opened

        def chunks() -> Iterator[bytes]:
            while chunk := reader.read(1 << 20):
                yield chunk

        return target.write_object(name, chunks())
    finally:
        if opened is not None:
            opened.close()


@dataclass(frozen=True)
class ArtifactPruning:
    """What ``prune`` did (or, in a dry run, would do)."""

    deleted: list[str]
    kept: list[tuple[str, str]]
    """(name, why) of artifacts kept: unreadable here, or changed since they were judged."""


def prune(
    layer: ObjectLayer,
    older_than: float,
    *,
    dry_run: bool = False,
    now: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ArtifactPruning:
    """Delete the artifacts created more than ``older_than`` seconds ago (by age only), each
    only as the version judged; artifacts this process cannot read are kept and reported."""
    now = time.time() if now is None else now
    gone: list[str] = []
    kept: list[tuple[str, str]] = []
    for entry in scan(layer, max_bytes):
        if entry.manifest is None:
            why = UNREADABLE_HERE if entry.unreadable else "unreadable: kept"
            kept.append((entry.name, f"{why} ({entry.error})"))
            continue
        if not prunable(entry.manifest.created_at, older_than, now):
            continue
        if dry_run or delete(layer, entry.name, entry.version):
            gone.append(entry.name)
        else:
            kept.append((entry.name, "changed since it was judged: kept"))
    return ArtifactPruning(gone, kept)
