"""Listing, verifying, copying and pruning the compile artifacts of any store (a library for
the command line; local I/O and the stores' streams).

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

from plancache.artifacts.archive import ArtifactError, install, read_manifest
from plancache.artifacts.blobs import Blobs
from plancache.artifacts.manifest import DEFAULT_MAX_BYTES, Manifest, parse_object_name
from plancache.signing import NO_KEYS, Keyring, Verdict


@dataclass(frozen=True)
class ArtifactEntry:
    """One stored artifact: its object name and manifest, or why it could not be read."""

    name: str
    manifest: Manifest | None = None
    error: str | None = None

    @property
    def model(self) -> str:
        return "-" if self.manifest is None else str(self.manifest.labels.get("model", "-"))


def read_entry(blobs: Blobs, name: str, max_bytes: int = DEFAULT_MAX_BYTES) -> ArtifactEntry | None:
    """The entry of ``name`` (its manifest, read from the object's head); None if it is gone."""
    reader = blobs.open(name)
    if reader is None:
        return None
    try:
        manifest = read_manifest(reader, max_bytes=max_bytes)
    except ArtifactError as exc:
        return ArtifactEntry(name, error=str(exc))
    finally:
        reader.close()
    if (manifest.key, manifest.rank) != parse_object_name(name):
        return ArtifactEntry(name, error="its manifest names another key or rank")
    return ArtifactEntry(name, manifest)


def resolve(blobs: Blobs, refs: Sequence[str]) -> list[str]:
    """The object names that ``refs`` name, each uniquely: ``<key or key prefix>/<rank>``
    or an object name; ``ValueError`` naming the first that matches none or several."""
    known = sorted(blobs.names())
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
            raise ValueError(f"{what} match {ref!r} in {blobs.url} (give KEY/rank_R_D)")
        found.append(matches[0])
    return list(dict.fromkeys(found))


def scan(blobs: Blobs, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[ArtifactEntry]:
    """Every artifact of ``blobs``, in name order."""
    for name in sorted(blobs.names()):
        entry = read_entry(blobs, name, max_bytes)
        if entry is not None:
            yield entry


def verify(
    blobs: Blobs, name: str, keyring: Keyring = NO_KEYS, max_bytes: int = DEFAULT_MAX_BYTES
) -> str | None:
    """None if every byte of ``name`` matches its manifest, the archive follows every
    extraction rule and (with keys) an accepted key validly signed it; else why not."""
    parsed = parse_object_name(name)
    if parsed is None:
        return "not an artifact's name"
    reader = blobs.open(name)
    if reader is None:
        return "gone"

    def signed(manifest: Manifest) -> str | None:
        if not keyring.requires_signature:
            return None
        verdict = manifest.verdict(keyring)
        return None if verdict is Verdict.VALID else f"invalid:signature ({verdict})"

    try:
        with tempfile.TemporaryDirectory(prefix="plancache-verify-") as temp:
            install(reader, Path(temp) / parsed[0], *parsed, accept=signed, max_bytes=max_bytes)
    except ArtifactError as exc:
        return str(exc)
    finally:
        reader.close()
    return None


def copy(source: Blobs, target: Blobs, name: str) -> bool | None:
    """Stream ``name`` from ``source`` to ``target``, create-if-absent (as stored: nothing
    is re-signed); True if created, False if ``target`` had it, None if ``source`` has not."""
    reader = source.open(name)
    if reader is None:
        return None

    def chunks() -> Iterator[bytes]:
        while chunk := reader.read(1 << 20):
            yield chunk

    try:
        return target.create(name, chunks())
    finally:
        reader.close()


def prune(
    blobs: Blobs, older_than: float, *, dry_run: bool = False, now: float | None = None
) -> list[str]:
    """Delete the artifacts created more than ``older_than`` seconds ago, and those whose
    head cannot be read; the names deleted (or, with ``dry_run``, that would be)."""
    now = time.time() if now is None else now
    gone = []
    for entry in scan(blobs):
        old = entry.manifest is None or now - entry.manifest.created_at > older_than
        if old and (dry_run or blobs.delete(entry.name)):
            gone.append(entry.name)
    return gone
