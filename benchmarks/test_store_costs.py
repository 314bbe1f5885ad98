"""The object-store cost benchmark runs and counts what the stores promise."""

from __future__ import annotations

from benchmarks.store_costs import measure_remote


def test_measure_remote_reports_requests_per_operation() -> None:
    result = measure_remote(n=3)
    for backend in ("s3", "gcs"):
        # GCS tells a missing bucket from a missing object by one listing, at a store's
        # first miss only (docs/stores.md): 2 requests, then 1 each
        first_miss = 2.0 if backend == "gcs" else 1.0
        assert result[backend]["requests"] == {
            "get_miss": round((first_miss + 2) / 3, 2),
            "put_create": 1.0,
            "get_hit": 1.0,
            "put_kept": 1.0,
            "put_merge": 2.0,
            "lookup_miss": 1.0,
            "record": 1.0,
            "lookup_hit": 1.0,
        }
        for op, p in result[backend].items():
            if op != "requests":
                assert p["n"] > 0 and p["p50_us"] <= p["p99_us"]
    assert result["s3fs_cat_file"]["requests"] == {"get_hit": 2.0}
