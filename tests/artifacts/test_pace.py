"""Never slower than compiling: a fetch over a slow link gives up as soon as the rate it sees
cannot beat the producer's recorded compile time, and nothing is installed once the boot
stopped waiting. Real S3 (moto) behind a proxy that sends bodies at a set rate."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from plancache import _background as background
from plancache._artifacts.engine import CompileSettings
from plancache._artifacts.pacing import join_fetch
from plancache._artifacts.store import ArtifactStore
from plancache._config import Settings
from plancache._defaults import FIRST_ANSWER_S, JOIN_S, MIN_PACE_S
from plancache.testing.servers import CountingProxy, MotoS3
from tests.artifacts.helpers import KEY, RANK, make_tree

RATE = 512 << 10
"""Bytes per second of the slow link: the 4 MiB artifact takes 8 s."""


def _store(url: str, endpoint: str) -> ArtifactStore:
    options = {"endpoint_url": endpoint, "timeout": 60.0}
    settings = Settings(url, storage_options=options, timeout=60.0, trust_preconditions=True)
    return ArtifactStore(settings, CompileSettings(trust_unsigned=True, fetch_timeout=60.0))


@pytest.fixture
def stored(tmp_path: Path, moto_s3: MotoS3, s3_bucket: str) -> Any:
    """Upload an incompressible 4 MiB artifact whose producer compiled in ``compile_s``."""
    url = f"s3://{s3_bucket}/pace"

    def upload(compile_s: float) -> str:
        root = make_tree(tmp_path / f"src-{compile_s}", model=os.urandom(4 << 20))
        made = {"host": "producer", "compile_s": compile_s}
        assert _store(url, moto_s3.endpoint).upload(root, KEY, RANK, None, made)["store"]
        return url

    return upload


def test_a_fetch_that_cannot_beat_compiling_gives_up_early(
    tmp_path: Path, moto_s3: MotoS3, stored: Any
) -> None:
    url = stored(2.0)  # the link needs 8 s: compiling (2 s) wins
    with CountingProxy(moto_s3.endpoint, bytes_per_s=RATE) as slow:
        start = time.monotonic()
        fetched = _store(url, slow.endpoint).fetch(tmp_path / "node" / KEY, KEY, RANK)
        took = time.monotonic() - start
    # "slow", not "timeout" (the 60 s bound) nor "hit" (the 8 s transfer done): it gave up
    # once the rate was seen, after its first MIN_PACE_S of streaming
    assert fetched.reason == "slow"
    assert took >= MIN_PACE_S, took
    assert not (tmp_path / "node" / KEY / RANK).exists()


def test_a_fetch_that_beats_compiling_goes_on(tmp_path: Path, moto_s3: MotoS3, stored: Any) -> None:
    url = stored(60.0)
    with CountingProxy(moto_s3.endpoint, bytes_per_s=4 * RATE) as slow:
        fetched = _store(url, slow.endpoint).fetch(tmp_path / "node" / KEY, KEY, RANK)
    assert fetched.reason == "hit" and (tmp_path / "node" / KEY / RANK / "model").exists()


def test_nothing_is_installed_once_the_boot_stopped_waiting(
    tmp_path: Path, moto_s3: MotoS3, stored: Any
) -> None:
    url = stored(60.0)
    stop_at = time.monotonic() + 1.0
    with CountingProxy(moto_s3.endpoint, bytes_per_s=4 * RATE) as slow:
        fetched = _store(url, slow.endpoint).fetch(
            tmp_path / "node" / KEY, KEY, RANK, cancelled=lambda: time.monotonic() > stop_at
        )
    assert fetched.reason == "timeout"
    assert not (tmp_path / "node" / KEY / RANK).exists()
    late = time.monotonic() + 60
    fetched = _store(url, moto_s3.endpoint).fetch(
        tmp_path / "other" / KEY, KEY, RANK, deadline=late, cancelled=lambda: False
    )
    assert fetched.reason == "hit"


def test_a_boot_at_its_first_forward_waits_for_a_store_only_while_it_streams(
    tmp_path: Path, moto_s3: MotoS3, stored: Any
) -> None:
    """``join_fetch``: a store that has not begun to stream by the first forward is waited
    for ``JOIN_S`` more, or until ``FIRST_ANSWER_S`` from the fetch's start where the first
    forward came sooner (then the fetch is cancelled); one that streams an accepted artifact
    is waited for until it ends."""
    url = stored(60.0)
    with CountingProxy(moto_s3.endpoint, delay_s=20.0) as silent:
        node = _store(url, silent.endpoint)
        cancelled, streaming = threading.Event(), threading.Event()
        start = time.monotonic()
        job = background.start(
            lambda: node.fetch(
                tmp_path / "a" / KEY, KEY, RANK, cancelled=cancelled.is_set, streaming=streaming
            )
        )
        assert not join_fetch(job, start + 60, streaming, cancelled, start)
        waited = time.monotonic() - start  # the store's time to answer, from the fetch's start
        assert FIRST_ANSWER_S <= waited < FIRST_ANSWER_S + 1.0 and cancelled.is_set()
        late, cancelled = time.monotonic(), threading.Event()  # a join long after the start
        job = background.start(
            lambda: node.fetch(tmp_path / "c" / KEY, KEY, RANK, cancelled=cancelled.is_set)
        )
        assert not join_fetch(job, late + 60, streaming, cancelled, late - 30)
        assert JOIN_S <= time.monotonic() - late < JOIN_S + 1.0 and cancelled.is_set()
    with CountingProxy(moto_s3.endpoint, bytes_per_s=4 * RATE) as slow:  # about 2 s
        node = _store(url, slow.endpoint)
        cancelled, streaming = threading.Event(), threading.Event()
        job = background.start(
            lambda: node.fetch(
                tmp_path / "b" / KEY, KEY, RANK, cancelled=cancelled.is_set, streaming=streaming
            )
        )
        assert join_fetch(job, time.monotonic() + 60, streaming, cancelled)
        assert job.wait(0).reason == "hit" and streaming.is_set() and not cancelled.is_set()
