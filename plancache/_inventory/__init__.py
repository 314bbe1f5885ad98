"""What a store holds, one kind at a time, under one set of rules (a library; none prints).

Each kind has its inventory here (``plans``, ``artifacts``) with the same verbs (scan and
read, resolve, verify, remove, prune, copy, stats) and these rules:

- a delete is conditional on the version that was judged: what a writer stored since is
  kept (``PlanStore.delete_if`` for plans; the object layer's ``delete_object(name,
  version)`` for the others);
- nothing this process cannot read is deleted: a record of another schema, an artifact of a
  newer format, compressed with a codec not installed here or over this process's cap, is
  reported (``UNREADABLE_HERE``) and kept; ``prune`` deletes by age only (``prunable``),
  ``verify(fix=True)`` only what is provably corrupt (or, where signatures are required, not
  validly signed);
- temp files of killed writers are removed by age with ``prune`` (``LocalStore``), and so are
  the partial installs that killed boots left (``plancache._artifacts.archive``);
- a copy never makes code more trusted than it was: a kind loaded as code is copied into a
  store nodes trust without a key only when an accepted key signed it, or when the operator
  says so (``artifacts.copy``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

T = TypeVar("T")
WORKERS = 8
"""Threads a verb reads a store's entries on."""
UNREADABLE_HERE = "unreadable here: kept"
"""How a verb reports what this process cannot read, and therefore keeps."""


def prunable(created_at: float, older_than: float, now: float) -> bool:
    """True for a time ``prune`` forgets: more than ``older_than`` seconds before ``now``, or
    more than that after it (a clock that far ahead would keep an entry forever; the small
    skews of a fleet's clocks are kept)."""
    return abs(now - created_at) > older_than


def parallel(
    func: Callable[[str], T],
    items: Sequence[str],
    progress: Callable[[int, int], None] | None = None,
) -> list[T]:
    """``func`` over ``items`` on a few threads, results in order; ``progress(done, total)``
    after each. The first failure is raised at once and the work not yet started dropped."""
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        futures = [pool.submit(func, item) for item in items]
        for done, future in enumerate(as_completed(futures), 1):
            future.result()
            if progress is not None:
                progress(done, len(items))
        return [future.result() for future in futures]
    finally:
        pool.shutdown(cancel_futures=True)
