"""The model-info kind (vLLM's ``modelinfos/`` files) on the object layer, without vLLM: its
key and envelope, atomic install never over a node's own file, the trust rules of compile
artifacts, local and S3 stores."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from plancache._artifacts import modelinfo
from plancache._signing import Keyring
from plancache.errors import ArtifactError, UnreadableHereError
from plancache.testing.servers import MotoS3
from tests.artifacts.helpers import artifact_store

K1 = "k1-" + "a" * 30
HASH = "f" * 64
FILE: dict[str, Any] = {"hash": HASH, "modelinfo": {"is_text_generation_model": True}}
WHERE = ("0.33.0", "vllm.model_executor.models.llama", "LlamaForCausalLM")


@pytest.fixture(autouse=True)
def _node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "node"))


def _info(keyring: Keyring | None = None, file: dict[str, Any] = FILE) -> modelinfo.ModelInfo:
    return modelinfo.made(*WHERE, file, keyring or Keyring())


def test_the_key_is_vllms_hash_of_the_source_the_class_and_vllms_version() -> None:
    names = {
        modelinfo.model_info_object_name(*WHERE, HASH),
        modelinfo.model_info_object_name("0.32.0", *WHERE[1:], HASH),
        modelinfo.model_info_object_name(WHERE[0], WHERE[1], "Other", HASH),
        modelinfo.model_info_object_name(*WHERE, "0" * 64),
    }
    assert len(names) == 4 and all(n.startswith("model_info_") for n in names)
    assert _info().name == modelinfo.model_info_object_name(*WHERE, HASH)


def test_envelopes_are_checked_on_every_decode() -> None:
    info = _info()
    assert modelinfo.ModelInfo.decode(info.encode()) == info
    newer = {**orjson.loads(info.encode()), "format": 2}
    with pytest.raises(UnreadableHereError, match="newer"):
        modelinfo.ModelInfo.decode(orjson.dumps(newer))
    for bad in (b"not json", b"[]", orjson.dumps({"format": 1}), b"x" * (300 * 1024)):
        with pytest.raises(ArtifactError):
            modelinfo.ModelInfo.decode(bad)


def test_a_new_node_gets_the_file_and_keeps_its_own(tmp_path: Path) -> None:
    shared = artifact_store(str(tmp_path / "store"))
    assert shared.upload_model_info(_info()) == {"store": True}
    assert shared.upload_model_info(_info()) == {"store": False}  # create-if-absent
    target = tmp_path / "new" / "modelinfos" / "llama.json"
    fetched = shared.fetch_model_info(_info().name, HASH, target)
    assert fetched.reason == "hit" and orjson.loads(target.read_bytes()) == FILE
    target.write_bytes(b'{"hash": "mine"}')
    assert shared.fetch_model_info(_info().name, HASH, target).reason == "present"
    assert target.read_bytes() == b'{"hash": "mine"}'  # never over the node's own
    other = modelinfo.model_info_object_name(*WHERE, "0" * 64)
    assert shared.fetch_model_info(other, "0" * 64, tmp_path / "x.json").reason == "miss"


def test_a_file_for_another_source_or_a_tampered_one_is_never_installed(tmp_path: Path) -> None:
    shared = artifact_store(str(tmp_path / "store"))
    info = _info()
    (tmp_path / "store").mkdir()
    lying = {**orjson.loads(info.encode()), "file": {**FILE, "hash": "0" * 64}}
    (tmp_path / "store" / info.name).write_bytes(orjson.dumps(lying))
    target = tmp_path / "n" / "f.json"
    assert shared.fetch_model_info(info.name, HASH, target).reason == "invalid"
    assert not target.exists()


def test_trust_follows_compile_artifacts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "store"
    artifact_store(str(store)).upload_model_info(_info())
    keyed = artifact_store(str(store), Keyring(verify_keys=[K1]))
    target = tmp_path / "n" / "f.json"
    assert keyed.fetch_model_info(_info().name, HASH, target).reason == "invalid"  # unsigned
    os.unlink(store / _info().name)
    artifact_store(str(store), Keyring(K1)).upload_model_info(_info(Keyring(K1)))
    assert keyed.fetch_model_info(_info().name, HASH, target).reason == "hit"
    target.unlink()
    os.unlink(store / _info().name)
    artifact_store(str(store)).upload_model_info(_info())
    store.chmod(0o777)  # others could have planted it
    with caplog.at_level(logging.WARNING, logger="plancache"):
        fetched = artifact_store(str(store)).fetch_model_info(_info().name, HASH, target)
    assert fetched.reason == "untrusted" and not target.exists()
    assert [r for r in caplog.records if str(store) in r.getMessage()]


def test_a_remote_store_is_trusted_unsigned_only_when_told(
    tmp_path: Path, moto_s3: MotoS3, s3_bucket: str
) -> None:
    url, options = f"s3://{s3_bucket}/fleet", {"endpoint_url": moto_s3.endpoint, "timeout": 30.0}
    producer = artifact_store(url, options=options, trust_unsigned=True)
    assert producer.upload_model_info(_info()) == {"store": True}
    target = tmp_path / "n" / "f.json"
    plain = artifact_store(url, options=options)
    assert plain.fetch_model_info(_info().name, HASH, target).reason == "untrusted"
    assert not target.exists()
    trusting = artifact_store(url, options=options, trust_unsigned=True)
    assert trusting.fetch_model_info(_info().name, HASH, target).reason == "hit"


def test_read_file_takes_only_a_regular_model_info_file(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_bytes(orjson.dumps(FILE))
    assert modelinfo.read_file(good) == FILE
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert modelinfo.read_file(fifo) is None  # opened without waiting: no writer, no data
    (tmp_path / "other.json").write_bytes(b'{"hash": 1}')
    assert modelinfo.read_file(tmp_path / "other.json") is None
    assert modelinfo.read_file(tmp_path / "missing.json") is None
