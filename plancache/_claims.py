"""Claims: at most one node of a fleet does one thing at a time (uploads an object, probes a
store).

A claim is the object ``<name>.claim`` on the same object layer, holding its holder and its
expiry; it is created if absent, or taken over once expired by a compare-and-swap on the
version read, and released by a delete of that version. Guarantees: two nodes never both
hold a live claim on one name (where the store honours conditional writes); a node that dies
while holding one blocks the others only until its claim expires (``CLAIM_BASE_S``, or the
``base_s`` its user gives, plus the object's size at ``CLAIM_BYTES_PER_S``). The upload of
an object claims its name (``plancache._artifacts.engine``); the conformance probe claims
the shared verdict's (``plancache._backends.guarded``).
Claims are unsigned: one dated later than any node of the fleet could claim from now
(``believable``) is taken as expired, so that whoever may write the bucket can block an
upload for at most one claim's length, never for a year; ``stale`` lists the claims a
``prune`` removes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from plancache._defaults import CLAIM_BASE_S, CLAIM_BYTES_PER_S, CLOCK_SKEW_S
from plancache._objects import ObjectLayer, Update
from plancache.errors import PlanStoreError

CLAIM_SUFFIX = ".claim"
CLAIM_LIMIT = 4096
"""A claim is read up to this many bytes."""
CLAIM_CALLS = 4
"""Most store calls of one ``claim``: a create and a read, or a take-over and a read."""


def longest(size: int, base_s: float = CLAIM_BASE_S) -> float:
    """Seconds a claim on an object of ``size`` bytes lasts (``base_s`` for no bytes)."""
    return base_s + size / CLAIM_BYTES_PER_S


def believable(until: float, now: float, size: int, base_s: float = CLAIM_BASE_S) -> bool:
    """Whether a claim lasting to ``until`` could have been written by a node claiming an
    object of up to twice ``size`` bytes, with its clock up to ``CLOCK_SKEW_S`` ahead."""
    return until <= now + longest(2 * size, base_s) + CLOCK_SKEW_S


def _until(data: bytes) -> float:
    """A claim's expiry; 0 for bytes that are not a claim this reads (expired)."""
    try:
        return float(orjson.loads(data)["until"])
    except (ValueError, KeyError, TypeError):
        return 0.0


def claim(
    layer: ObjectLayer,
    name: str,
    size: int,
    now: float | None = None,
    *,
    base_s: float = CLAIM_BASE_S,
) -> object | None:
    """Claim ``name`` on ``layer`` (its upload, of ``size`` bytes; ``base_s``: how long
    without bytes): the object ``<name>.claim`` created, or taken over once expired
    (compare-and-swap on the version read), holding its expiry; at most four calls. The
    claim's version, or None where another node holds a live claim. A node that dies while
    holding it blocks the others only until its claim expires. Raises the store's errors."""
    now = time.time() if now is None else now
    body = orjson.dumps(
        {"host": socket.gethostname(), "pid": os.getpid(), "until": now + longest(size, base_s)}
    )
    claimed = name + CLAIM_SUFFIX
    for _ in range(2):  # create; else take over an expired claim (once)
        if layer.write_object(claimed, [body]):
            found = layer.read_object(claimed, CLAIM_LIMIT)
            return None if found is None or found[0] != body else found[1]
        found = layer.read_object(claimed, CLAIM_LIMIT)
        if found is None:
            continue  # released meanwhile: try to create it again
        until = _until(found[0])
        if now < until and believable(until, now, size, base_s):
            return None
        if layer.write_object(claimed, [body], Update(found[1])):
            taken = layer.read_object(claimed, CLAIM_LIMIT)
            return None if taken is None or taken[0] != body else taken[1]
        return None
    return None


def release(layer: ObjectLayer, name: str, held: object) -> None:
    """Release the claim on ``name`` that ``claim`` returned (``held``: its version): a
    delete of that version only, so a claim another node took over stays. Never raises (a
    claim not released expires on its own)."""
    with contextlib.suppress(Exception):
        layer.delete_object(name + CLAIM_SUFFIX, held)


@dataclass(frozen=True)
class Claim:
    """A claim as stored: its object's name, its version, holder (host) and expiry."""

    name: str
    version: object
    host: str
    until: float

    def stale(self, now: float, max_bytes: int) -> bool:
        """Expired, or dated later than a claim on an object of ``max_bytes`` could be."""
        return self.until <= now or not believable(self.until, now, max_bytes // 2)


def claims(layer: ObjectLayer, limit: int = 10_000) -> Iterator[Claim]:
    """The claims ``layer`` holds (at most ``limit``), as stored; unreadable ones are
    skipped."""
    names = (n for n in layer.list_objects("") if n.endswith(CLAIM_SUFFIX))
    for name in itertools.islice(names, limit):
        try:
            found = layer.read_object(name, CLAIM_LIMIT)
        except PlanStoreError:
            continue
        if found is None:
            continue
        try:
            host = str(orjson.loads(found[0]).get("host", ""))[:64]
        except (ValueError, AttributeError):
            host = ""
        yield Claim(name, found[1], host, _until(found[0]))
