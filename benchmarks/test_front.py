"""The rollout's front end: the proxy serves from a process of its own, and the evidence
tells the harness's failures apart from the store's answers, second by second."""

from __future__ import annotations

import http.client
import time
from typing import Any

from benchmarks import front
from plancache.testing.hostile import Reply, ScriptedServer
from plancache.testing.servers import CLIENT_GONE, UPSTREAM_FAILED, Accepted, Exchange

START = 1000.0


def _front(**given: Any) -> dict[str, Any]:
    """What ``Front.report`` gives, for a healthy second and whatever ``given`` replaces."""
    return {
        "exchanges": [
            Exchange(START + 0.1, 200, 0.03, 0.02, 0.005),
            Exchange(START + 0.2, 404, 0.03, 0.02, 0.006),
            Exchange(START + 0.3, 503, 0.02, 0.02, 0.0),
            Exchange(START + 1.5, 412, 0.04, 0.02, 0.01),
        ],
        "accepted": [Accepted(START + 0.1, 0.001)],
        "samples": [(START + 0.05, 0, 1024, 10.0), (START + 1.05, 1, 1024, 11.5)],
        "listen_overflows": 0,
        **given,
    }


def test_a_healthy_run_counts_store_answers_per_second_and_the_harness_kept_up() -> None:
    found = front.evidence(_front(), [(START + 0.1, 0.004)], START)
    first, second = found["seconds"]
    assert (first["s"], first["requests"], first["ok"], first["503"]) == (0, 3, 2, 1)
    assert first["connections"] == 1 and first["accept_max_ms"] == 1.0
    assert first["answer_max_ms"] == 30.0 and first["moto_max_ms"] == 6.0
    assert first["proxy_max_ms"] == 5.0
    assert first["loop_lag_max_ms"] == 4.0 and first["load"] == 1.5
    assert (second["s"], second["ok"], second["queue_max"]) == (1, 1, 1)
    assert found["harness"]["failed"] == [] and found["harness"]["client_gone"] == 0
    assert found["harness"]["answered"] == 4  # 503 included: the store's answer


def test_the_harness_failed_where_it_refused_lost_or_held_past_the_bound() -> None:
    late = front.HARNESS_BOUND_S + 0.2
    given = _front(
        exchanges=[
            Exchange(START, CLIENT_GONE, 0.3, 0.02, 0.1),
            Exchange(START, UPSTREAM_FAILED, 0.5, 0.0, 0.5),
            Exchange(START, 200, late + 2.1, 2.0, 0.1),  # held 2 s on purpose: the store's
            Exchange(START, 200, late + 0.1, 0.0, late),
        ],
        samples=[(START, 1024, 1024, None)],
        listen_overflows=7,
    )
    found = front.evidence(given, [(START, late)], START)
    harness = found["harness"]
    assert harness["client_gone"] == 1 and harness["upstream_failed"] == 1
    assert harness["answered"] == 2
    assert found["seconds"][0]["client-gone"] == 1 and "ok" in found["seconds"][0]
    assert harness["failed"] == [
        "7 connections not accepted (a listen queue full)",
        "1 answers lost by moto",
        f"the proxy held a request {late:.1f} s (> {front.HARNESS_BOUND_S} s)",
        f"moto held a request {late:.1f} s (> {front.HARNESS_BOUND_S} s)",
        f"a client's event loop stalled {late:.1f} s (> {front.HARNESS_BOUND_S} s)",
    ]


def test_the_proxy_serves_from_a_process_of_its_own_and_reports_what_it_saw() -> None:
    def respond(method: str, path: str, body: bytes) -> Reply:
        return 200, {}, b"ok"

    with ScriptedServer(respond) as upstream, front.Front(upstream.endpoint) as proxy:
        conn = http.client.HTTPConnection(proxy.endpoint.removeprefix("http://"), timeout=30)
        conn.request("GET", "/bucket/key")
        assert conn.getresponse().read() == b"ok"
        conn.close()
        deadline = time.monotonic() + 30
        while not (seen := proxy.report())["exchanges"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the exchange is recorded once its answer is sent
    assert seen["requests"] == [("GET", "/bucket/key")]
    assert [e.outcome for e in seen["exchanges"]] == [200] and len(seen["accepted"]) == 1
    assert seen["throttled"] == 0 and seen["samples"] is not None
    assert proxy._proc.exitcode == 0  # stopped when asked
