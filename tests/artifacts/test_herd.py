"""A rollout's herd: many nodes that compiled the same key upload it once. Each looks before
streaming, and only the node holding the upload claim streams; a claim whose holder died
expires. Real S3 (moto) behind a proxy that counts the bytes sent."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.manifest import artifact_object_name
from plancache._artifacts.store import ArtifactStore
from plancache._claims import CLAIM_SUFFIX, claim
from plancache._config import Settings
from plancache.testing import LocalLayer as LocalStore
from plancache.testing.servers import CountingProxy
from tests.artifacts.helpers import KEY, RANK, make_tree, stream
from tests.cli.helpers import ok

SIZE = 4 << 20


def _node(url: str, endpoint: str) -> ArtifactStore:
    options = {"endpoint_url": endpoint, "timeout": 60.0}
    settings = Settings(url, storage_options=options, timeout=60.0, trust_preconditions=True)
    return ArtifactStore(settings, CompileSettings(trust_unsigned=True))


@pytest.mark.parametrize(
    "herd",
    [16, pytest.param(64, marks=pytest.mark.slow), pytest.param(256, marks=pytest.mark.slow)],
)
def test_a_herd_sends_the_artifact_about_once(
    tmp_path: Path, s3_proxy: CountingProxy, s3_bucket: str, herd: int
) -> None:
    root = make_tree(tmp_path / "key", model=os.urandom(SIZE))
    artifact = len(stream(root).getvalue())
    url = f"s3://{s3_bucket}/fleet"
    nodes = [_node(url, s3_proxy.endpoint) for _ in range(herd)]
    outcomes: list[bool] = []
    barrier = threading.Barrier(len(nodes))

    def upload(node: ArtifactStore) -> None:
        barrier.wait()
        outcomes.append(node.upload(root, KEY, RANK)["store"])

    threads = [threading.Thread(target=upload, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(outcomes) == [False] * (herd - 1) + [True]
    sent = s3_proxy.received_bytes
    assert sent <= 1.2 * artifact, (sent, artifact)  # was 16x before claims
    later = _node(url, s3_proxy.endpoint)
    s3_proxy.reset()
    assert later.upload(root, KEY, RANK) == {"store": False}
    assert s3_proxy.received_bytes < 4096  # a late node looks and streams nothing
    assert later.fetch(tmp_path / "new" / KEY, KEY, RANK).reason == "hit"


def test_a_claim_blocks_until_it_expires(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "store"))
    name = artifact_object_name(KEY, RANK)
    now = time.time()
    held = claim(store, name, 0, now=now)
    assert held is not None
    assert claim(store, name, 0, now=now + 60) is None  # live: another node uploads
    taken = claim(store, name, 0, now=now + 3600)  # its holder died: taken over
    assert taken is not None and taken != held
    body = orjson.loads((tmp_path / "store" / (name + CLAIM_SUFFIX)).read_bytes())
    assert body["until"] > now + 3600
    (tmp_path / "store" / (name + CLAIM_SUFFIX)).write_bytes(b"garbage")
    assert claim(store, name, 0, now=now) is not None  # unreadable: expired


def test_a_node_uploads_where_the_claim_holder_died(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "key")
    store = str(tmp_path / "store")
    settings = Settings(store)
    artifacts = ArtifactStore(settings, CompileSettings())
    name = artifact_object_name(KEY, RANK)
    assert claim(LocalStore(store), name, 0) is not None  # a node that then died
    assert artifacts.upload(root, KEY, RANK) == {"store": False}
    stale = orjson.dumps({"host": "dead", "pid": 1, "until": time.time() - 1})
    (tmp_path / "store" / (name + CLAIM_SUFFIX)).write_bytes(stale)
    assert artifacts.upload(root, KEY, RANK) == {"store": True}
    assert not (tmp_path / "store" / (name + CLAIM_SUFFIX)).exists()  # released


def test_a_claim_dated_a_year_ahead_blocks_nothing_and_prune_removes_it(tmp_path: Path) -> None:
    """Claims are unsigned: one dated a year ahead blocked an artifact's sharing for a year
    (every node counted its write as kept). Now a claim later than any node could write is
    taken over at once; ``ls`` shows claims and ``prune --older-than 0s`` removes the stale
    ones, never a live one."""
    store = LocalStore(tmp_path / "store")
    now = time.time()
    name = artifact_object_name("a" * 64, RANK)
    forged = orjson.dumps({"host": "x", "pid": 1, "until": now + 365 * 86400})
    assert store.write_object(name + CLAIM_SUFFIX, [forged])
    assert claim(store, name, 10 << 20, now=now) is not None  # taken over
    live = artifact_object_name("b" * 64, RANK)
    assert claim(store, live, 10 << 20, now=now) is not None
    assert claim(store, live, 10 << 20, now=now + 60) is None  # a believable one holds
    stale = artifact_object_name("c" * 64, RANK)
    assert store.write_object(stale + CLAIM_SUFFIX, [forged])
    listed = ok("ls", str(tmp_path / "store"))
    assert f"{stale}{CLAIM_SUFFIX}  x  stale" in listed and f"{live}{CLAIM_SUFFIX}" in listed
    pruned = ok("prune", str(tmp_path / "store"), "--older-than", "0s")
    assert "deleted 1 stale upload claim\n" in pruned
    left = sorted(n for n in store.list_objects("") if n.endswith(CLAIM_SUFFIX))
    assert left == [name + CLAIM_SUFFIX, live + CLAIM_SUFFIX]  # the two live ones
