"""The object layer every backend implements (``plancache.ObjectLayer``), on a local
directory, S3 (moto) and GCS (fake-gcs-server behind a proxy that deletes as GCS does), with
objects of one part and of several: create-if-absent, update-if-version, conditional and
unconditional deletes, bounded streams, prefix listings, nothing visible of a failed write."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from plancache import CREATE, ObjectLayer, Update
from plancache._backends import open_layer
from plancache._objects import PART_BYTES
from plancache.testing.servers import MotoS3

SMALL = b"small object"
LARGE = os.urandom(2 * PART_BYTES + 123)  # three parts: a multipart / resumable upload


@pytest.fixture(params=["local", "s3", "gcs"])
def layer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectLayer]:
    if request.param == "local":
        store = open_layer(str(tmp_path / "objects"))
    elif request.param == "s3":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        bucket = request.getfixturevalue("s3_bucket")
        store = open_layer(f"s3://{bucket}/objects", endpoint_url=moto.endpoint)
    else:
        endpoint = request.getfixturevalue("gcs_endpoint")
        bucket = request.getfixturevalue("gcs_bucket")
        store = open_layer(f"gs://{bucket}/objects", endpoint_url=endpoint, token="anon")
    yield store
    store.close()


def _read_all(layer: ObjectLayer, name: str) -> bytes:
    opened = layer.open_object(name)
    assert opened is not None
    try:
        chunks = []
        while chunk := opened.read(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        opened.close()


@pytest.mark.parametrize("data", [SMALL, LARGE], ids=["one-part", "three-parts"])
def test_create_only_if_absent_and_update_only_if_unchanged(
    layer: ObjectLayer, data: bytes
) -> None:
    assert layer.read_object("a", 100) is None and layer.open_object("a") is None
    assert layer.write_object("a", iter([data[:10], data[10:]]), CREATE)
    assert not layer.write_object("a", [b"other"], CREATE)  # exists: refused
    assert _read_all(layer, "a") == data
    found = layer.read_object("a", len(data) + 1)
    assert found is not None and found[0] == data
    assert layer.write_object("a", [data[::-1]], Update(found[1]))
    assert not layer.write_object("a", [b"stale"], Update(found[1]))  # its version is gone
    assert _read_all(layer, "a") == data[::-1]
    assert layer.read_object("a", 5) is not None
    assert layer.read_object("a", 5)[0] == data[::-1][:5]  # type: ignore[index]


def test_a_conditional_delete_keeps_what_was_written_after_the_judging_read(
    layer: ObjectLayer,
) -> None:
    assert layer.write_object("x", [b"old"])
    opened = layer.open_object("x")
    assert opened is not None
    judged = opened.version
    opened.close()
    assert layer.delete_object("x")  # another writer replaces it meanwhile
    assert layer.write_object("x", [b"new"])
    assert not layer.delete_object("x", judged)
    assert _read_all(layer, "x") == b"new"
    found = layer.read_object("x", 100)
    assert found is not None and layer.delete_object("x", found[1])
    assert layer.read_object("x", 100) is None
    assert not layer.delete_object("x") and not layer.delete_object("x", found[1])


def test_listings_filter_by_prefix(layer: ObjectLayer) -> None:
    for name in ("kind_a_1", "kind_a_2", "kind_b_1"):
        assert layer.write_object(name, [name.encode()])
    assert sorted(layer.list_objects("kind_a_")) == ["kind_a_1", "kind_a_2"]
    assert sorted(layer.list_objects("")) == ["kind_a_1", "kind_a_2", "kind_b_1"]


def test_a_write_whose_chunks_fail_leaves_no_object(layer: ObjectLayer) -> None:
    def broken() -> Iterator[bytes]:
        yield LARGE
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError):
        layer.write_object("torn", broken())
    assert layer.read_object("torn", 10) is None
    assert list(layer.list_objects("torn")) == []


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 256])
def test_names_that_name_no_object_are_refused(layer: ObjectLayer, name: str) -> None:
    with pytest.raises(ValueError, match="not an object name"):
        layer.write_object(name, [b"x"])
