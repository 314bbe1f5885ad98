"""What a plan costs on the object stores: latency and requests per operation.

``measure_remote(n)`` starts moto (S3) and fake-gcs-server (GCS) on loopback and reports, per
backend, p50/p99 of get_hit, get_miss, put_create, put_merge (a dominating plan: read,
compare-and-swap), put_kept (read), by a store that has seen the record (a writer that has
not sends a create first, refused), ``PlanCache`` lookup_miss,
lookup_hit and record (the same calls through the cache's time budget), the first read of a
fresh store (client setup included), and the requests each operation sends (counted by a
proxy), beside raw s3fs ``cat_file`` (HEAD + GET) as the baseline. Loopback figures measure
client overhead, not network latency: on a real bucket, add one round trip per request.

Run: ``python -m benchmarks.store_costs [n]``
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from functools import partial
from typing import Any

import s3fs

from benchmarks.factors import worker_factors
from benchmarks.stats import percentiles
from plancache import Plan, PlanCache, PlanStore, PutOutcome, open_store
from plancache._keys import Scalar, plan_object_name
from plancache.testing import GiB
from plancache.testing.servers import CountingProxy, FakeGCS, MotoS3, fake_aws_env


def _timed(calls: Iterable[Callable[[], object]]) -> list[float]:
    out = []
    for call in calls:
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def _plans(n: int, tag: str, kv: int = 10 * GiB) -> list[Plan]:
    return [
        Plan.new(
            worker_factors(f"{tag}-{i}"), kv_cache_memory_bytes=kv, free_memory_baseline=70 * GiB
        )
        for i in range(n)
    ]


def _steps(store: PlanStore, n: int, tag: str) -> list[tuple[str, Callable[[], object]]]:
    """``n`` of each operation, in an order that makes each one mean what its name says."""
    base, better = _plans(n, tag), _plans(n, tag, kv=11 * GiB)

    def put(p: Plan, expected: PutOutcome) -> Callable[[], object]:
        def call() -> None:
            if (got := store.put(p)) is not expected:
                raise RuntimeError(f"expected {expected}, got {got}")

        return call

    steps: list[tuple[str, Callable[[], object]]] = []
    steps += [("get_miss", partial(store.get, p.fingerprint)) for p in base]
    steps += [("put_create", put(p, PutOutcome.CREATED)) for p in base]
    steps += [("get_hit", partial(store.get, p.fingerprint)) for p in base]
    steps += [("put_kept", put(p, PutOutcome.KEPT)) for p in base]
    steps += [("put_merge", put(p, PutOutcome.REPLACED)) for p in better]
    return steps + _cache_steps(store, n, tag)


def _cache_steps(store: PlanStore, n: int, tag: str) -> list[tuple[str, Callable[[], object]]]:
    """``PlanCache`` lookups (miss, hit) and records (create) over ``store``: the store call
    plus the cache's bounded thread, validation and log line."""
    cache = PlanCache(store)
    factors = [worker_factors(f"{tag}-cache-{i}") for i in range(n)]

    def expect(reason: str, call: Callable[[], Any]) -> Callable[[], object]:
        def checked() -> None:
            if (got := call().reason) != reason:
                raise RuntimeError(f"expected {reason}, got {got}")

        return checked

    def record(f: dict[str, Scalar]) -> Any:
        return cache.record(f, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=70 * GiB)

    steps: list[tuple[str, Callable[[], object]]] = []
    steps += [("lookup_miss", expect("miss", partial(cache.lookup, f, 80 * GiB))) for f in factors]
    steps += [("record", expect("created", partial(record, f))) for f in factors]
    steps += [("lookup_hit", expect("hit", partial(cache.lookup, f, 80 * GiB))) for f in factors]
    return steps


def _latencies(store: PlanStore, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, call in _steps(store, n, uuid.uuid4().hex):
        out.setdefault(name, []).extend(_timed(iter([call])))
    return out


def _requests(store: PlanStore, proxy: CountingProxy, k: int) -> dict[str, float]:
    total: dict[str, int] = {}
    for name, call in _steps(store, k, uuid.uuid4().hex):
        proxy.reset()
        call()
        total[name] = total.get(name, 0) + len(proxy.requests)
    return {name: round(count / k, 2) for name, count in total.items()}


def _backend(
    open_direct: Callable[[], PlanStore],
    open_counted: Callable[[], PlanStore],
    proxy: CountingProxy,
    n: int,
) -> dict[str, Any]:
    store = open_direct()
    store.get(_plans(1, "warm-up")[0].fingerprint)
    latencies = _latencies(store, n)
    fresh = [open_direct() for _ in range(min(n, 10))]
    latencies["first_get"] = _timed(partial(s.get, _plans(1, "x")[0].fingerprint) for s in fresh)
    for s in [store, *fresh]:
        s.close()
    counted = open_counted()
    requests = _requests(counted, proxy, min(n, 20))
    counted.close()
    out: dict[str, Any] = {name: percentiles(samples) for name, samples in latencies.items()}
    out["requests"] = requests
    return out


def _s3fs_baseline(endpoint: str, proxy: CountingProxy, bucket: str, n: int) -> dict[str, Any]:
    store = open_store(f"s3://{bucket}/cat", endpoint_url=endpoint)
    plans = _plans(n, "cat")
    for p in plans:
        store.put(p)
    paths = [f"{bucket}/cat/{plan_object_name(p.fingerprint)}" for p in plans]
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.cat_file(paths[0])
    samples = _timed(partial(fs.cat_file, path) for path in paths)
    counted = s3fs.S3FileSystem(endpoint_url=proxy.endpoint, skip_instance_cache=True)
    counted.cat_file(paths[0])
    proxy.reset()
    k = min(n, 20)
    for path in paths[:k]:
        counted.cat_file(path)
    return {"get_hit": percentiles(samples), "requests": {"get_hit": len(proxy.requests) / k}}


def measure_remote(n: int = 200) -> dict[str, Any]:
    """Per backend (``s3``, ``gcs``) and for raw s3fs ``cat_file`` (``s3fs_cat_file``):
    ``{operation: {"n", "p50_us", "p99_us"}, ..., "requests": {operation: per op}}``,
    measured on loopback emulators this function starts and stops."""
    with ExitStack() as stack:
        stack.enter_context(fake_aws_env())
        s3 = stack.enter_context(MotoS3())
        gcs = stack.enter_context(FakeGCS())
        s3_proxy = stack.enter_context(CountingProxy(s3.endpoint))
        gcs_proxy = stack.enter_context(CountingProxy(gcs.endpoint))
        bucket = f"plancache-bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        gcs.create_bucket(bucket)

        def s3_store(endpoint: str) -> Callable[[], PlanStore]:
            return lambda: open_store(f"s3://{bucket}/plans", endpoint_url=endpoint)

        def gcs_store(endpoint: str) -> Callable[[], PlanStore]:
            return lambda: open_store(f"gs://{bucket}/plans", endpoint_url=endpoint, token="anon")

        return {
            "s3": _backend(s3_store(s3.endpoint), s3_store(s3_proxy.endpoint), s3_proxy, n),
            "gcs": _backend(gcs_store(gcs.endpoint), gcs_store(gcs_proxy.endpoint), gcs_proxy, n),
            "s3fs_cat_file": _s3fs_baseline(s3.endpoint, s3_proxy, bucket, n),
        }


if __name__ == "__main__":
    print(json.dumps(measure_remote(int(sys.argv[1]) if len(sys.argv) > 1 else 200), indent=2))
