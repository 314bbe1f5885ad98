"""The compare-and-swap loop of ``PlanStore`` when racing writers keep winning: it backs
off, never re-sends a create it knows must fail, and gives up within its bounds."""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import pytest

from plancache import PlanStoreConflictError
from plancache._backends.local import LocalStore
from plancache._store import PlanStore
from plancache.testing import GiB, make_plan


class Outpaced(PlanStore):
    """Plans in a local directory where another writer (a second store object on the same directory)
    lands a better plan between each read of this one and its replace; it records when each
    of its rounds began and ended, and counts its creates."""

    def __init__(self, root: Path) -> None:
        super().__init__(LocalStore(root))
        self.rival = PlanStore(LocalStore(root))
        self.kv = itertools.count(20 * GiB, 1 << 20)
        self.rounds: list[tuple[float, float]] = []
        self.creates = 0

    def _create(self, fp: str, data: bytes) -> bool:
        self.creates += 1
        return super()._create(fp, data)

    def _read(self, fp: str) -> tuple[bytes, object] | None:
        if not self.rounds or self.rounds[-1][1]:  # not the read inside ``_replace``
            self.rounds.append((time.monotonic(), 0.0))
        return super()._read(fp)

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        self.rival.put(make_plan(next(self.kv), 70 * GiB))  # dominates the last one
        done = super()._replace(fp, data, version)
        self.rounds[-1] = (self.rounds[-1][0], time.monotonic())
        return done


def test_a_writer_that_keeps_losing_backs_off_and_sends_one_create(tmp_path: Path) -> None:
    store = Outpaced(tmp_path)
    store.rival.put(make_plan(19 * GiB, 70 * GiB))
    store.max_put_attempts = 6
    with pytest.raises(PlanStoreConflictError, match="after 6 lost races"):
        store.put(make_plan(10 * GiB, 40 * GiB))  # a lower baseline: never covered
    assert store.creates == 1  # refused once: from then on the record is known to exist
    rounds = store.rounds
    assert len(rounds) == 6
    busy = statistics.median(end - begin for begin, end in rounds)
    paused = sum(nxt[0] - cur[1] for cur, nxt in itertools.pairwise(rounds))
    # pauses drawn from [0, 4), [0, 8), ... [0, 64) x a round: 62 rounds' worth on average
    assert paused > 5 * busy


def test_the_loop_starts_no_round_past_its_time_budget(tmp_path: Path) -> None:
    store = Outpaced(tmp_path)
    store.rival.put(make_plan(19 * GiB, 70 * GiB))
    store.max_put_attempts = 1000
    store.put_budget_s = 0.3
    start = time.monotonic()
    with pytest.raises(PlanStoreConflictError, match="lost races in"):
        store.put(make_plan(10 * GiB, 40 * GiB))
    assert len(store.rounds) < 1000
    # the last round began within the budget (give or take a loaded machine's scheduling)
    assert store.rounds[-1][0] - start <= 0.3 + 1.0
