"""A rollout's herd on a store that stalls early (moto behind ``benchmarks.herd.NodeCounts``, each
request counted per node at the proxy): each node's requests stay within the bound that
docs/reliability.md states, the fleet probes the store once, not once per node, and once
the store answers again the fleet shares (the plan uploaded, later nodes hit).

Before the probe claim and the process's one backoff, every node without a verdict read the
shared verdict up to three times per probe and probed on its own backoff: a thousand nodes
on a slow store sent 8.7 probe requests and 7.9 verdict reads each, and the store never got
the quiet it needed to recover (issue 44)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from benchmarks import herd
from plancache import open_store
from plancache._backends import guarded
from plancache._backends.tiered import TieredStore
from plancache._backends.verdicts import SHARED_VERDICT
from plancache._config import Settings
from plancache._keys import fingerprint
from plancache.errors import PlanStoreUnavailableError
from plancache.testing import FACTORS
from plancache.testing.hostile import FaultyProxy
from plancache.testing.servers import MotoS3

NODES = 16
"""Nodes of the first wave, arriving ``SPACING_S`` apart (threads, each its own directory)."""
SPACING_S = 0.2
LATER = 4
"""Nodes booted once the first wave is done: each must hit."""
STALL_S = 4.0
"""The store answers nothing within the clients' bounds (``herd.NodeCounts.stall``) from the
rollout's start for this long."""
RETRIES = 1
"""The client's retries of a failed call (``CallTimeouts.retries``): HTTP requests per call."""
BOOT_CALLS = 1 + 1 + 2 * 16 + 1
"""A boot's other calls: its lookup, its record's create-if-absent or 16 rounds of read and
compare-and-swap, its report."""


def _wave(url: str, endpoint: str, root: Path, nodes: range) -> dict[int, str]:
    """``nodes`` booting ``SPACING_S`` apart (``herd.boot``): the reason of each lookup."""
    out: dict[int, str] = {}

    def one(n: int) -> None:
        options = herd.node_options(endpoint, n)
        out[n] = herd.boot(url, options, root, n, weights_s=0.5, write_patience=20.0)

    threads = []
    for n in nodes:
        th = threading.Thread(target=one, args=(n,), daemon=True)
        th.start()
        threads.append(th)
        time.sleep(SPACING_S)
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a node's boot did not end"
    return out


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backoffs and claim of a rollout, shortened so that a test waits seconds."""
    monkeypatch.setattr(guarded, "RETRY_MIN_S", 1.0)
    monkeypatch.setattr(guarded, "RETRY_S", 2.0)
    monkeypatch.setattr(guarded, "PROBE_JITTER_S", 0.5)
    monkeypatch.setattr(guarded, "PROBE_CLAIM_S", 6.0, raising=False)


def test_a_herd_on_a_stalled_store_stays_bounded_and_shares_once_it_answers(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, quick: None
) -> None:
    url = f"s3://{s3_bucket}/plans"
    with herd.NodeCounts(moto_s3.endpoint) as proxy:
        proxy.stall(time.monotonic() + STALL_S)
        first = _wave(url, proxy.endpoint, tmp_path, range(NODES))
        later = _wave(url, proxy.endpoint, tmp_path, range(NODES, NODES + LATER))
        counts = dict(proxy.by_node)
        probes = len(proxy.probe_keys)
    stored = open_store(url, endpoint_url=moto_s3.endpoint).get(fingerprint(FACTORS))
    assert stored is not None, f"nothing uploaded once the store answered again: {first}"
    assert set(later.values()) == {"hit"}, later
    # every node within the documented bound (docs/reliability.md): its rounds, its other
    # calls, and the probe if it held the claim; each call may be retried once
    bound = (RETRIES + 1) * (guarded.MAX_ROUNDS * guarded.ROUND_CALLS + BOOT_CALLS)
    holders = (RETRIES + 1) * (guarded.HOLDER_CALLS - guarded.ROUND_CALLS)
    over = {n: c for n, c in counts.items() if c > bound + holders}
    assert not over, (over, bound)
    # the fleet probed once the store answered, not once per node (a probe writes three
    # keys; one cut short by the stall's end, two): before the probe claim, 9-32 keys
    assert 1 <= probes <= 3 * 2, (probes, counts)
    assert sum(counts.values()) / (NODES + LATER) <= bound, counts


def test_the_plans_and_artifacts_of_a_process_share_one_backoff(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """Two stores of one process opened on the same store and local directory (the plugin's
    plans and its compile artifacts): after a round without a verdict (the store answers
    503 to everything), the other's write waits out the same backoff instead of running a
    round of its own."""
    url = f"s3://{s3_bucket}/plans"
    with FaultyProxy(moto_s3.endpoint, 503, lambda n, m, p: True) as proxy:
        settings = Settings(
            url,
            local_tier=str(tmp_path / "node"),
            storage_options={"endpoint_url": proxy.endpoint},
            write_patience=0.0,
        )
        plans, artifacts = (settings.open_store() for _ in range(2))
        assert isinstance(plans, TieredStore) and isinstance(artifacts, TieredStore)
        with pytest.raises(PlanStoreUnavailableError, match="no verdict"):
            plans.remote.layer.write_object("a.json", [b"{}"])
        sent = len(proxy.requests)
        assert sent > 0 and all(SHARED_VERDICT in p for _, p in proxy.requests)
        with pytest.raises(PlanStoreUnavailableError, match="no verdict"):
            artifacts.remote.layer.write_object("b.json", [b"{}"])
        assert len(proxy.requests) == sent
