"""What a store holds, over any store: list, resolve, verify, stats, copy and prune (glue).

Every function reads the store it is given, as it is, and reports in plain values; none
prints. Store failures raise ``PlanStoreError``, but one record the store does not hand
over is an entry unreadable here (kept), never a failure; a prefix that names no plan, or more than
one, raises ``ValueError``. Records of another schema version are reported, never judged
by the format's rules, overwritten or deleted, except where the store's keys reject their
signature. Reads and writes run on a few threads (store I/O is latency bound).

Signatures are judged with the store's keyring (``PlanStore.keyring``): where it holds keys,
a record without a valid signature from an accepted key is *rejected* (``PlanRecord.rejected``):
listed, reported by ``verify(require_signature=True)``, and never copied or pruned (a
signing store would sign what no accepted key vouched for). A record of another schema is
judged by the rule every schema keeps (``Keyring.check_foreign``); one that is rejected is
reported and deleted by ``verify(require_signature=True, fix=True)`` like any other.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from plancache._breaker import Breaker
from plancache._inventory import UNREADABLE_HERE, parallel
from plancache._inventory import prunable as prunable
from plancache._keys import is_key_prefix
from plancache._observation import Observation, Tombstone
from plancache._plan import DEVICE_FACTOR, MODEL_LABEL, Plan
from plancache._reasons import Reason
from plancache._store import PlanStore, PutOutcome
from plancache.errors import (
    InvalidPlanError,
    InvalidSignatureError,
    PlanStoreError,
    PlanStoreReadOnlyError,
    UnsupportedSchemaError,
)


@dataclass(frozen=True)
class PlanRecord:
    """One stored record as read: the plan, or why the record is invalid."""

    fingerprint: str
    raw: bytes
    plan: Plan | None
    error: str | None = None
    other_schema: bool = False
    """A record of another schema version: not this version's to judge or delete, unless
    the store's keys reject it."""
    rejected: str | None = None
    """Why the store's keys reject the record's signature (a plan's, or another schema's
    record's); None when they accept it or the store holds no keys."""
    unreadable: bool = False
    """A record the store did not hand over (a GLACIER object's 403): never judged, kept."""

    @property
    def invalid(self) -> bool:
        """True for a record this version judges invalid (never one of another schema, nor
        one the store did not hand over)."""
        return self.plan is None and not self.other_schema and not self.unreadable

    @property
    def problem(self) -> str | None:
        """Why the record is not used: its format error, or ``invalid:signature: ...``."""
        if self.rejected is not None:
            return f"{Reason.INVALID_SIGNATURE}: {self.rejected}"
        return self.error


def device(plan: Plan) -> str:
    """The device ``plan`` was recorded on (its ``DEVICE_FACTOR``), or ``-`` if its factors
    do not say."""
    value = plan.factors.get(DEVICE_FACTOR)
    return "-" if value is None else str(value)


def model(plan: Plan) -> str:
    """The model the plan is for, from its ``MODEL_LABEL`` (``-`` if unlabelled)."""
    return str(plan.labels.get(MODEL_LABEL, "-"))


def read_entry(store: PlanStore, fp: str) -> PlanRecord | None:
    """The record under ``fp``, checked against every rule of the format and judged by the
    store's keys; None if absent. An entry that is no record at all (a local FIFO, directory
    or symbolic link named like a plan, never opened) is an invalid entry without bytes; one
    the store does not hand over (a GLACIER object's 403) is unreadable here, kept (the rule
    of ``plancache._reader``)."""
    try:
        raw = store.read_raw(fp)
    except InvalidPlanError as exc:
        return PlanRecord(fp, b"", None, str(exc))
    except PlanStoreError as exc:
        return PlanRecord(fp, b"", None, f"{UNREADABLE_HERE} ({exc})", unreadable=True)
    return None if raw is None else judge(store, fp, raw)


