"""What the ``plancache`` subcommands do with compile artifacts (``plancache.artifacts``),
beside the plans of the same store: each ``cmd_*`` of ``commands`` calls the function of the
same name here with the store's artifacts. An artifact is named ``KEY/rank_R_D`` (``KEY``: a
unique prefix of vLLM's key) or by its object name."""

from __future__ import annotations

import re
import time
from typing import Any

from plancache.artifacts import inventory
from plancache.artifacts.blobs import Blobs
from plancache.artifacts.inventory import ArtifactEntry
from plancache.artifacts.manifest import parse_object_name
from plancache.display import age, echo, plural, print_table, size, when
from plancache.signing import Keyring, Verdict

KIND = "compile"
"""The KIND column of an artifact (plans are listed in their own table)."""


_REF = re.compile(r"[0-9a-fA-F]{1,64}/rank_[0-9]{1,6}_[0-9]{1,6}")


def is_ref(text: str) -> bool:
    """True if ``text`` names an artifact (``KEY/rank_R_D`` or an object name), not a plan."""
    return bool(_REF.fullmatch(text.strip())) or parse_object_name(text) is not None


def _ref(e: ArtifactEntry) -> str:
    m = e.manifest
    return e.name if m is None else f"{m.key[:12]}/{m.rank}"


def _signed(e: ArtifactEntry, keyring: Keyring) -> str:
    assert e.manifest is not None
    sig = e.manifest.signature
    text = "-" if sig is None else sig.keyid
    if keyring.requires_signature and e.manifest.verdict(keyring) is not Verdict.VALID:
        text += f" ({e.manifest.verdict(keyring)})"
    return text


def entry_dict(e: ArtifactEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": KIND, "name": e.name}
    if e.manifest is None:
        return {**out, "error": e.error}
    m = e.manifest
    return {
        **out,
        "key": m.key,
        "rank": m.rank,
        "bytes": m.total_size,
        "files": len(m.files),
        "labels": dict(m.labels),
        "producer": dict(m.producer),
        "created_at": m.created_at,
        "signature": None if m.signature is None else m.signature.to_dict(),
    }


def ls(blobs: Blobs, keyring: Keyring) -> list[ArtifactEntry]:
    """Print one row per artifact (unreadable ones after, with the reason); the entries."""
    entries = list(inventory.scan(blobs))
    valid = [e for e in entries if e.manifest is not None]
    now = time.time()
    signed = keyring.requires_signature or any(
        e.manifest.signature is not None for e in valid if e.manifest is not None
    )
    rows = [
        [
            KIND,
            _ref(e),
            e.model,
            size(e.manifest.total_size),
            str(len(e.manifest.files)),
            age(now - e.manifest.created_at),
            str(e.manifest.producer.get("host", "-")),
            *([_signed(e, keyring)] if signed else []),
        ]
        for e in valid
        if e.manifest is not None
    ]
    if rows:
        echo()
        headers = ["KIND", "ARTIFACT", "MODEL", "SIZE", "FILES", "AGE", "HOST"]
        print_table([*headers, *(["SIGNED"] if signed else [])], rows, right={3, 4, 5})
    for e in entries:
        if e.manifest is None:
            echo(f"  unreadable compile artifact {e.name}: {e.error}")
    return entries


def show(blobs: Blobs, ref: str, keyring: Keyring) -> int:
    [name] = inventory.resolve(blobs, [ref])
    e = inventory.read_entry(blobs, name)
    if e is None or e.manifest is None:
        echo(f"compile artifact {name}: {'gone' if e is None else e.error}")
        return 1
    m = e.manifest
    echo(f"kind         {KIND} artifact (vLLM AOT)")
    echo(f"key          {m.key}")
    echo(f"rank         {m.rank}")
    echo(f"object       {name} in {blobs.url}")
    echo(f"created      {when(m.created_at, time.time())}")
    echo(f"size         {size(m.total_size)} in {plural(len(m.files), 'file')}")
    echo(f"digest       {m.digest}")
    if m.signature is not None or keyring.requires_signature:
        echo(f"signed       {_signed(e, keyring) if m.signature else 'no'}")
    for label, values in (("labels", m.labels), ("producer", m.producer)):
        for k in sorted(values):
            echo(f"{label:12s} {k}={values[k]}")
    print_table(
        ["  PATH", "SIZE", "MODE", "SHA256"],
        [[f"  {f.path}", str(f.size), oct(f.mode), f.sha256[:16]] for f in m.files],
        right={1},
    )
    return 0


def verify(blobs: Blobs, keyring: Keyring, *, fix: bool) -> tuple[int, int]:
    """Read every byte of every artifact; print each finding (deleted with ``fix``).
    (checked, findings)."""
    names = sorted(blobs.names())
    bad = 0
    for name in names:
        problem = inventory.verify(blobs, name, keyring)
        if problem is None:
            continue
        bad += 1
        note = "  (deleted)" if fix and blobs.delete(name) else ""
        echo(f"{name}  {problem}{note}")
    return len(names), bad


def rm(blobs: Blobs, refs: list[str]) -> None:
    for name in inventory.resolve(blobs, refs):
        echo(f"deleted {name}" if blobs.delete(name) else f"already gone {name}")


def prune(blobs: Blobs, older_than: float, *, dry_run: bool) -> None:
    """Delete (or list) the artifacts older than ``older_than`` seconds; silent if none."""
    verb = "would delete" if dry_run else "deleted"
    gone = inventory.prune(blobs, older_than, dry_run=dry_run)
    for name in gone:
        echo(f"{verb} {name}")
    if gone:
        echo(f"{verb} {plural(len(gone), 'compile artifact')} older than {age(older_than)}")


def cp(src: Blobs, dst: Blobs) -> None:
    """Copy every artifact, create-if-absent (as stored); silent if there are none."""
    created = kept = 0
    for name in sorted(src.names()):
        done = inventory.copy(src, dst, name)
        created += done is True
        kept += done is False
    if created or kept:
        echo(f"copied compile artifacts: {created} created, {kept} kept")


def stats(blobs: Blobs) -> dict[str, Any]:
    entries = [e for e in inventory.scan(blobs) if e.manifest is not None]
    stamps = [e.manifest.created_at for e in entries if e.manifest is not None]
    return {
        "artifacts": len(entries),
        "artifact_bytes": sum(e.manifest.total_size for e in entries if e.manifest is not None),
        "artifacts_oldest": min(stamps, default=None),
        "artifacts_newest": max(stamps, default=None),
    }
