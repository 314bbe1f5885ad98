"""Kinds are declared values, registered in one place (``plancache._artifacts.registry``):
a kind this test declares and registers, and nothing else (no command module touched), is
listed, shown, verified, copied, pruned, removed and counted by the ``plancache`` command
like the kinds the package ships; the registry refuses a kind that would claim another's
objects."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from plancache._artifacts import registry
from plancache._artifacts.kind import Kind, Reader, Table, envelope_kind, signed_text
from plancache._artifacts.manifest import Envelope, Readable, read_bounded
from plancache._command.cli import main
from plancache._config import Settings
from plancache._plan import Signature
from plancache._signing import Keyring
from plancache.errors import ArtifactError

PREFIX = "test_note_"
DAY = 86400.0


@dataclass(frozen=True)
class Note(Envelope):
    """The test's own kind of object: one line of text, as a signed envelope."""

    text: str
    created_at: float
    signature: Signature | None = None

    @property
    def name(self) -> str:
        return f"{PREFIX}{re.sub(r'[^a-z]', '', self.text)[:16]}.json"

    def body(self) -> dict[str, Any]:
        return {"text": self.text, "created_at": self.created_at}


def read(stream: Readable) -> Note:
    try:
        obj = orjson.loads(read_bounded(stream, 1024))
        return Note(str(obj["text"]), float(obj["created_at"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"not a note: {exc}") from None


def _stats(names: Sequence[str], read_heads: Reader, keyring: Keyring) -> dict[str, Any]:
    return {"notes": len(read_heads(names))}


NOTES = envelope_kind(
    "note",
    "note",
    PREFIX,
    read,
    "its envelope is another note",
    named=lambda name: re.fullmatch(rf"{PREFIX}[a-z]{{1,16}}\.json", name) is not None,
    stats=_stats,
    stats_text=lambda s: [f"notes    {s['notes']} read"],
    table=Table(
        ("KIND", "NOTE", "SIGNED"),
        lambda note, now, keyring: ["note", note.text, signed_text(note, keyring)],
        frozenset(),
    ),
    fields=lambda note: {"text": note.text},
    show=lambda note, where, keyring: [f"note         {note.text}", f"object       {where}"],
)


@pytest.fixture
def notes() -> Iterator[Kind]:
    """``NOTES`` registered for the test's duration."""
    registry.register(NOTES)
    try:
        yield NOTES
    finally:
        registry.unregister(NOTES)


def _store(root: Path, *notes: Note) -> None:
    layer = Settings(str(root)).open_store().layer
    for note in notes:
        assert layer.write_object(note.name, [note.encode()])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["--timeout", "60", *argv])
    return code, capsys.readouterr().out


def test_a_registered_kind_is_served_by_every_command(
    notes: Kind, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, copy = str(tmp_path / "store"), str(tmp_path / "copy")
    hello, old = Note("hello", time.time()), Note("stale", time.time() - 40 * DAY)
    _store(tmp_path / "store", hello, old)

    code, out = _run(capsys, "ls", store)
    assert code == 0 and re.search(r"^note\s+hello\s+-$", out, re.M), out
    assert "2 notes, in" in out
    code, out = _run(capsys, "ls", "--json", store)
    assert {"kind": "note", "name": hello.name, "text": "hello"}.items() <= next(
        r for r in orjson.loads(out) if r["name"] == hello.name
    ).items()
    assert _run(capsys, "show", hello.name, "--url", store) == (
        0,
        f"note         hello\nobject       {hello.name} in {store}\n",
    )
    code, out = _run(capsys, "stats", store)
    assert code == 0 and "notes    2 read" in out
    assert orjson.loads(_run(capsys, "stats", "--json", store)[1])["notes"] == 2
    code, out = _run(capsys, "verify", store)
    assert code == 0 and "2 notes checked: 0 failed" in out
    code, out = _run(capsys, "cp", "--trust-unsigned", store, copy)
    assert code == 0 and "copied notes: 2 created, 0 kept, 0 skipped" in out
    code, out = _run(capsys, "prune", "--older-than", "30d", store)
    assert code == 0 and f"deleted {old.name}" in out and "deleted 1 note older than 30d" in out
    code, out = _run(capsys, "rm", hello.name, "--url", store)
    assert code == 0 and f"deleted {hello.name}" in out
    assert "nothing stored, in" in _run(capsys, "ls", store)[1]
    assert "2 notes" in _run(capsys, "ls", copy)[1]


def test_an_unregistered_kind_is_unknown_to_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same store without the registration line: the objects are nobody's."""
    hello = Note("hello", time.time())
    _store(tmp_path / "store", hello)
    code, out = _run(capsys, "ls", str(tmp_path / "store"))
    assert code == 0 and "note" not in out


@pytest.mark.parametrize("prefix", [PREFIX, "cache_", "cache_note_", "c"])
def test_the_registry_refuses_a_kind_claiming_another_kinds_objects(
    notes: Kind, prefix: str
) -> None:
    """No two kinds list each other's objects: prefixes may not overlap, names not repeat."""
    with pytest.raises(ValueError, match="overlaps"):
        registry.register(Kind("other", "other", prefix, **_same_as(notes)))
    with pytest.raises(ValueError, match="overlaps"):
        registry.register(Kind("note", "other", "unused_", **_same_as(notes)))
    assert registry.KINDS.count(notes) == 1 and len(registry.KINDS) == 5


def _same_as(kind: Kind) -> dict[str, Any]:
    return {
        "named": kind.named,
        "head": kind.head,
        "owns": kind.owns,
        "check": kind.check,
        "stats": kind.stats,
    }
