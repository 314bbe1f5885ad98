"""``plancache prune``: observations past an age, records left with none, and temp files that
killed writers left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

from plancache import open_store
from plancache._keys import plan_object_name
from plancache.testing import GiB
from tests.cli.helpers import LocalFixture, frontier_plan, ok, run


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (temp files included) with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def test_prune(store: LocalFixture) -> None:
    root, [a, b, c], _ = store
    s = open_store(str(root))
    mixed = frontier_plan("mixed", [(1, 60, 40), (2, 70, 15), (3, 80, 1)])  # ages in days
    s.put(mixed)
    stale = root / f".{plan_object_name(a.fingerprint)}.host.1.abcd.x.tmp"
    live = root / f".{plan_object_name(a.fingerprint)}.host.2.ef01.y.tmp"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    before = snapshot(root)

    dry = ok("prune", "--older-than", "30d", "--dry-run", str(root)).splitlines()
    assert sorted(dry[:2]) == sorted(
        [
            f"would drop 1 of 1 observation {c.fingerprint}",
            f"would drop 1 of 3 observations {mixed.fingerprint}",
        ]
    )
    assert dry[2].startswith("would drop 2 observations older than 30d in ")
    assert "would delete 1 plan, and 1 abandoned temp file" in dry[2]
    assert "; 1 invalid record left" in dry[2]
    assert snapshot(root) == before  # a dry run changes nothing

    out = ok("prune", str(root), "--older-than", "10d").splitlines()
    assert sorted(out[:3]) == sorted(
        [
            f"dropped 1 of 1 observation {b.fingerprint}",
            f"dropped 1 of 1 observation {c.fingerprint}",
            f"dropped 2 of 3 observations {mixed.fingerprint}",
        ]
    )
    assert "dropped 4 observations older than 10d" in out[3]
    assert "deleted 2 plans, and 1 abandoned temp file" in out[3]
    assert not stale.exists() and live.exists()
    assert s.get(a.fingerprint) == a
    assert s.get(b.fingerprint) is None and s.get(c.fingerprint) is None
    kept = s.get(mixed.fingerprint)  # the fresh observation stays, in the same record
    assert kept is not None and kept.observations == mixed.observations[2:]
    assert (kept.max_kv_cache_memory_bytes, kept.labels) == (3 * GiB, {"model": "mixed"})

    for duration in ("12h", "45m", "10s"):
        assert run("prune", "--older-than", duration, "--dry-run", str(root)).returncode == 0
    result = run("prune", "--older-than", "30 days", str(root))
    assert result.returncode == 2 and "not a duration like 30d" in result.stderr


def test_prune_drops_observations_dated_too_far_ahead(tmp_path: Path) -> None:
    # a clock far ahead would keep its observations forever; small skews are kept
    root = tmp_path / "store"
    s = open_store(str(root))
    ahead = frontier_plan("ahead", [(1, 60, -400), (2, 70, -0.01)])  # 400 d and 15 min ahead
    later = frontier_plan("later", [(1, 60, -31)])
    s.put(ahead)
    s.put(later)
    out = ok("prune", "--older-than", "30d", str(root)).splitlines()
    assert sorted(out[:2]) == sorted(
        [
            f"dropped 1 of 2 observations {ahead.fingerprint}",
            f"dropped 1 of 1 observation {later.fingerprint}",
        ]
    )
    assert out[2].startswith("dropped 2 observations older than 30d (2 dated over 30d ahead) in ")
    kept = s.get(ahead.fingerprint)
    assert kept is not None and kept.observations == ahead.observations[1:]
    assert s.get(later.fingerprint) is None
