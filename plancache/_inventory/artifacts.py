"""Listing, verifying, copying and pruning the objects of every registered kind (compile
artifacts, cache bundles, model info, boot reports: ``plancache._artifacts.registry``) in
any store, on its object layer (a library for the command line); each verb takes the kind's
declared value (``plancache._artifacts.kind.Kind``) and names no kind.

The rules every kind's inventory keeps (``plancache._inventory.plans`` keeps them for plans):

- a delete is conditional on the version that was judged: an artifact written under the
  same name since is kept;
- nothing this process cannot read is deleted: an unknown format, a codec not installed here
  or a size over this process's cap is reported as *unreadable here* and kept; ``prune``
  deletes by age only, ``verify(fix=True)`` only what is provably corrupt (a digest that does
  not match, a truncated or malformed stream) or, where signatures are required, what no
  accepted key signed;
- ``copy`` never makes code more trusted than it was, and copies the version it judged
  (see ``copy``).

``scan`` reads only each artifact's head (its manifest); ``verify`` reads every byte, checks
it against the manifest and its signature, and installs nothing (it extracts into a temp
directory that it removes).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from plancache import _reader as reader
from plancache._artifacts.bundles import CACHE_BUNDLES
from plancache._artifacts.compiled import COMPILE_ARTIFACTS
from plancache._artifacts.kind import Decode, Kind
from plancache._artifacts.manifest import DEFAULT_MAX_BYTES, Readable
from plancache._artifacts.modelinfo import MODEL_INFO as MODEL_INFO
from plancache._artifacts.trust import Refused, Signed, copy_refusal, refused, signature_refusal
from plancache._inventory import UNREADABLE_HERE, parallel, prunable
from plancache._objects import ObjectLayer
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError, UnreadableHereError

T = TypeVar("T")


class Head(Signed, Protocol):
    """What a kind's object says of itself at its head (a manifest, an envelope)."""

    @property
    def created_at(self) -> float: ...


ARTIFACTS, CACHES = COMPILE_ARTIFACTS, CACHE_BUNDLES
"""Kinds under the names this module gave them before the registry: each verb takes a kind
(``plancache._artifacts.registry.KINDS``: every kind), compile artifacts by default."""


@dataclass(frozen=True)
class ArtifactRecord:
    """One stored artifact as read: its manifest, or why it could not be read (``error``;
    ``unreadable``: by this process only, so kept), and the version judged."""

    name: str
    manifest: Any = None
    """The object's head: a compile artifact's ``Manifest``, a ``ModelInfo``, ..."""
    error: str | None = None
    unreadable: bool = False
    version: object = None

    @property
    def model(self) -> str:
        return "-" if self.manifest is None else str(self.manifest.labels.get("model", "-"))


def names(layer: ObjectLayer, kind: Kind = ARTIFACTS) -> list[str]:
    """The object names of ``kind`` in ``layer``, in order (listing bounds: the store's)."""
    return sorted(n for n in layer.list_objects(kind.prefix) if kind.named(n))


def read_entry(
    layer: ObjectLayer,
    name: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    kind: Kind = ARTIFACTS,
    head: Decode | None = None,
) -> ArtifactRecord | None:
    """The entry of ``name`` (its head, read from the object through ``reader.opened`` with
    ``head``, by default the kind's: one the store does not hand over is an entry unreadable
    here, never an error); None if it is gone."""
    version = None
    try:
        with reader.opened(layer, name) as opened:
            if opened is None:
                return None
            version = opened.version
            read = kind.head(opened, max_bytes) if head is None else head(opened, max_bytes)
    except UnreadableHereError as exc:
        return ArtifactRecord(name, error=str(exc), unreadable=True, version=version)
    except ArtifactError as exc:
        return ArtifactRecord(name, error=str(exc), version=version)
    if not kind.owns(read, name):
        return ArtifactRecord(name, error="its head names another object", version=version)
    return ArtifactRecord(name, read, version=version)


