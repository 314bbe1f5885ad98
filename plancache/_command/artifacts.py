"""What the ``plancache`` subcommands do with the kinds loaded as code or trusted as fact
(compile artifacts, cache bundles, model info and boot reports, ``plancache._artifacts``),
beside the plans of the same store: each ``cmd_*`` of ``reading`` and ``maintenance`` calls
the function of the same name here, which goes over every such kind
(``plancache._inventory.artifacts.KINDS``). An artifact is named ``KEY/rank_R_D`` (``KEY``: a
unique prefix of vLLM's key) or by its object name, a cache bundle and a model info by their
object names."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plancache._artifacts import claims, modelinfo, reports
from plancache._artifacts.archive import remove_partial_installs
from plancache._artifacts.manifest import parse_artifact_object_name, parse_cache_name
from plancache._command.display import age, echo, plural, print_table, size, when
from plancache._inventory import artifacts as inventory
from plancache._inventory import parallel
from plancache._inventory.artifacts import ArtifactRecord
from plancache._objects import ObjectLayer
from plancache._signing import NO_KEYS, Keyring, SignatureVerdict
from plancache.errors import PlanStoreError, PlanStoreReadOnlyError

KIND = "compile"
"""The KIND column of an artifact (plans are listed in their own table)."""


_REF = re.compile(r"[0-9a-fA-F]{1,64}/rank_[0-9]{1,6}_[0-9]{1,6}")


def is_ref(text: str) -> bool:
    """True if ``text`` names an artifact (``KEY/rank_R_D`` or an object name) or a model
    info (its object name), not a plan."""
    return (
        bool(_REF.fullmatch(text.strip()))
        or parse_artifact_object_name(text) is not None
        or _by_name(text)
    )


def _by_name(text: str) -> bool:
    """True for the object name of a cache bundle or a model info (named only so)."""
    return parse_cache_name(text.strip()) is not None or modelinfo.is_model_info_object_name(
        text.strip()
    )


def _ref(e: ArtifactRecord) -> str:
    m = e.manifest
    return e.name if m is None else f"{m.key[:12]}/{m.rank}"


def _signed(e: ArtifactRecord, keyring: Keyring) -> str:
    assert e.manifest is not None
    sig = e.manifest.signature
    text = "-" if sig is None else sig.keyid
    if keyring.requires_signature and e.manifest.verdict(keyring) is not SignatureVerdict.VALID:
        text += f" ({e.manifest.verdict(keyring)})"
    return text


def _record_dict(kind: str, e: ArtifactRecord, fields: dict[str, Any]) -> dict[str, Any]:
    """A record as JSON: its kind and name, then ``fields``, its time and signature (or why
    it could not be read)."""
    out: dict[str, Any] = {"kind": kind, "name": e.name}
    if e.manifest is None:
        return {**out, "error": e.error}
    sig = e.manifest.signature
    signature = None if sig is None else sig.to_dict()
    return {**out, **fields, "created_at": e.manifest.created_at, "signature": signature}


def entry_dict(e: ArtifactRecord) -> dict[str, Any]:
    m = e.manifest
    fields = (
        {}
        if m is None
        else {
            "key": m.key,
            "rank": m.rank,
            "bytes": m.total_size,
            "files": len(m.files),
            "labels": dict(m.labels),
            "producer": dict(m.producer),
        }
    )
    return _record_dict(KIND, e, fields)


def bundle_dict(e: ArtifactRecord) -> dict[str, Any]:
    m = e.manifest
    fields = (
        {}
        if m is None
        else {
            "cache": m.kind,
            "scope": m.key,
            "bytes": m.total_size,
            "files": len(m.files),
            "producer": dict(m.producer),
        }
    )
    return _record_dict("cache", e, fields)


def info_dict(e: ArtifactRecord) -> dict[str, Any]:
    i = e.manifest
    fields = (
        {}
        if i is None
        else {"module": i.module, "class": i.cls, "vllm": i.vllm, "source_hash": i.module_hash}
    )
    return _record_dict("model-info", e, fields)


def ls(layer: ObjectLayer, keyring: Keyring, max_bytes: int) -> list[ArtifactRecord]:
    """Print one row per artifact (unreadable ones after, with the reason); the entries."""
    entries = list(inventory.scan(layer, max_bytes))
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
            where = "unreadable here" if e.unreadable else "unreadable"
            echo(f"  {where} compile artifact {e.name}: {e.error}")
    return entries


def ls_bundles(layer: ObjectLayer, keyring: Keyring, max_bytes: int) -> list[ArtifactRecord]:
    """Print one row per cache bundle (unreadable ones after, with the reason); the entries."""
    entries = list(inventory.scan(layer, max_bytes, inventory.CACHES))
    now = time.time()
    rows = [
        [
            e.manifest.kind,
            e.manifest.key[:12],
            size(e.manifest.total_size),
            str(len(e.manifest.files)),
            age(now - e.manifest.created_at),
            str(e.manifest.producer.get("host", "-")),
            _signed(e, keyring),
        ]
        for e in entries
        if e.manifest is not None
    ]
    if rows:
        echo()
        headers = ["CACHE", "SCOPE", "SIZE", "FILES", "AGE", "HOST", "SIGNED"]
        print_table(headers, rows, right={2, 3, 4})
    for e in entries:
        if e.manifest is None:
            where = "unreadable here" if e.unreadable else "unreadable"
            echo(f"  {where} cache bundle {e.name}: {e.error}")
    return entries


def ls_model_info(layer: ObjectLayer, keyring: Keyring) -> list[ArtifactRecord]:
    """Print one row per model info (unreadable ones after, with the reason); the entries."""
    entries = list(inventory.scan(layer, kind=inventory.MODEL_INFO))
    now = time.time()
    rows = [
        [
            "model-info",
            f"{e.manifest.module}.{e.manifest.cls}",
            e.manifest.vllm,
            age(now - e.manifest.created_at),
            _signed(e, keyring),
        ]
        for e in entries
        if e.manifest is not None
    ]
    if rows:
        echo()
        print_table(["KIND", "MODEL CLASS", "VLLM", "AGE", "SIGNED"], rows, right={3})
    for e in entries:
        if e.manifest is None:
            where = "unreadable here" if e.unreadable else "unreadable"
            echo(f"  {where} model info {e.name}: {e.error}")
    return entries


def show(layer: ObjectLayer, ref: str, keyring: Keyring, max_bytes: int) -> int:
    if modelinfo.is_model_info_object_name(ref.strip()):
        return _show_model_info(layer, ref.strip(), keyring)
    bundle = parse_cache_name(ref.strip()) is not None
    [name] = [ref.strip()] if bundle else inventory.resolve(layer, [ref])
    kind = inventory.CACHES if bundle else inventory.ARTIFACTS
    e = inventory.read_entry(layer, name, max_bytes, kind)
    if e is None or e.manifest is None:
        echo(f"{kind.label} {name}: {'gone' if e is None else e.error}")
        return 1
    m = e.manifest
    if bundle:
        echo(f"kind         {m.kind} cache bundle (files of a generated cache)")
        echo(f"scope        {m.key}")
    else:
        echo(f"kind         {KIND} artifact (vLLM AOT)")
        echo(f"key          {m.key}")
        echo(f"rank         {m.rank}")
    echo(f"object       {name} in {layer.url}")
    echo(f"created      {when(m.created_at, time.time())}")
    echo(f"size         {size(m.total_size)} in {plural(len(m.files), 'file')}")
    echo(f"digest       {m.digest}")
    if m.signature is not None or keyring.requires_signature:
        echo(f"signed       {_signed(e, keyring) if m.signature else 'no'}")
    for label, values in (("labels", m.labels), ("producer", m.producer)):
        for k in sorted(values):
            v = values[k]  # the key's factors: hundreds of entries, listed by `ls --json`
            shown = f"({len(v)} entries: `ls --json` lists them)" if isinstance(v, dict) else v
            echo(f"{label:12s} {k}={shown}")
    print_table(
        ["  PATH", "SIZE", "MODE", "SHA256"],
        [[f"  {f.path}", str(f.size), oct(f.mode), f.sha256[:16]] for f in m.files],
        right={1},
    )
    return 0


def _show_model_info(layer: ObjectLayer, name: str, keyring: Keyring) -> int:
    e = inventory.read_entry(layer, name, kind=inventory.MODEL_INFO)
    if e is None or e.manifest is None:
        echo(f"model info {name}: {'gone' if e is None else e.error}")
        return 1
    info = e.manifest
    echo("kind         model info (vLLM's modelinfos/ file)")
    echo(f"class        {info.module}.{info.cls}")
    echo(f"vllm         {info.vllm}")
    echo(f"source hash  {info.module_hash}")
    echo(f"object       {name} in {layer.url}")
    echo(f"created      {when(info.created_at, time.time())}")
    echo(f"signed       {_signed(e, keyring)}")
    for key, value in sorted(info.file.get("modelinfo", {}).items()):
        echo(f"modelinfo    {key}={value}")
    return 0


def verify(
    layer: ObjectLayer, keyring: Keyring, max_bytes: int, *, fix: bool, require_signature: bool
) -> tuple[int, int]:
    """Read every byte of every object of every code kind; print each finding, and a summary
    per kind. With ``fix``, delete what is provably corrupt (or, with ``require_signature``,
    unsigned), only as the version judged; what is unreadable here is kept. (findings,
    findings a refusing store kept)."""
    bad = refused = 0
    for kind in inventory.KINDS:
        found, kept = _verify(layer, kind, keyring, max_bytes, fix, require_signature)
        bad, refused = bad + found, refused + kept
    return bad, refused


def _verify(
    layer: ObjectLayer,
    kind: inventory.CodeKind,
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
        every = ", every byte" if kind is inventory.ARTIFACTS else ""
        echo(f"{plural(len(names), kind.label)} checked{every}: {bad} failed")
    return bad, refused


def rm(layer: ObjectLayer, refs: list[str]) -> None:
    infos = [r.strip() for r in refs if _by_name(r)]
    others = [r for r in refs if not _by_name(r)]
    for name in [*inventory.resolve(layer, others), *dict.fromkeys(infos)]:
        echo(f"deleted {name}" if layer.delete_object(name) else f"already gone {name}")


def prune(
    layer: ObjectLayer,
    older_than: float,
    max_bytes: int,
    *,
    dry_run: bool,
    installs: Path | None = None,
    roots: Sequence[Path] = (),
) -> None:
    """Delete (or list) the artifacts older than ``older_than`` seconds, and report those
    kept; with ``installs`` (this node's vLLM compile cache) and ``roots`` (its generated
    caches: Triton's), also the temp directories of installs killed that long ago, in every
    directory they install into; silent if there is nothing."""
    verb = "would delete" if dry_run else "deleted"
    if installs is not None:
        keys = sorted(installs.iterdir()) if installs.is_dir() else []
        for where, dirs in ((installs, keys), *((root, [root]) for root in roots)):
            stale = sum(remove_partial_installs(d, older_than, dry_run=dry_run) for d in dirs)
            if stale:
                echo(f"{verb} {plural(stale, 'partial install')} of killed boots in {where}")
    for kind in inventory.KINDS:
        result = inventory.prune(layer, older_than, dry_run=dry_run, max_bytes=max_bytes, kind=kind)
        for name in result.deleted:
            echo(f"{verb} {name}")
        for name, why in result.kept:
            echo(f"{name}  {why}")
        if result.deleted:
            echo(f"{verb} {plural(len(result.deleted), kind.label)} older than {age(older_than)}")
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
    for kind in inventory.KINDS:
        if kind is inventory.REPORTS:
            continue  # a store's reports are those of the boots that wrote to it
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


def reports_read(layer: ObjectLayer, keyring: Keyring) -> dict[str, Any]:
    """The boot reports ``stats`` shows (``reports.read_newest``)."""
    return reports.read_newest(layer, keyring, parallel)


def stats(layer: ObjectLayer, max_bytes: int, keyring: Keyring = NO_KEYS) -> dict[str, Any]:
    entries = [e for e in inventory.scan(layer, max_bytes) if e.manifest is not None]
    stamps = [e.manifest.created_at for e in entries if e.manifest is not None]
    bundles = [e for e in inventory.scan(layer, max_bytes, inventory.CACHES) if e.manifest]
    return {
        "artifacts": len(entries),
        "artifact_bytes": sum(e.manifest.total_size for e in entries if e.manifest is not None),
        "artifacts_oldest": min(stamps, default=None),
        "artifacts_newest": max(stamps, default=None),
        "cache_bundles": len(bundles),
        "cache_bundle_bytes": sum(e.manifest.total_size for e in bundles if e.manifest),
        "model_infos": len(inventory.names(layer, inventory.MODEL_INFO)),
        "boot_reports": reports_read(layer, keyring),
    }
