"""What the ``plancache`` subcommands do with the kinds loaded as code or trusted as fact
(compile artifacts, cache bundles, model info and boot reports, ``plancache._artifacts``),
beside the plans of the same store: each ``cmd_*`` of ``reading`` and ``maintenance`` calls
the function of the same name here, which goes over every registered kind
(``plancache._artifacts.registry.KINDS``) and asks the kind's value what to show and do
(``plancache._artifacts.kind.Kind``): no kind is named here. An object is named by its
object name, or by its kind's short reference (an artifact's ``KEY/rank_R_D``, ``KEY``: a
unique prefix of vLLM's key)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plancache import _claims as claims
from plancache._artifacts.archive import remove_partial_installs
from plancache._artifacts.kind import Kind
from plancache._artifacts.registry import KINDS
from plancache._command.display import age, echo, plural, print_table, when
from plancache._inventory import artifacts as inventory
from plancache._inventory.artifacts import ArtifactRecord
from plancache._objects import ObjectLayer
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import PlanStoreError, PlanStoreReadOnlyError


def _listed() -> list[Kind]:
    """The kinds ``ls`` lists, ``show`` shows and ``rm`` removes by name."""
    return [kind for kind in KINDS if kind.table is not None]


def _kind_of(text: str) -> Kind | None:
    """The listed kind ``text`` names: by an object name, else by a short reference."""
    ref = text.strip()
    kinds = _listed()
    named = [k for k in kinds if k.named(ref)]
    short = [k for k in kinds if k.short is not None and k.short.pattern.fullmatch(ref)]
    return next(iter(named or short), None)


def is_ref(text: str) -> bool:
    """True if ``text`` names an object of a listed kind (its name or short reference),
    not a plan."""
    return _kind_of(text) is not None


def record_dict(kind: Kind, e: ArtifactRecord) -> dict[str, Any]:
    """A record as JSON: its kind and name, then the kind's fields, its time and signature
    (or why it could not be read)."""
    out: dict[str, Any] = {"kind": kind.name, "name": e.name}
    if e.manifest is None:
        return {**out, "error": e.error}
    sig = e.manifest.signature
    signature = None if sig is None else sig.to_dict()
    fields = kind.fields(e.manifest)
    return {**out, **fields, "created_at": e.manifest.created_at, "signature": signature}


def dicts(layer: ObjectLayer, max_bytes: int) -> list[dict[str, Any]]:
    """``ls --json``'s records of every listed kind, kind by kind, in name order."""
    return [record_dict(k, e) for k in _listed() for e in inventory.scan(layer, max_bytes, k)]


def ls(
    layer: ObjectLayer, keyring: Keyring, max_bytes: int
) -> list[tuple[Kind, list[ArtifactRecord]]]:
    """Print one table per listed kind (a row per readable object; unreadable ones after,
    with the reason); each kind with its entries."""
    out = []
    now = time.time()
    for kind in _listed():
        table = kind.table
        assert table is not None
        entries = list(inventory.scan(layer, max_bytes, kind))
        heads = [e.manifest for e in entries if e.manifest is not None]
        rows = [table.row(head, now, keyring) for head in heads]
        headers = list(table.headers)
        signed = keyring.requires_signature or any(h.signature is not None for h in heads)
        if table.signed_where_any and not signed:
            headers, rows = headers[:-1], [row[:-1] for row in rows]
        if rows:
            echo()
            print_table(headers, rows, right=table.right)
        for e in entries:
            if e.manifest is None:
                where = "unreadable here" if e.unreadable else "unreadable"
                echo(f"  {where} {kind.label} {e.name}: {e.error}")
        out.append((kind, entries))
    return out


def show(layer: ObjectLayer, ref: str, keyring: Keyring, max_bytes: int) -> int:
    """Print the object ``ref`` names (``is_ref``); 1 where it is gone or unreadable."""
    kind = _kind_of(ref)
    assert kind is not None and kind.show is not None
    [name] = [ref.strip()] if kind.short is None else inventory.resolve(layer, [ref], kind)
    e = inventory.read_entry(layer, name, max_bytes, kind)
    if e is None or e.manifest is None:
        echo(f"{kind.label} {name}: {'gone' if e is None else e.error}")
        return 1
    for line in kind.show(e.manifest, f"{name} in {layer.url}", keyring):
        echo(line)
    return 0


def verify(
    layer: ObjectLayer, keyring: Keyring, max_bytes: int, *, fix: bool, require_signature: bool
) -> tuple[int, int]:
    """Read every byte of every object of every code kind; print each finding, and a summary
    per kind. With ``fix``, delete what is provably corrupt (or, with ``require_signature``,
    unsigned), only as the version judged; what is unreadable here is kept. (findings,
    findings a refusing store kept)."""
    bad = refused = 0
    for kind in KINDS:
        found, kept = _verify(layer, kind, keyring, max_bytes, fix, require_signature)
        bad, refused = bad + found, refused + kept
    return bad, refused


def _verify(
    layer: ObjectLayer,
    kind: Kind,
    keyring: Keyring,
    max_bytes: int,
    fix: bool,
    require_signature: bool,
) -> tuple[int, int]:
    names = inventory.names(layer, kind)
    bad = refused = 0
    for name in names:
        problem = inventory.verify(layer, name, keyring, max_bytes, kind)
        if problem is None:
            continue
        bad += 1
        signature = problem.text.startswith("invalid:signature")
        doomed = problem.corrupt and (require_signature or not signature)
        note = ""
        if fix and doomed:
            try:
                deleted = inventory.delete(layer, name, problem.version)
                note = "  (deleted)" if deleted else "  (changed since it was judged: kept)"
            except PlanStoreReadOnlyError as exc:
                refused += 1
                note = f"  (not deleted: {exc})"
        elif fix:
            note = "  (kept)"
        echo(f"{name}  {problem.text}{note}")
    if names:
        echo(f"{plural(len(names), kind.label)} checked{kind.verified}: {bad} failed")
    return bad, refused