def judge(store: PlanStore, fp: str, raw: bytes) -> PlanRecord:
    """The record ``raw`` stored under ``fp``, checked against every rule of the format and
    judged by the store's keys."""
    try:
        plan = Plan.decode(raw, expected_fingerprint=fp)
    except UnsupportedSchemaError as exc:
        try:
            store.keyring.check_foreign(raw)
        except InvalidSignatureError as why:
            return PlanRecord(fp, raw, None, str(exc), True, rejected=f"{why} ({exc})")
        return PlanRecord(fp, raw, None, str(exc), True)
    except InvalidPlanError as exc:
        return PlanRecord(fp, raw, None, str(exc))
    try:
        store.keyring.check(plan)
    except InvalidSignatureError as exc:
        return PlanRecord(fp, raw, plan, rejected=str(exc))
    return PlanRecord(fp, raw, plan)


def scan(store: PlanStore) -> list[PlanRecord]:
    """Every record in ``store``, in fingerprint order (those deleted meanwhile left out)."""
    fps = sorted(store.iter_fingerprints())
    return [e for e in parallel(lambda fp: read_entry(store, fp), fps) if e is not None]


def resolve(store: PlanStore, prefixes: Sequence[str]) -> list[str]:
    """The stored fingerprints that ``prefixes`` (any case) name, each uniquely, without
    repeats; else ``ValueError`` naming the first prefix that is malformed, matches no
    plan or matches several. Every prefix is checked before any is returned."""
    wanted = [p.strip().lower() for p in prefixes]
    for prefix in wanted:
        if not is_key_prefix(prefix):
            raise ValueError(f"not a fingerprint or a prefix of one (hex digits): {prefix!r:.80}")
    known = sorted(store.iter_fingerprints())
    found: list[str] = []
    for prefix in wanted:
        matches = [fp for fp in known if fp.startswith(prefix)]
        if not matches:
            raise ValueError(f"no plan matches {prefix!r} in {store.url}")
        if len(matches) > 1:
            shown = ", ".join(m[:12] for m in matches[:4])
            raise ValueError(
                f"{prefix!r} is ambiguous in {store.url}: it matches {len(matches)} plans "
                f"({shown}{', ...' if len(matches) > 4 else ''}); give more digits"
            )
        found.append(matches[0])
    return list(dict.fromkeys(found))


def remove(store: PlanStore, prefixes: Sequence[str]) -> list[tuple[str, bool]]:
    """Delete the plans ``prefixes`` name (all resolved first, see ``resolve``); each
    fingerprint with True if it was deleted, False if it was already gone."""
    return [(fp, store.delete(fp)) for fp in resolve(store, prefixes)]


class Fix(enum.StrEnum):
    """What ``verify(fix=True)`` did with an invalid record."""

    DELETED = "deleted"
    NOW_VALID = "now valid, kept"
    """A writer replaced it with a valid record since the scan."""
    REFUSED = "not deleted"
    """The store refuses writes (read-only, or not found to honour conditional writes):
    ``Finding.detail`` says why."""


@dataclass(frozen=True)
class Finding:
    """An invalid (or rejected) record, and what fixing did with it (None without ``fix``)."""

    entry: PlanRecord
    fix: Fix | None = None
    detail: str | None = None
    """Why the fix was refused (``Fix.REFUSED``)."""


@dataclass(frozen=True)
class Verification:
    """The outcome of ``verify``."""

    checked: int
    """Records read, other schemas included."""
    findings: list[Finding]
    """This version's invalid records (and rejected ones, where signatures are required), in
    fingerprint order."""
    other_schema: list[PlanRecord]
    """Records of another schema version that are not findings: reported, kept."""

    @property
    def deleted(self) -> int:
        return sum(f.fix is Fix.DELETED for f in self.findings)