@dataclass
class Heads:
    """The reader of ``kind``'s heads in ``layer`` that its ``stats`` is given
    (``kind.Reader``): every object through ``read_entry``, so one the store does not hand
    over, or this process cannot read, is skipped and named in ``unreadable``."""

    layer: ObjectLayer
    kind: Kind
    max_bytes: int = DEFAULT_MAX_BYTES
    unreadable: list[str] = field(default_factory=list)

    def __call__(self, names: Sequence[str]) -> list[Any]:
        return [h for h in self.many(self.one, names) if h is not None]

    def one(self, name: str, head: Decode | None = None) -> Any:
        e = read_entry(self.layer, name, self.max_bytes, self.kind, head)
        if e is not None and e.unreadable:
            self.unreadable.append(name)  # one append: safe across the reading threads
        return None if e is None else e.manifest

    def many(self, read: Callable[[str], T], names: Sequence[str]) -> list[T]:
        return parallel(read, names)


def resolve(layer: ObjectLayer, refs: Sequence[str], kind: Kind = ARTIFACTS) -> list[str]:
    """The object names of ``kind`` that ``refs`` name, each uniquely (every one, where the
    kind's short reference may name several): its short reference (``<key or key
    prefix>/<rank>`` for an artifact) or an object name; ``ValueError`` naming the first
    that matches none or several."""
    known = names(layer, kind)
    found = []
    short = kind.short
    for ref in refs:
        matches = [n for n in known if n == ref or (short is not None and short.refers(ref, n))]
        many = short is not None and short.many and len(matches) > 1
        if (len(matches) != 1 and not many) or not ref.strip().partition("/")[0]:
            what = f"no {kind.label}" if not matches else f"{len(matches)} {kind.label}s"
            hint = "" if short is None else f" (give {short.hint})"
            raise ValueError(f"{what} match {ref!r} in {layer.url}{hint}")
        found += matches
    return list(dict.fromkeys(found))


def scan(
    layer: ObjectLayer, max_bytes: int = DEFAULT_MAX_BYTES, kind: Kind = ARTIFACTS
) -> Iterator[ArtifactRecord]:
    """Every object of ``kind`` in ``layer``, in name order."""
    for name in names(layer, kind):
        entry = read_entry(layer, name, max_bytes, kind)
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
    kind: Kind = ARTIFACTS,
) -> Problem | None:
    """None if every byte of ``name`` is what its head says (for an artifact: every file's
    digest and every extraction rule) and (with keys) an accepted key validly signed it;
    else the problem; a vanished object is no problem."""
    if not kind.named(name):
        return Problem(f"not a {kind.label}'s name", corrupt=False)

    def signed(head: Head) -> Refused | None:
        return signature_refusal(keyring, head.verdict)

    version = None
    try:
        with reader.opened(layer, name) as opened:
            if opened is None:
                return None
            version = opened.version
            kind.check(opened, name, signed, max_bytes)
    except UnreadableHereError as exc:
        return Problem(f"{UNREADABLE_HERE} ({exc})", corrupt=False, version=version)
    except ArtifactError as exc:
        return Problem(str(exc), corrupt=True, version=version)
    return None


def delete(layer: ObjectLayer, name: str, version: object) -> bool:
    """Delete ``name`` only if it is still the version judged; False if it changed or went."""
    return layer.delete_object(name, version)


COPY_SLACK = 64 << 20
"""Bytes an object may hold beyond the cap on its files (archive headers, the manifest)."""


