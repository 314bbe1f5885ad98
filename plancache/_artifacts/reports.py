"""The boot-report kind: what one process's boot decided per kind and built anyway after
installing shared state, so that ``plancache stats`` shows installs and rebuilds across the
fleet (each process only knows its own: ``plancache._metrics.tally``).

A kind on the object layer, written through the engine (``engine``), decoded on every read;
it decides nothing on any node: only ``stats`` reads it.

- name: ``boot_report_<created, epoch seconds, 10 digits>_<16 hex of its payload's
  sha256>.json`` (``report_object_name``): one per process boot (a random boot id is in
  it), in time order by name;
- encoding: an envelope (format, ``created_at``, ``producer``, ``decisions``: {kind:
  {result: count}}, ``rebuilt``: {kind: count}, boot id, signature), at most ``MAX_BYTES``,
  at most ``MAX_ENTRIES`` kinds and results of a kind, every name ``_NAME`` matches,
  every count in 0..2**31; checked on every decode (``Report.decode``);
- policy: written once per boot, create-if-absent, to every destination (the store unless
  it refuses writes, then the local tier: ``Engine.write_small``), signed where this node
  can sign; read by ``stats`` only (``BOOT_REPORTS.stats``: ``read_newest``), each through
  the bounded reader (``reader``): newest first by name, those dated past the clock-skew
  bound left out, until ``MAX_READ`` were accepted (with a keyring that requires
  signatures, only validly signed ones, refused on their bytes), unreadable ones skipped
  and counted; summed per kind (``summarize``); deleted by ``prune`` past its age, like
  every kind.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from plancache import _reader as reader
from plancache._artifacts.engine import Engine
from plancache._artifacts.kind import Reader, envelope_kind
from plancache._artifacts.manifest import (
    Envelope,
    Readable,
    decode_versioned,
    parse_signature,
    read_bounded,
)
from plancache._artifacts.trust import signature_refusal
from plancache._command.display import plural
from plancache._plan import Signature
from plancache._signing import NO_KEYS, Keyring
from plancache.errors import ArtifactError

FORMAT = 1
NAME_PREFIX = "boot_report_"
MAX_BYTES = 16 * 1024
MAX_ENTRIES = 64
"""Most kinds a report holds, and results of one kind (``_metrics.MAX_TALLIED``)."""
MAX_COUNT = 2**31
MAX_PRODUCER_BYTES = 1024
MAX_READ = 1000
"""Most reports ``stats`` reads: the newest by name."""
REBUILT = "rebuilt"

_NAME = re.compile(r"[a-z][a-z0-9_:.+-]{0,63}")
_OBJECT = re.compile(rf"{NAME_PREFIX}[0-9]{{10}}_[0-9a-f]{{16}}\.json")


def is_report_object_name(name: str) -> bool:
    """True if ``name`` is a boot report's object name."""
    return bool(_OBJECT.fullmatch(name))


def dated(name: str) -> float:
    """The creation time a report's object name carries (epoch seconds)."""
    return float(name[len(NAME_PREFIX) : len(NAME_PREFIX) + 10])


def _mapping(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise ArtifactError(f"a boot report's {what} is an object of at most {MAX_ENTRIES}")
    for name in value:
        if not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ArtifactError(f"a boot report's {what} holds a malformed name {name!r:.40}")
    return dict(value)


def _counts(value: object, what: str) -> dict[str, int]:
    out = _mapping(value, what)
    for name, n in out.items():
        if type(n) is not int or not 0 <= n <= MAX_COUNT:
            raise ArtifactError(f"a boot report's {what}[{name}] is not a count")
    return out


@dataclass(frozen=True)
class Report(Envelope):
    """What one process's boot decided (``decisions``: {kind: {result: count}}) and built
    anyway after installing shared state (``rebuilt``: {kind: count}). Construction
    validates (``ArtifactError``)."""

    created_at: float
    producer: Mapping[str, Any]
    decisions: Mapping[str, Mapping[str, int]]
    rebuilt: Mapping[str, int]
    boot: str
    signature: Signature | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.boot, str) and re.fullmatch(r"[0-9a-f]{32}", self.boot)):
            raise ArtifactError("a boot report's boot id is 32 hex digits")
        if not 0 <= self.created_at < 1e10:
            raise ArtifactError("a boot report's created_at is a time before year 2286")
        if (
            not isinstance(self.producer, dict)
            or len(orjson.dumps(self.producer)) > MAX_PRODUCER_BYTES
        ):
            raise ArtifactError(
                f"a boot report's producer is an object of at most {MAX_PRODUCER_BYTES} bytes"
            )
        decisions = {
            kind: _counts(results, f"decisions[{kind}]")
            for kind, results in _mapping(self.decisions, "decisions").items()
        }
        object.__setattr__(self, "decisions", decisions)
        object.__setattr__(self, "rebuilt", _counts(self.rebuilt, "rebuilt"))

    @property
    def name(self) -> str:
        digest = hashlib.sha256(self.payload()).hexdigest()[:16]
        return f"{NAME_PREFIX}{int(self.created_at):010d}_{digest}.json"

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "created_at": self.created_at,
            "producer": dict(self.producer),
            "decisions": {k: dict(v) for k, v in self.decisions.items()},
            "rebuilt": dict(self.rebuilt),
            "boot": self.boot,
        }

    @classmethod
    def decode(cls, data: bytes, keyring: Keyring = NO_KEYS) -> Report:
        """Parse and check a report; ``ArtifactError`` (``UnreadableHereError`` for a newer
        format; where ``keyring`` requires signatures, ``Unvouched`` for one no accepted key
        signed, judged on its bytes first)."""
        obj = decode_versioned(
            data, "boot report", MAX_BYTES, FORMAT, error=ArtifactError, keyring=keyring
        )
        created = obj.get("created_at")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ArtifactError("a boot report's created_at is a number")
        signature = parse_signature(obj, "boot report", ArtifactError)
        producer, decisions, rebuilt, boot = (
            obj.get(k) for k in ("producer", "decisions", "rebuilt", "boot")
        )
        return cls(float(created), producer, decisions, rebuilt, boot, signature)  # type: ignore[arg-type]