def verify(store: PlanStore, *, fix: bool = False, require_signature: bool = False) -> Verification:
    """Check every record against the format's rules, and with ``require_signature`` its
    signature against the store's keys (``ValueError`` if it holds none); with ``fix``,
    delete the records found, each re-read, judged again and deleted only as judged
    (``PlanStore.delete_if``), so that a good record written since is kept. An entry that is
    no file at all (a local FIFO, directory or link named like a plan) is removed as found."""
    if require_signature and not store.keyring.requires_signature:
        raise ValueError("requiring signatures needs keys (PLANCACHE_SIGNING_KEY, ...)")

    def bad(e: PlanRecord) -> bool:
        return e.invalid or (require_signature and e.rejected is not None)

    def doomed(fp: str, raw: bytes) -> bool:
        return bad(judge(store, fp, raw))

    entries = scan(store)
    findings = []
    for e in filter(bad, entries):
        outcome = None
        detail = None
        if fix:
            fp = e.fingerprint
            try:
                try:
                    gone = store.delete_if(fp, functools.partial(doomed, fp))
                except InvalidPlanError:  # no file at all: nothing a writer wrote
                    store.delete(fp)
                    gone = True
                outcome = Fix.DELETED if gone else Fix.NOW_VALID
            except PlanStoreReadOnlyError as exc:  # the rest is still reported
                outcome, detail = Fix.REFUSED, str(exc)
        findings.append(Finding(e, outcome, detail))
    kept = [e for e in entries if e.other_schema and not bad(e)]
    return Verification(len(entries), findings, kept)


@dataclass(frozen=True)
class Stats:
    """A store at a glance; ``oldest``/``newest`` are creation times (None without plans)."""

    url: str
    plans: int
    invalid: int
    bytes: int
    oldest: float | None
    newest: float | None
    devices: dict[str, int]
    """Plans per device, most first."""


def stats(store: PlanStore) -> Stats:
    """Counts, bytes (all records), oldest and newest plan and the devices seen."""
    entries = scan(store)
    plans = [e.plan for e in entries if e.plan is not None]
    created = [p.created_at for p in plans]
    return Stats(
        url=store.url,
        plans=len(plans),
        invalid=len(entries) - len(plans),
        bytes=sum(len(e.raw) for e in entries),
        oldest=min(created, default=None),
        newest=max(created, default=None),
        devices=dict(Counter(device(p) for p in plans).most_common()),
    )


@dataclass(frozen=True)
class CopyCounts:
    """How each record of the source fared in ``copy``."""

    created: int = 0
    replaced: int = 0
    kept: int = 0
    """The destination's record already holds everything the source's adds (the merge
    changes nothing), or it is one ``put`` never replaces (another schema's, or signed
    where the destination cannot sign)."""
    invalid: int = 0
    """Invalid records (or of another schema) in the source, skipped."""
    rejected: int = 0
    """Records whose signature the keys reject, skipped."""
    vanished: int = 0
    """Deleted from the source between listing and reading."""


def copy(
    src: PlanStore, dst: PlanStore, *, progress: Callable[[int, int], None] | None = None
) -> CopyCounts:
    """Put every valid plan of ``src`` that ``src``'s keys do not reject into ``dst`` with
    merge semantics (``dst.put``: a signed record keeps its signature where ``dst`` cannot
    sign); ``progress(done, total)`` is called after each record."""

    def copy_one(fp: str) -> str:
        entry = read_entry(src, fp)
        if entry is None:
            return "vanished"
        if entry.plan is None:
            return "invalid"
        if entry.rejected is not None:
            return "rejected"
        return dst.put(entry.plan).value

    counts = Counter(parallel(copy_one, sorted(src.iter_fingerprints()), progress))
    return CopyCounts(
        created=counts[PutOutcome.CREATED.value],
        replaced=counts[PutOutcome.REPLACED.value],
        kept=counts[PutOutcome.KEPT.value],
        invalid=counts["invalid"],
        rejected=counts["rejected"],
        vanished=counts["vanished"],
    )


@dataclass(frozen=True)
class Pruning:
    """The outcome of ``prune``."""

    plans: list[Plan]
    """Records that lost observations (or, in a dry run, would), as they were, in
    fingerprint order."""
    observations: int
    """Observations dropped (or that would be)."""
    ahead: int
    """Of those, the ones dated more than ``older_than`` after the time of pruning."""
    deleted: int
    """Records deleted because none of their observations was left (or that would be)."""
    temp_files: int | None
    """Abandoned temp files removed (or that would be); None for stores other than local."""
    marks: int | None
    """Crash marks and crash records (``plancache._breaker``) older than ``older_than``
    removed (or that would be); None for stores other than local."""
    invalid: int
    """Records that are no plan of this version (invalid, or of another schema), left in
    place; ``verify(fix=True)`` deletes the invalid ones."""
    rejected: int = 0
    """Records whose signature the store's keys reject, left in place."""


