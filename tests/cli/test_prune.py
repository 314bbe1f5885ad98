"""``plancache prune``: plans past an age, and temp files that killed writers left behind."""

from __future__ import annotations

import os
import time

from plancache import open_store
from plancache.fingerprint import object_name
from tests.cli.helpers import LocalFixture, ok, run


def test_prune(store: LocalFixture) -> None:
    root, plans, _ = store
    s = open_store(str(root))
    stale = root / f".{object_name(plans[0].fingerprint)}.host.1.abcd.x.tmp"
    live = root / f".{object_name(plans[0].fingerprint)}.host.2.ef01.y.tmp"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    dry = ok("prune", "--older-than", "30d", "--dry-run", str(root))
    assert dry.splitlines()[0].startswith(f"would delete {plans[2].fingerprint}  40d old")
    assert "would delete 1 plan older than 30d" in dry and "1 abandoned temp file" in dry
    assert "1 invalid record left" in dry
    assert len(list(s.iter_fingerprints())) == 4 and stale.exists()

    out = ok("prune", str(root), "--older-than", "10d")
    assert "deleted 2 plans older than 10d" in out and "1 abandoned temp file" in out
    assert not stale.exists() and live.exists()
    assert s.get(plans[0].fingerprint) is not None
    assert s.get(plans[1].fingerprint) is None and s.get(plans[2].fingerprint) is None
    for duration in ("12h", "45m", "10s"):
        assert run("prune", "--older-than", duration, "--dry-run", str(root)).returncode == 0
    result = run("prune", "--older-than", "30 days", str(root))
    assert result.returncode == 2 and "not a duration like 30d" in result.stderr