def read(stream: Readable, keyring: Keyring = NO_KEYS) -> Report:
    """The report ``stream`` holds (at most ``MAX_BYTES`` + 1 bytes read), decoded:
    ``ArtifactError`` for anything else (see ``Report.decode``)."""
    return Report.decode(read_bounded(stream, MAX_BYTES), keyring)


def read_newest(names: Sequence[str], heads: Reader, keyring: Keyring) -> dict[str, Any]:
    """What ``stats`` shows of the reports ``names`` (in name order) that ``heads`` reads:
    ``stored`` (listed), ``future`` (dated past the clock-skew bound: left out),
    ``unreadable`` (not handed over, or unreadable here: skipped), ``read`` (accepted:
    valid, named as stored, and where ``keyring`` requires signatures validly signed,
    refused on their bytes; the newest ``MAX_READ`` of them, read newest first in batches,
    ``reader.accepted``) and their sums per kind (``summarize``)."""
    ordered, future = reader.newest(names, dated)

    def accepted(name: str) -> Report | None:
        report = heads.one(name, lambda stream, max_bytes: read(stream, keyring))
        return None if report is None or signature_refusal(keyring, report.verdict) else report

    got = reader.accepted(ordered, MAX_READ, accepted, heads.many)
    return {
        "stored": len(names),
        "read": len(got),
        "future": future,
        "unreadable": len(heads.unreadable),
        "kinds": summarize(got),
    }


def made(
    tally: Mapping[str, Mapping[str, int]], producer: Mapping[str, Any], keyring: Keyring
) -> Report:
    """This boot's report of ``tally`` (``_metrics.tally``: {kind: {result or "rebuilt":
    count}}), signed where ``keyring`` can sign; kinds or results past the bounds (their
    number, half of ``MAX_BYTES`` for the decisions) are left out."""
    decisions: dict[str, dict[str, int]] = {}
    rebuilt: dict[str, int] = {}
    for kind, counts in list(tally.items())[:MAX_ENTRIES]:
        if not _NAME.fullmatch(kind):
            continue
        if counts.get(REBUILT):
            rebuilt[kind] = min(counts[REBUILT], MAX_COUNT)
        kept = {
            r: min(n, MAX_COUNT) for r, n in counts.items() if r != REBUILT and _NAME.fullmatch(r)
        }
        if kept:
            decisions[kind] = dict(list(kept.items())[:MAX_ENTRIES])
    while decisions and len(orjson.dumps(decisions)) > MAX_BYTES // 2:
        decisions.popitem()
    report = Report(time.time(), dict(producer), decisions, rebuilt, secrets.token_hex(16))
    return report.signed_with(keyring)


def summarize(reports: Iterable[Report]) -> dict[str, dict[str, Any]]:
    """Per kind (sorted): ``boots``, ``results`` {result: count}, ``rebuilt``,
    ``boots_rebuilt``."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for kind in set(report.decisions) | set(report.rebuilt):
            row = out.setdefault(kind, {"boots": 0, "results": {}, REBUILT: 0, "boots_rebuilt": 0})
            row["boots"] += 1
            for result, n in report.decisions.get(kind, {}).items():
                row["results"][result] = row["results"].get(result, 0) + n
            row[REBUILT] += report.rebuilt.get(kind, 0)
            row["boots_rebuilt"] += bool(report.rebuilt.get(kind, 0))
    return dict(sorted(out.items()))


class ReportKind:
    """The kind's operations on ``engine``'s stores (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def upload_report(self, report: Report) -> dict[str, bool]:
        """Store ``report`` create-if-absent on every destination; {destination: created}.
        Never raises."""
        return self.engine.write_small("boot_report", "boot report", report.name, report.encode())


def _stats(names: Sequence[str], heads: Reader, keyring: Keyring) -> dict[str, Any]:
    return {"boot_reports": read_newest(names, heads, keyring)}


def _stats_text(stats: dict[str, Any]) -> list[str]:
    booted = stats["boot_reports"]
    lines = []
    if booted["stored"]:
        skipped = [
            f"{booted['unreadable']} unreadable, skipped" if booted["unreadable"] else "",
            f"{booted['future']} dated ahead of this clock, left out" if booted["future"] else "",
        ]
        extra = "".join(f"; {s}" for s in skipped if s)
        lines.append(
            f"boots    {booted['read']} reported (the newest of {booted['stored']} stored{extra})"
        )
    width = max(map(len, booted["kinds"]), default=0)
    for kind, row in booted["kinds"].items():
        results = ", ".join(f"{r} {n}" for r, n in sorted(row["results"].items()))
        rebuilt = f"rebuilt {row[REBUILT]} on {plural(row['boots_rebuilt'], 'boot')}"
        lines.append(
            f"  {kind.ljust(width)}  {plural(row['boots'], 'boot')}: {results or '-'}; {rebuilt}"
        )
    return lines


BOOT_REPORTS = envelope_kind(
    "boot-report",
    "boot report",
    NAME_PREFIX,
    read,
    "its envelope is not the report its name says",
    named=is_report_object_name,
    stats=_stats,
    stats_text=_stats_text,
    copied=False,  # a store's reports are those of the boots that wrote to it
)
"""The kind as the inventory and the commands see it (``plancache._artifacts.kind``): read
by ``stats`` only, neither listed nor copied."""
