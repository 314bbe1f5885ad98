"""The one bounded reader of the objects a kind reads from a store: opening one, choosing
"the newest N", and reading until N were accepted. Parsing is each kind's decoder, bounded
in its turn (``manifest.decode_versioned``: the signature on the bytes before any
structure; ``Manifest.decode``: every limit while parsing).

Guarantees:

- one object never fails a command or a boot: an object the store will not hand over (a
  403, such as a GLACIER object's; a race with a delete; a directory, FIFO or link under
  its name in a local store; a read that fails midway) is ``Unreadable``: skipped and
  counted by the caller, named once per process in a WARNING, escaped
  (``_redaction.printable``), never judged corrupt (an ``UnreadableHereError``: kept);
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
from plancache.errors import InvalidPlanError, PlanStoreError, UnreadableHereError

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