def rm(layer: ObjectLayer, refs: list[str]) -> None:
    """Delete the objects ``refs`` name (``is_ref``); those of a kind with short references
    are resolved first, every one of them."""
    names: list[str] = []
    for kind in _listed():
        mine = [r for r in refs if _kind_of(r) is kind]
        if kind.short is not None:
            names += inventory.resolve(layer, mine, kind)
        else:
            names += dict.fromkeys(r.strip() for r in mine)
    for name in names:
        echo(f"deleted {name}" if layer.delete_object(name) else f"already gone {name}")


def prune(
    layer: ObjectLayer,
    older_than: float | None,
    max_bytes: int,
    *,
    dry_run: bool,
    installs: Path | None = None,
    roots: Sequence[Path] = (),
    keep: int | None = None,
) -> None:
    """Delete (or list) the objects older than ``older_than`` seconds (None: none by age)
    and, with ``keep``, all but the newest ``keep`` of each group of a kind that has groups
    (a cache's bundles of one kind and scope), and report those kept; with ``installs``
    (this node's vLLM compile cache) and ``roots`` (its generated caches: Triton's), also
    the temp directories of installs killed that long ago, in every directory they install
    into; silent if there is nothing."""
    verb = "would delete" if dry_run else "deleted"
    if installs is not None and older_than is not None:
        keys = sorted(installs.iterdir()) if installs.is_dir() else []
        for where, dirs in ((installs, keys), *((root, [root]) for root in roots)):
            stale = sum(remove_partial_installs(d, older_than, dry_run=dry_run) for d in dirs)
            if stale:
                echo(f"{verb} {plural(stale, 'partial install')} of killed boots in {where}")
    for kind in KINDS:
        if older_than is None and kind.group is None:
            continue
        result = inventory.prune(
            layer, older_than, dry_run=dry_run, max_bytes=max_bytes, kind=kind, keep=keep
        )
        for name in result.deleted:
            echo(f"{verb} {name}")
        for name, why in result.kept:
            echo(f"{name}  {why}")
        whys = [f"older than {age(older_than)}"] if older_than is not None else []
        whys += (
            [f"past the newest {keep} of their scope"] if keep is not None and kind.group else []
        )
        if result.deleted:
            echo(f"{verb} {plural(len(result.deleted), kind.label)} {' or '.join(whys)}")
    prune_claims(layer, max_bytes, dry_run=dry_run)


def ls_claims(layer: ObjectLayer, max_bytes: int) -> None:
    """The upload claims ``layer`` holds, stale ones marked; silent if there are none."""
    now = time.time()
    found = list(claims.claims(layer))
    if found:
        echo("upload claims (a node uploading the object; `plancache prune` removes stale ones):")
    for c in found:
        state = "stale" if c.stale(now, max_bytes) else f"until {when(c.until, now)}"
        echo(f"  {c.name}  {c.host or '?'}  {state}")


def prune_claims(layer: ObjectLayer, max_bytes: int, *, dry_run: bool) -> None:
    """Delete (or list) the stale upload claims: expired, or dated later than any node
    could claim (each only as the version read); silent if there are none."""
    now = time.time()
    gone = 0
    for c in claims.claims(layer):
        if not c.stale(now, max_bytes):
            continue
        try:
            gone += dry_run or layer.delete_object(c.name, c.version)
        except PlanStoreError as exc:
            echo(f"{c.name}  not deleted: {exc}")
    if gone:
        echo(f"{'would delete' if dry_run else 'deleted'} {plural(gone, 'stale upload claim')}")


def cp(
    src: ObjectLayer, dst: ObjectLayer, keyring: Keyring, max_bytes: int, *, trust_unsigned: bool
) -> None:
    """Copy every object of every code kind, create-if-absent (as stored), signed ones only
    unless ``trust_unsigned``; says what it skipped; silent if there are none."""
    for kind in KINDS:
        if not kind.copied:
            continue
        created = kept = 0
        skipped: list[tuple[str, str]] = []
        for name in inventory.names(src, kind):
            done = inventory.copy(
                src,
                dst,
                name,
                keyring=keyring,
                trust_unsigned=trust_unsigned,
                kind=kind,
                max_bytes=max_bytes,
            )
            if isinstance(done, str):
                skipped.append((name, done))
            created += done is True
            kept += done is False
        for name, why in skipped:
            echo(f"skipped {kind.label} {name}: {why}")
        if created or kept or skipped:
            counts = f"{created} created, {kept} kept, {len(skipped)} skipped"
            echo(f"copied {kind.label}s: {counts}")


def stats(layer: ObjectLayer, max_bytes: int, keyring: Keyring = NO_KEYS) -> dict[str, Any]:
    """``stats --json``'s fields of every registered kind (``Kind.stats``: from the names
    stored and a reader of their heads, ``inventory.Heads``)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        heads = inventory.Heads(layer, kind, max_bytes)
        out.update(kind.stats(inventory.names(layer, kind), heads, keyring))
    return out


def stats_text(fields: dict[str, Any]) -> list[str]:
    """``stats``' lines of every registered kind, from ``stats``' fields."""
    return [line for kind in KINDS for line in kind.stats_text(fields)]
