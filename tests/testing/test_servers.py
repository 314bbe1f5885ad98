"""The loopback servers of the test kit: each one does what its name says."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from plancache import InvalidPlanError, PutOutcome, open_store
from plancache._keys import plan_object_name
from plancache.testing import child_env, make_plan
from plancache.testing.hostile import FixedResponseServer, Reply, ScriptedServer
from plancache.testing.servers import (
    CLIENT_GONE,
    FAKE_AWS_ENV,
    UPSTREAM_FAILED,
    CountingProxy,
    FakeGCS,
    GCSDeletePreconditions,
    MotoS3,
    S3UnderLoad,
    closed_port,
    gcs_server,
    s3_server,
    with_latency,
)


def test_server_helpers_serve_child_processes_without_aws_environment() -> None:
    env = {k: v for k, v in child_env().items() if k not in FAKE_AWS_ENV}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    code = "import json,sys; from plancache import open_store; "
    code += "from plancache.testing import make_plan\n"
    code += "url, opts = json.loads(sys.argv[1]); print(open_store(url, **opts).put(make_plan()))"
    loose = {"connect_timeout": 5.0, "read_timeout": 5.0, "timeout": 15.0}  # beside 3 workers
    for server in (s3_server, gcs_server):
        with server() as (url, served):
            options = {**served, **loose}
            out = subprocess.run(
                [sys.executable, "-c", code, json.dumps([url + "/x", options])],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert out.stdout.strip() == "created"
            assert open_store(url + "/x", **options).put(make_plan()) is PutOutcome.KEPT


def test_put_object_stores_bytes_verbatim(
    moto_s3: MotoS3, s3_bucket: str, fake_gcs: FakeGCS, gcs_bucket: str
) -> None:
    fp = make_plan().fingerprint
    moto_s3.put_object(s3_bucket, f"p/{plan_object_name(fp)}", b"{torn")
    fake_gcs.put_object(gcs_bucket, f"p/{plan_object_name(fp)}", b"{torn")
    for store in (
        open_store(f"s3://{s3_bucket}/p", endpoint_url=moto_s3.endpoint),
        open_store(f"gs://{gcs_bucket}/p", endpoint_url=fake_gcs.endpoint, token="anon"),
    ):
        assert store.read_raw(fp) == b"{torn"
        with pytest.raises(InvalidPlanError):
            store.get(fp)
        store.close()


def test_closed_port_refuses_connections() -> None:
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", closed_port()))


def _request(endpoint: str, method: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(endpoint.removeprefix("http://"), timeout=10)
    try:
        conn.request(method, "/a?b=1", body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_scripted_server_answers_as_told_and_records_requests() -> None:
    def respond(method: str, path: str, body: bytes) -> Reply:
        return 201, {"Content-Type": "text/plain"}, [method.encode(), b" ", body]

    with ScriptedServer(respond) as server:
        assert _request(server.endpoint, "PUT", b"chunked back") == (201, b"PUT chunked back")
        assert _request(server.endpoint, "GET") == (201, b"GET ")
        assert server.requests == [("PUT", "/a?b=1"), ("GET", "/a?b=1")]
        server.reset()
        assert server.requests == []


def test_a_fixed_response_server_streams_an_endless_body_until_the_client_leaves() -> None:
    with FixedResponseServer(500, None) as server:
        conn = http.client.HTTPConnection(server.endpoint.removeprefix("http://"), timeout=10)
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.status == 500 and resp.getheader("Transfer-Encoding") == "chunked"
        assert len(resp.read(4 << 20)) == 4 << 20
        conn.close()
    with FixedResponseServer(403, b"denied") as server:
        assert _request(server.endpoint, "GET") == (403, b"denied")
        assert len(server.requests) == 1


def test_with_latency_delays_every_request() -> None:
    with FixedResponseServer(200, b"ok") as upstream:
        spec = ("s3://bucket", {"endpoint_url": upstream.endpoint, "key": "k"})
        with with_latency(spec, 0.3) as (url, options):
            assert url == "s3://bucket" and options["key"] == "k"
            assert options["endpoint_url"] != upstream.endpoint
            for _ in range(2):
                start = time.monotonic()
                assert _request(options["endpoint_url"], "GET") == (200, b"ok")
                assert time.monotonic() - start >= 0.3
        assert len(upstream.requests) == 2


def test_gcs_delete_preconditions_adds_what_fake_gcs_server_ignores(
    fake_gcs: FakeGCS, gcs_bucket: str
) -> None:
    """fake-gcs-server deletes whatever is stored, ``ifGenerationMatch`` or not; in front of
    it, ``GCSDeletePreconditions`` answers as GCS does: 412 for another generation, 404 for
    no object, and deletes the generation named."""
    plan = make_plan()
    path = f"/storage/v1/b/{gcs_bucket}/o/{plan_object_name(plan.fingerprint)}"

    def send(endpoint: str, method: str, query: str = "") -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(endpoint.removeprefix("http://"), timeout=10)
        try:
            conn.request(method, path + query)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def stored_generation() -> int | None:
        status, body = send(fake_gcs.endpoint, "GET")
        return int(json.loads(body)["generation"]) if status == 200 else None

    def delete(endpoint: str, generation: int) -> int:
        return send(endpoint, "DELETE", f"?ifGenerationMatch={generation}")[0]

    fake_gcs.put_object(gcs_bucket, plan_object_name(plan.fingerprint), plan.encode())
    generation = stored_generation()
    assert generation is not None
    assert delete(fake_gcs.raw_endpoint, generation + 1) in (200, 204)  # the emulator's gap
    assert stored_generation() is None
    with GCSDeletePreconditions(fake_gcs.raw_endpoint) as guard:
        fake_gcs.put_object(gcs_bucket, plan_object_name(plan.fingerprint), plan.encode())
        generation = stored_generation()
        assert generation is not None
        assert delete(guard.endpoint, generation + 1) == 412
        assert stored_generation() == generation
        assert delete(guard.endpoint, generation) in (200, 204)
        assert stored_generation() is None
        assert delete(guard.endpoint, generation) == 404
        assert [method for method, _ in guard.requests] == ["DELETE"] * 3


def test_s3_under_load_sheds_requests_per_prefix_and_shares_one_link(
    moto_s3: MotoS3, s3_bucket: str
) -> None:
    """Above its write rate on one prefix it answers S3's 503 SlowDown (another prefix is
    not affected); bodies share one link: two 256 KiB reads at 1 MB/s take about 0.5 s."""
    with S3UnderLoad(moto_s3.endpoint, writes_per_s=3, link_bytes_per_s=1e6) as proxy:
        statuses = []
        for i in range(5):
            conn = http.client.HTTPConnection(proxy.endpoint.removeprefix("http://"), timeout=10)
            conn.request("PUT", f"/{s3_bucket}/a/k{i}", body=b"x" * 10)
            response = conn.getresponse()
            body = response.read()
            statuses.append(response.status)
            conn.close()
        assert statuses == [200, 200, 200, 503, 503], statuses
        assert b"<Code>SlowDown</Code>" in body and proxy.throttled == 2
        store = open_store(f"s3://{s3_bucket}/b", endpoint_url=proxy.endpoint, retries=0)
        assert store.layer.write_object("big", (b"y" * (256 << 10),))  # another prefix: taken
        assert proxy.received_by_name["big"] == 256 << 10
        start = time.monotonic()
        threads = [
            threading.Thread(target=store.layer.read_object, args=("big", 1 << 20)) for _ in "ab"
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert time.monotonic() - start >= 0.45  # 512 KiB over one 1 MB/s link


def test_a_client_gone_before_its_answer_is_counted_not_printed(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A client that resets its connection while the proxy waits for the server behind it:
    the proxy's answer finds no one, and that is one ``CLIENT_GONE`` exchange, not a
    traceback (a rollout's proxy printed 11,163 of them in one run, in the process it
    shared with the benchmark)."""
    asked, gone = threading.Event(), threading.Event()

    def respond(method: str, path: str, body: bytes) -> Reply:
        asked.set()
        gone.wait(30)
        return 200, {}, b"x" * 1000

    with ScriptedServer(respond) as upstream, CountingProxy(upstream.endpoint) as proxy:
        host, port = proxy.endpoint.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)), timeout=10)
        client.sendall(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
        assert asked.wait(30)
        deadline = time.monotonic() + 30
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset: the proxy's write fails at once
        gone.set()
        while not proxy.exchanges and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [e.outcome for e in proxy.exchanges] == [CLIENT_GONE]
        assert [e.outcome for e in upstream.exchanges] == [200]
        assert len(proxy.accepted) == 1 and proxy.accepted[0].waited >= 0
    assert "Traceback" not in capfd.readouterr().err


def test_s3_under_load_counts_what_the_server_behind_did_not_answer() -> None:
    """Nothing listens behind the proxy: the client's connection is closed without an
    answer (as before), and the exchange says the upstream failed, not the client."""
    with S3UnderLoad(f"http://127.0.0.1:{closed_port()}") as proxy:
        conn = http.client.HTTPConnection(proxy.endpoint.removeprefix("http://"), timeout=10)
        conn.request("GET", "/bucket/k")
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            conn.getresponse()
        conn.close()
        assert [e.outcome for e in proxy.exchanges] == [UPSTREAM_FAILED]
        queue = proxy.listen_queue()
        assert queue is None or (queue[0] == 0 and queue[1] >= 128)


def test_moto_listens_with_a_queue_as_long_as_the_proxies() -> None:
    """A rollout's proxy opens one connection to moto per request: werkzeug's queue of 128
    overflowed, and each connection the kernel dropped was retried 1, 3, 7, 15 s later."""
    with MotoS3() as moto:
        served = moto._server._server  # werkzeug's server, in moto's
        assert served is not None
        info = served.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        assert struct.unpack_from("II", info, 24)[1] >= 1024  # tcpi_sacked: the queue's size
