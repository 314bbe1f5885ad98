"""Every decision of every kind has a reason from one enum and is a structured event: a record
on the ``plancache.events`` logger with its fields, and a JSON line the benchmarks read."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compile_share import last_fetch
from plancache import PlanCache, Reason, open_store
from plancache import _events as events
from plancache._artifacts.compiled import METRIC
from plancache.caches import CacheShare, directory_cache
from plancache.testing import FACTORS, GiB, make_plan


class Kept(logging.Handler):
    """Every event's fields, as a program's own handler sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.plancache_event)  # type: ignore[attr-defined]
        assert json.loads(record.getMessage()) == record.plancache_event  # type: ignore[attr-defined]


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    events.log.addHandler(handler)
    yield handler
    events.log.removeHandler(handler)


def test_a_plan_lookup_is_an_event_with_its_reason(tmp_path: Path, kept: Kept) -> None:
    store = open_store(str(tmp_path / "plans"))
    cache = PlanCache(store)
    assert cache.lookup(FACTORS, current_free_memory=80 * GiB).reason is Reason.MISS
    store.put(make_plan(kv=10 * GiB, baseline=70 * GiB))
    assert cache.lookup(FACTORS, current_free_memory=80 * GiB).reason is Reason.HIT
    assert [(e["event"], e["kind"], e["reason"]) for e in kept.seen] == [
        ("decision", "plans", "miss"),
        ("decision", "plans", "hit"),
    ]


def test_a_cache_pull_has_a_typed_frozen_result_and_is_an_event(
    tmp_path: Path, kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, ``CacheFetched.reason`` was a bare string and the result could be changed."""
    monkeypatch.setenv("PLANCACHE_URL", str(tmp_path / "store"))
    cache = directory_cache("mine", tmp_path / "cache", {"v": 1})
    with CacheShare.from_env() as share:
        fetched = share.pull(cache)
    assert fetched.reason is Reason.MISS and type(fetched.reason) is Reason
    with pytest.raises(dataclasses.FrozenInstanceError):
        fetched.bundles = 1  # type: ignore[misc]
    [event] = kept.seen
    assert (event["event"], event["kind"], event["reason"]) == ("decision", "cache_mine", "miss")
    assert event["seconds"] >= 0


def test_events_go_to_stderr_as_json_lines_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    before = list(events.log.handlers)
    try:
        for value, lines in (("0", 0), ("1", 1), ("maybe", 0)):
            monkeypatch.setenv("PLANCACHE_EVENTS", value)
            events._to_stderr.cache_clear()
            events.decision(METRIC, Reason.SLOW, 1.5, "m")
            assert len(events.read(capfd.readouterr().err)) == lines
            events.log.handlers[:] = before
    finally:
        events.log.handlers[:] = before
        events._to_stderr.cache_clear()


def test_the_compile_benchmark_reads_a_nodes_last_fetch_from_its_events() -> None:
    lines = [
        "INFO vllm: plancache: compile artifact abc/rank_0_0: hit from store (0.5 s)",
        events.PREFIX + '{"event":"decision","kind":"plans","reason":"hit","seconds":0.01}',
        events.PREFIX + '{"event":"decision","kind":"compile_artifact","reason":"miss",'
        '"seconds":0.2}',
        events.PREFIX + "{not json",
        events.PREFIX + '{"event":"decision","kind":"compile_artifact","reason":"hit",'
        '"seconds":0.25}',
    ]
    fetch = last_fetch("\n".join(lines))
    assert fetch is not None and (fetch["reason"], fetch["seconds"]) == ("hit", 0.25)
    assert last_fetch(lines[0]) is None
