"""The generic fsspec store: ``memory://`` (atomic in-process) and a non-atomic protocol."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from plancache import PlanStore, PutOutcome, open_store
from plancache._backends import open_layer
from plancache._backends.generic import FsspecStore
from plancache._keys import plan_object_name
from plancache.testing import StoreContract, make_plan
from plancache.testing.contract import StoreSpec, WriteRaw


class PlainFileSystem(MemoryFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """An in-memory filesystem under another protocol: stands in for sftp://, abfs://, ..."""

    protocol = "plancachetest"
    store: dict[str, Any] = {}  # noqa: RUF012 (fsspec's convention: class-level contents)
    pseudo_dirs = [""]  # noqa: RUF012


fsspec.register_implementation("plancachetest", PlainFileSystem, clobber=True)


class TestMemoryContract(StoreContract):
    supports_processes = False

    @pytest.fixture
    def store_spec(self) -> Iterator[StoreSpec]:
        root = f"memory://{uuid.uuid4().hex}/plans"
        yield root, {}
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)

    @pytest.fixture
    def write_raw(self, store_spec: StoreSpec) -> WriteRaw:
        return pipe_into(store_spec[0])


class TestNonAtomicProtocolContract(StoreContract):
    """Passes within one process (writes are serialised by a process-wide lock); across
    processes it is not atomic, so the process race is skipped (documented exception)."""

    supports_processes = False

    @pytest.fixture
    def store_spec(self) -> StoreSpec:
        return f"plancachetest://{uuid.uuid4().hex}/plans", {}

    @pytest.fixture
    def write_raw(self, store_spec: StoreSpec) -> WriteRaw:
        return pipe_into(store_spec[0])


def pipe_into(root: str) -> WriteRaw:
    """Writes a record's file under the fsspec URL ``root`` with fsspec itself."""
    fs, path = fsspec.core.url_to_fs(root)
    return lambda fp, data: fs.pipe_file(f"{path}/{plan_object_name(fp)}", data)


def test_memory_is_atomic_and_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="plancache")
    store = open_layer(f"memory://{uuid.uuid4().hex}")
    assert isinstance(store, FsspecStore) and store.atomic
    assert not caplog.records


def test_other_protocols_are_not_atomic_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="plancache")
    store = open_layer(f"plancachetest://{uuid.uuid4().hex}/p")
    assert isinstance(store, FsspecStore) and not store.atomic
    plan = make_plan()
    plans = PlanStore(store)
    assert plans.put(plan) is PutOutcome.CREATED
    assert plans.put(make_plan(kv=11 << 30)) is PutOutcome.REPLACED
    assert plans.get(plan.fingerprint) is not None
    warnings = [r for r in caplog.records if "atomic" in r.getMessage()]
    assert len(warnings) == 1
    assert store.url in warnings[0].getMessage()


def test_unknown_scheme_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown store scheme"):
        open_store("nosuchproto://x/y")
