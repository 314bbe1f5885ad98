"""A kind of stored object, declared as a value (``Kind``): what the inventory and every
command need to know of it, so that they iterate over the registered kinds
(``plancache._artifacts.registry``) and never name one.

A kind's value says, in one place: its name and how its objects are named (``prefix``,
``named``), how an object's head is read and checked (``head``, ``owns``, ``check``: the
envelope and its limits, raising ``ArtifactError``; ``UnreadableHereError`` for what this
process cannot read), how ``ls``, ``ls --json`` and ``show`` show it (``table``, ``fields``,
``show``; a kind without a ``table`` is neither listed, shown nor removed by name), how
``verify``, ``cp`` and ``stats`` treat it (``verified``, ``copied``, ``stats``,
``stats_text``; ``stats`` reads through the ``Reader`` it is given, every object through
the bounded reader, ``plancache._reader``). Its fetch and upload on the
configured stores are an operations class of its own module, built on the engine by
composition (``Engine`` is passed in, never inherited). Adding a kind: docs/layout.md,
"Adding a kind".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from plancache._artifacts.archive import read_manifest
from plancache._artifacts.manifest import Manifest, Readable
from plancache._artifacts.trust import Refused, Signed
from plancache._command.display import plural, size, table, when
from plancache._signing import Keyring, SignatureVerdict
from plancache.errors import ArtifactError

T = TypeVar("T")

Accept = Callable[[Any], Refused | None]
"""What a check asks of the keys: None to accept a head, else why not."""
Decode = Callable[[Readable, int], Any]
"""How an object's head is read (``int``: this process's cap on a kind's files)."""


class Reader(Protocol):
    """How a kind's ``stats`` reads its objects in one store (``_inventory.artifacts.Heads``):
    each through the bounded reader (``plancache._reader.opened``), so one the
    store does not hand over, or this process cannot read, is skipped and named in
    ``unreadable``, never an error."""

    unreadable: list[str]

    def __call__(self, names: Sequence[str]) -> list[Any]:
        """The heads of the named objects that could be read (the kind's ``head``), in the
        order named, read on a few threads."""
        ...

    def one(self, name: str, head: Decode | None = None) -> Any:
        """The head of ``name``, read with ``head`` where given (a decoder of the kind's that
        judges the keys on the bytes) else the kind's; None where it is gone, invalid, not
        its name's or unreadable."""
        ...

    def many(self, read: Callable[[str], T], names: Sequence[str]) -> list[T]:
        """``read`` over ``names`` on a few threads, results in order (``reader.Many``)."""
        ...


def signed_text(head: Signed, keyring: Keyring) -> str:
    """The key id that signed ``head`` (``-``: none), and where the keys require signatures
    and reject it, why in a word."""
    sig = head.signature
    text = "-" if sig is None else sig.keyid
    verdict = head.verdict(keyring)
    if keyring.requires_signature and verdict is not SignatureVerdict.VALID:
        text += f" ({verdict})"
    return text


@dataclass(frozen=True)
class Table:
    """How ``ls`` lists a kind: its headers, each readable head's row (``row(head, now,
    keyring)``), the right-aligned (numeric) columns; ``signed_where_any``: the last column
    (SIGNED) only where the keys require signatures or a listed head is signed."""

    headers: tuple[str, ...]
    row: Callable[[Any, float, Keyring], list[str]]
    right: frozenset[int]
    signed_where_any: bool = False


@dataclass(frozen=True)
class Short:
    """A short reference to a kind's objects besides their names (``KEY/rank_R_D``): its
    ``pattern``, whether a reference names an object (``refers(ref, name)``) and the form
    an error message suggests (``hint``)."""

    pattern: re.Pattern[str]
    refers: Callable[[str, str], bool]
    hint: str
    many: bool = False
    """Whether one reference may name several objects (every bundle of a scope)."""