def copy(
    source: ObjectLayer,
    target: ObjectLayer,
    name: str,
    *,
    keyring: Keyring = NO_KEYS,
    trust_unsigned: bool = False,
    kind: Kind = ARTIFACTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bool | str | None:
    """Copy ``name`` from ``source`` to ``target``, create-if-absent, as stored (nothing is
    re-signed), from one read of ``source``: the version judged is the version copied.
    Artifacts are code, and a node installs unsigned ones from a local store without a key:
    so an object is copied only where every byte of it checks against its head (the
    archive's digests, at most ``max_bytes``: this process's cap) and the trust module's
    rule finds it signed by an accepted key (``trust.copy_refusal``), read into a temp file
    and copied from there; or, with ``trust_unsigned`` (the operator's explicit word),
    streamed as it is. True if created, False if ``target`` had it, None if ``source`` has
    not, and the reason as text where it was skipped."""
    with contextlib.ExitStack() as stack:
        try:
            opened = stack.enter_context(reader.opened(source, name))
        except reader.Unreadable as exc:
            return f"{UNREADABLE_HERE} ({exc})"
        if opened is None:
            return None
        if trust_unsigned:
            return target.write_object(name, _chunks(opened))
        spool = stack.enter_context(tempfile.TemporaryFile(prefix="plancache-cp-"))
        size = 0
        while chunk := opened.read(1 << 20):
            size += len(chunk)
            if size > max_bytes + COPY_SLACK:
                return f"over {max_bytes} bytes (this process's cap)"
            spool.write(chunk)

        def accept(head: Any) -> Refused | None:
            why = copy_refusal(head, keyring)
            return None if why is None else refused(why)

        spool.seek(0)
        try:
            kind.check(spool, name, accept, max_bytes)
        except Refused as exc:
            return exc.why
        except UnreadableHereError as exc:
            return f"unreadable here ({exc})"
        except ArtifactError as exc:
            return f"invalid ({exc})"
        spool.seek(0)
        return target.write_object(name, _chunks(spool))


def _chunks(reader: Readable) -> Iterator[bytes]:
    while chunk := reader.read(1 << 20):
        yield chunk


@dataclass(frozen=True)
class ArtifactPruning:
    """What ``prune`` did (or, in a dry run, would do)."""

    deleted: list[str]
    kept: list[tuple[str, str]]
    """(name, why) of artifacts kept: unreadable here, or changed since they were judged."""


def _surplus(entries: list[ArtifactRecord], kind: Kind, keep: int | None) -> set[str]:
    """The names of ``entries`` past the newest ``keep`` of their group (``Kind.group``)."""
    group = kind.group
    if keep is None or group is None:
        return set()
    groups: dict[str, list[tuple[float, str]]] = {}
    for e in entries:
        if e.manifest is not None:
            groups.setdefault(group(e.manifest), []).append((-e.manifest.created_at, e.name))
    return {name for members in groups.values() for _, name in sorted(members)[keep:]}


def prune(
    layer: ObjectLayer,
    older_than: float | None,
    *,
    dry_run: bool = False,
    now: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    kind: Kind = ARTIFACTS,
    keep: int | None = None,
) -> ArtifactPruning:
    """Delete the objects of ``kind`` created more than ``older_than`` seconds ago (None:
    none by age), and, with ``keep``, all but the newest ``keep`` of each of the kind's
    groups (``Kind.group``; a kind without groups: none), each only as the version judged;
    those this process cannot read are kept and reported."""
    now = time.time() if now is None else now
    gone: list[str] = []
    kept: list[tuple[str, str]] = []
    entries = list(scan(layer, max_bytes, kind))
    for entry in entries:
        if entry.manifest is None:
            why = UNREADABLE_HERE if entry.unreadable else "unreadable: kept"
            kept.append((entry.name, f"{why} ({entry.error})"))
    readable = [e for e in entries if e.manifest is not None]
    surplus = _surplus(readable, kind, keep)
    for entry in readable:
        assert entry.manifest is not None
        old = older_than is not None and prunable(entry.manifest.created_at, older_than, now)
        if not old and entry.name not in surplus:
            continue
        if dry_run or delete(layer, entry.name, entry.version):
            gone.append(entry.name)
        else:
            kept.append((entry.name, "changed since it was judged: kept"))
    return ArtifactPruning(gone, kept)