def prune(
    store: PlanStore, older_than: float, *, dry_run: bool = False, now: float | None = None
) -> Pruning:
    """Drop the observations created more than ``older_than`` seconds before ``now``
    (default: the current time), or dated more than that after it (``prunable``), through
    the store's compare-and-swap (``rewrite``), so that observations written since are kept,
    and the tombstones of observations so dated (a copy of one is pruned anyway); a record is
    deleted only when none of its observations and tombstones is left. On a local store,
    also the temp files killed writers left, and the crash marks older than ``older_than``.
    Records the store's keys reject are left as they are."""
    at = time.time() if now is None else now

    def fresh(o: Observation) -> bool:
        return not prunable(o.created_at, older_than, at)

    def recent(t: Tombstone) -> bool:  # a copy of its observation is pruned anyway
        return not prunable(t.created_at, older_than, at)

    entries = scan(store)
    pruned: list[Plan] = []
    dropped = ahead = deleted = 0
    for e in entries:
        if (
            e.plan is None
            or e.rejected is not None
            or (
                all(map(fresh, (*e.plan.observations, *e.plan.provisional)))
                and all(map(recent, e.plan.retracted))
            )
        ):
            continue
        pruned.append(e.plan)
        points = (*e.plan.observations, *e.plan.provisional)
        dropped += sum(not fresh(o) for o in points)
        ahead += sum(o.created_at - at > older_than for o in points)
        if dry_run:
            deleted += e.plan.keeping(fresh, recent) is None
            continue
        with contextlib.suppress(InvalidPlanError):  # turned invalid since: verify's job
            deleted += store.rewrite(e.fingerprint, lambda p: p.keeping(fresh, recent)) is None
    marks = None
    temps = store.layer.remove_stale_temp_files(dry_run=dry_run)
    breaker = Breaker.beside(store)
    if breaker is not None:
        marks = breaker.clean(older_than, dry_run=dry_run)
    invalid = sum(e.plan is None for e in entries)
    rejected = sum(e.plan is not None and e.rejected is not None for e in entries)
    return Pruning(pruned, dropped, ahead, deleted, temps, marks, invalid, rejected)


def entry_dict(entry: PlanRecord, now: float | None = None) -> dict[str, Any]:
    """``entry`` as a JSON-ready dict: the plan's fields, or the reason it is invalid. A
    plan's ``observations`` are its points as stored, ``provisional`` its second frontier
    (``Plan.provisional``); ``max_kv_cache_memory_bytes`` and
    ``min_free_memory_baseline`` are the extremes of the frontier (two observations'), and
    ``created_at``, ``age_seconds`` and ``producer`` are the newest observation's."""
    if entry.plan is None:
        return {
            "fingerprint": entry.fingerprint,
            "valid": False,
            "error": entry.error,
            "bytes": len(entry.raw),
        }
    p = entry.plan
    return {
        "fingerprint": p.fingerprint,
        "valid": True,
        "device": device(p),
        "model": model(p),
        "observations": [o.to_dict() for o in p.observations],
        "provisional": [o.to_dict() for o in p.provisional],
        "max_kv_cache_memory_bytes": p.max_kv_cache_memory_bytes,
        "min_free_memory_baseline": p.min_free_memory_baseline,
        "created_at": p.created_at,
        "age_seconds": (time.time() if now is None else now) - p.created_at,
        "producer": {} if p.newest is None else dict(p.newest.producer),
        "labels": dict(p.labels),
        "signed_by": None if p.signature is None else p.signature.keyid,
        "signature_error": entry.rejected,
        "bytes": len(entry.raw),
    }