@dataclass(frozen=True)
class Kind:
    """A kind of stored object (see the module docstring)."""

    name: str
    """The KIND of ``ls --json``."""
    label: str
    """What one object is called in messages (``compile artifact``)."""
    prefix: str
    named: Callable[[str], bool]
    head: Decode
    """The head of an object."""
    owns: Callable[[Any, str], bool]
    """Whether a head belongs to the object name it was read under."""
    check: Callable[[Readable, str, Accept, int], None]
    """Read every byte and check it against its head and the keys (``Accept``)."""
    stats: Callable[[Sequence[str], Reader, Keyring], dict[str, Any]]
    """``stats --json``'s fields, from the names stored (in name order) and a reader of
    their heads."""
    stats_text: Callable[[dict[str, Any]], list[str]] = lambda stats: []
    """``stats``' lines, from those fields."""
    table: Table | None = None
    fields: Callable[[Any], dict[str, Any]] = lambda head: {}
    """``ls --json``'s fields of a readable head (besides kind, name, time, signature)."""
    show: Callable[[Any, str, Keyring], list[str]] | None = None
    """``show``'s lines of a head (``str``: the line naming the object and its store)."""
    short: Short | None = None
    group: Callable[[Any], str] | None = None
    """The group of a head: objects that stand for each other (a cache's bundles of one
    kind and scope), of which ``prune --keep-newest N`` keeps the newest N."""
    verified: str = ""
    """What ``verify``'s summary adds to ``N <label>s checked``."""
    copied: bool = True
    """Whether ``cp`` copies the kind (never making it more trusted than it was)."""


def envelope_kind(
    name: str, label: str, prefix: str, read: Callable[[Readable], Any], misnamed: str, **rest: Any
) -> Kind:
    """A kind whose object is one envelope (``read`` decodes it within its limits; its
    ``name`` property is its object's name): the head is the whole object, decoded, and its
    check that, that it belongs to its name (else ``misnamed``) and that the keys accept
    it; ``rest``: the kind's other fields."""

    def check(stream: Readable, object_name: str, accept: Accept, max_bytes: int) -> None:
        head = read(stream)
        if head.name != object_name:
            raise ArtifactError(misnamed)
        why = accept(head)
        if why is not None:
            raise Refused(why.refusal, why.detail, label)

    return Kind(
        name,
        label,
        prefix,
        head=lambda stream, max_bytes: read(stream),
        owns=lambda head, object_name: head.name == object_name,
        check=check,
        **rest,
    )


def manifest_head(stream: Readable, max_bytes: int) -> Manifest:
    """The head of a kind whose object is a manifest and its files: the manifest."""
    return read_manifest(stream, max_bytes=max_bytes)


def sized(tag: str, noun: str, count: str, total: str) -> Callable[[dict[str, Any]], list[str]]:
    """``stats``' line of a kind with sizes: ``<tag>  N <noun>s, <size of total>``, where
    the fields ``count`` and ``total`` say; none where there are none."""
    return lambda s: [f"{tag:8s} {plural(s[count], noun)}, {size(s[total])}"] if s[count] else []


def manifest_show(
    about: Callable[[Manifest], list[str]],
) -> Callable[[Manifest, str, Keyring], list[str]]:
    """The ``show`` of a kind whose object is a manifest and its files: ``about``'s lines,
    the object, its time, size, digest and signature (where signed or required), labels
    and producer (a mapping as its size: ``ls --json`` lists it), then one row per file."""

    def show(m: Manifest, where: str, keyring: Keyring) -> list[str]:
        lines = [
            *about(m),
            f"object       {where}",
            f"created      {when(m.created_at, time.time())}",
            f"size         {size(m.total_size)} in {plural(len(m.files), 'file')}",
            f"digest       {m.digest}",
        ]
        if m.signature is not None or keyring.requires_signature:
            lines.append(f"signed       {signed_text(m, keyring) if m.signature else 'no'}")
        for label, values in (("labels", m.labels), ("producer", m.producer)):
            for k in sorted(values):
                v = values[k]
                shown = f"({len(v)} entries: `ls --json` lists them)" if isinstance(v, dict) else v
                lines.append(f"{label:12s} {k}={shown}")
        rows = [[f"  {f.path}", str(f.size), oct(f.mode), f.sha256[:16]] for f in m.files]
        return [*lines, *table(["  PATH", "SIZE", "MODE", "SHA256"], rows, right={1})]

    return show
