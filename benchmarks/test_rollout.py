"""The rollout simulation runs the real code and counts what it promises: one upload per
key, every profiled observation kept, every node's boot accounted for."""

from __future__ import annotations

from pathlib import Path

from benchmarks import rollout
from plancache.testing import servers


def test_a_small_rollout_uploads_once_and_loses_nothing(tmp_path: Path) -> None:
    timing = rollout.Timing(weights_s=0.5, profile_s=0.1, compile_s=0.5)
    with servers.fake_aws_env(), servers.MotoS3Process() as moto:
        r = rollout.run(tmp_path, moto, nodes=8, window=2.0, timing=timing)
    assert r["boots"] == 8
    assert r["compiled"] >= 1 and r["uploads_created"] == 1  # the first node's, once
    assert r["artifact_bytes"] > 0 and r["upload_bytes_per_key"] <= 1.2
    assert r["profiled"] >= 1 and r["observations_lost"] == 0
    assert set(r["artifact_reasons"]) <= {"hit", "miss", "slow", "store-error", "not-waited-for"}
    assert sum(r["artifact_reasons"].values()) == 8
    assert r["first_forward_vs_cold"]["min"] > 0.3  # the weights load (0.5 of 1.1 s) at least
    assert "SlowDown" not in str(r["upload_errors"])
    table = rollout.table({"processes": rollout.PROCESSES, "load": r["load"], "runs": {"8": r}})
    assert "rollout" in table and rollout.row({"runs": {"8": r}})[0].startswith("rollout: 8")
