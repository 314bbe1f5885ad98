"""The rollout simulation runs the real code and counts what it promises: one upload per
key, every profiled observation kept, every node's boot accounted for beside its off twin;
and a store too loaded for any probe to conclude still gets what the fleet made."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert r["observations_kept_for_next_boot"] == 0  # every one reached the store
    assert set(r["artifact_reasons"]) <= {"hit", "miss", "slow", "store-error", "not-waited-for"}
    assert sum(r["artifact_reasons"].values()) == 8
    assert r["first_forward_vs_off"]["min"] > 0.3  # the weights load (0.5 of 1.1 s) at least
    assert r["off_vs_cold"]["min"] > 0.9 and r["machine_load"] > 0
    assert r["goals"]["uploads"] and r["goals"]["lost"]
    assert "SlowDown" not in str(r["upload_errors"])
    assert r["lookup_max_s"] >= timing.weights_s  # joined after the weights, as the plugin
    assert r["goals"]["lookup"] is (r["lookups_past_bound"] == 0)
    # the front end's evidence: every request the nodes sent is an exchange of some second
    assert sum(second.get("requests", 0) for second in r["seconds"]) >= r["requests"] > 0
    assert {"client_gone", "upstream_failed", "failed"} <= r["harness"].keys()
    table = rollout.table({"processes": rollout.PROCESSES, "load": r["load"], "runs": {"8": r}})
    assert "rollout" in table and rollout.row({"runs": {"8": r}})[0].startswith("rollout: 8")


@pytest.mark.slow
def test_a_store_too_loaded_for_the_probe_still_gets_the_fleets_work(tmp_path: Path) -> None:
    """An honest store that answers nothing in time for the first 30 s of a rollout (longer
    than a write used to wait for a verdict: two probes of 10 s): no probe concludes while
    every node profiles, compiles and tries to write. Each write waits for the verdict with
    backoff instead of giving up, so once the store answers, the fleet shares: one upload,
    every observation in the store (with writes that gave up, nothing was uploaded and every
    observation stayed on its node until its next boot)."""
    timing = rollout.Timing(weights_s=1.0, profile_s=0.2, compile_s=2.0)
    load = rollout.Load(overload_s=30.0)
    with servers.fake_aws_env(), servers.MotoS3Process() as moto:
        r = rollout.run(tmp_path, moto, nodes=8, window=2.0, timing=timing, load=load)
    assert r["compiled"] == 8 and r["profiled"] == 8  # every node arrived in the overload
    assert r["uploads_created"] == 1 and r["upload_bytes_per_key"] <= 1.2
    assert r["observations_lost"] == 0 and r["observations_kept_for_next_boot"] == 0


def test_a_node_waits_for_its_plan_no_longer_than_the_budget_from_the_lookups_start(
    tmp_path: Path,
) -> None:
    """A store that answers nothing in time while the nodes boot, weights that load for
    1 s of the 2 s budget: each node waits at most the 1 s left after its weights, as the
    plugin does (the simulation waited the whole budget again: 2 s after the weights)."""
    timing = rollout.Timing(weights_s=1.0, profile_s=0.1, compile_s=0.5)
    load = rollout.Load(overload_s=4.0)
    with servers.fake_aws_env(), servers.MotoS3Process() as moto:
        r = rollout.run(tmp_path, moto, nodes=4, window=1.0, timing=timing, load=load)
    assert r["profiled"] == 4  # no lookup found anything in time
    assert r["waited_after_weights_max_s"] > 0.2  # the lookups were still running
    assert r["waited_after_weights_max_s"] < 2.0  # never the whole budget again
