"""The object-store cost benchmark runs and counts what the stores promise."""

from __future__ import annotations

from benchmarks.store_costs import measure_remote


def test_measure_remote_reports_requests_per_operation() -> None:
    result = measure_remote(n=3)
    for backend in ("s3", "gcs"):
        requests = {op: v["requests"] for op, v in result[backend].items() if op != "first-get"}
        assert requests == {
            "get-miss": 1.0,
            "put-create": 1.0,
            "get-hit": 1.0,
            "put-kept": 2.0,
            "put-merge": 3.0,
        }
        assert all(v["p50_ms"] <= v["p99_ms"] for v in result[backend].values())
    assert result["s3fs-cat_file"]["get-hit"]["requests"] == 2.0
