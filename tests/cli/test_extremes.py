"""Records at the edges of the format: the earliest and latest times it allows, and times in
the future, are shown and counted without a failure; one past the edge is an invalid record."""

from __future__ import annotations

import json
import time
from pathlib import Path

from plancache import fingerprint, open_store
from plancache._observation import MAX_CREATED_AT, Observation
from plancache._plan import Plan
from plancache.testing import GiB
from tests.cli.helpers import ok, record_bytes, run, write_raw

TIMES = {"epoch": 0.0, "last": MAX_CREATED_AT, "ahead": time.time() + 400 * 86400}


def _plan(name: str, created_at: float) -> Plan:
    factors = {"model": name}
    obs = Observation(GiB, 2 * GiB, created_at, {"host": "h"})
    return Plan(fingerprint(factors), factors, (obs,), {"model": name})


def test_times_at_the_edges_of_the_format(tmp_path: Path) -> None:
    root = tmp_path / "store"
    s = open_store(str(root))
    plans = {name: _plan(name, t) for name, t in TIMES.items()}
    for p in plans.values():
        s.put(p)
    bad = fingerprint({"model": "past-the-edge"})
    write_raw(root, bad, record_bytes(factors={"model": "past-the-edge"}, created_at=1e300))

    listing = ok("ls", str(root))
    assert "3 plans, 1 invalid" in listing and "created_at must be a time" in listing
    rows = {r["fingerprint"]: r for r in json.loads(ok("ls", "--json", str(root)))}
    assert rows[plans["last"].fingerprint]["created_at"] == MAX_CREATED_AT
    stats = ok("stats", str(root))
    assert "oldest   1970-01-01 00:00:00 UTC (" in stats
    assert "newest   9999-12-31 23:59:59 UTC (" in stats and "d ahead)" in stats
    assert json.loads(ok("stats", "--json", str(root)))["newest"] == MAX_CREATED_AT
    for name in TIMES:
        shown = ok("show", plans[name].fingerprint[:12], "--url", str(root))
        assert "ahead ago" not in shown and "future ago" not in shown
    shown = ok("show", plans["ahead"].fingerprint[:12], "--url", str(root))
    assert "(400d ahead)" in shown or "(399d ahead)" in shown
    assert run("verify", str(root)).returncode == 1
