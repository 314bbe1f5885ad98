"""The one bounded reader of the objects every kind reads from a store, plans included:
reading one whole (``read``: a plan record) or as a stream (``opened``), choosing "the newest
N", and reading until N were accepted. Parsing is each kind's decoder, bounded in its turn
(``Plan.decode`` on at most ``READ_LIMIT`` bytes; ``manifest.decode_versioned``: the
signature on the bytes before any structure; ``Manifest.decode``: every limit while parsing).

Guarantees:

- one object never fails a command or a boot: an object the store will not hand over (a
  403, such as a GLACIER object's; a race with a delete; a directory, FIFO or link under
  its name in a local store; a read that fails midway) is ``Unreadable``: skipped and
  counted by the caller, named once per process in a WARNING, escaped
  (``_redaction.printable``), never judged corrupt (an ``UnreadableHereError``: kept). A
  plan record read whole (``read``) is named once the same way and raises what the store
  raised (a ``PlanStoreError``, which every reader of plans already skips: a lookup misses
  with ``store-error``, the local tier's is passed over for the remote, the inventory keeps
  it as unreadable here); what a store of plans holds under a plan's name that is no object
  (a local FIFO, directory or link) stays an invalid record (``InvalidPlanError``: replaced
  by the next write, deleted by ``verify --fix``), as it always was for plans;
- dates: an object dated more than ``CLOCK_SKEW_S`` after this node's clock takes no one's
  place among the newest (``newest``): a planted year-2286 name hides nothing;
- where the keys require signatures, an object counts toward "the newest N" only once its
  signature was checked (``accepted``): unsigned objects, however many and however new,
  take no place either.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from plancache._defaults import CLOCK_SKEW_S
from plancache._objects import ObjectLayer, Opened
from plancache._redaction import printable
from plancache.errors import (
    InvalidPlanError,
    PlanStoreError,
    PlanStorePermissionError,
    UnreadableHereError,
)

log = logging.getLogger("plancache")
T = TypeVar("T")

Many = Callable[[Callable[[str], T], Sequence[str]], list[T]]
"""How a batch is read: ``func`` over the names, results in order (``_inventory.parallel``)."""


class Unreadable(UnreadableHereError):
    """An object the store would not hand over (see the module docstring): skipped, kept."""


_named: set[str] = set()
_named_lock = threading.Lock()


def _skip(layer: ObjectLayer, name: str, exc: BaseException) -> Unreadable:
    """``Unreadable`` for ``name``, named in one WARNING per process and object."""
    where = f"{printable(layer.url)}/{printable(name)}"
    why = f"{type(exc).__name__}: {printable(str(exc))[:300]}"
    with _named_lock:
        first = where not in _named
        _named.add(where)
    if first:
        log.warning("plancache: %s skipped: the store does not hand it over: %s", where, why)
    return Unreadable(f"not handed over: {why}")


@contextlib.contextmanager
def opened(layer: ObjectLayer, name: str) -> Iterator[Opened | None]:
    """``layer.open_object(name)`` (None: absent), closed after; the store's refusal to hand
    it over, at the open or while it is read, raised as ``Unreadable``."""
    try:
        found = layer.open_object(name)
    except (PlanStoreError, InvalidPlanError, OSError) as exc:
        raise _skip(layer, name, exc) from None
    if found is None:
        yield None
        return
    try:
        yield found
    except (PlanStoreError, OSError) as exc:
        raise _skip(layer, name, exc) from None
    finally:
        found.close()


def read(layer: ObjectLayer, name: str, limit: int) -> tuple[bytes, object] | None:
    """At most ``limit`` bytes of ``name`` and its version token (``layer.read_object``;
    None: absent), for an object read whole (a plan record). The store's refusal to hand it
    over (``PlanStorePermissionError``: a 403, a GLACIER object's) is named once, as
    ``opened`` names it, and raised as the store raised it (the plans' callers skip a
    ``PlanStoreError``, and a directory this user may not read is the whole store's
    failure, not one object's); an entry that is no object raises ``InvalidPlanError``
    (the plans' rule, above)."""
    try:
        return layer.read_object(name, limit)
    except PlanStorePermissionError as exc:
        _skip(layer, name, exc)
        raise


def newest(
    names: Sequence[str], dated: Callable[[str], float], now: float | None = None
) -> tuple[list[str], int]:
    """``names`` newest first by ``dated(name)`` (epoch seconds), without those dated more
    than ``CLOCK_SKEW_S`` after ``now`` (default: this node's clock); and how many those were."""
    limit = (time.time() if now is None else now) + CLOCK_SKEW_S
    kept = [n for n in names if dated(n) <= limit]
    return sorted(kept, key=dated, reverse=True), len(names) - len(kept)


def accepted(
    names: Sequence[str], n: int, read: Callable[[str], T | None], many: Many[T | None]
) -> list[T]:
    """The first ``n`` objects of ``names`` (in order) that ``read`` accepts (returns other
    than None; with keys: validly signed), read batch by batch of what is still missing
    (``many``): an object takes a place only once accepted. Reads each name at most once."""
    out: list[T] = []
    at = 0
    while len(out) < n and at < len(names):
        batch = names[at : at + n - len(out)]
        at += len(batch)
        out.extend(got for got in many(read, batch) if got is not None)
    return out
