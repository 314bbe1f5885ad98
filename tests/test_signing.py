"""Signed plans: keys and key ids, the signature over the canonical encoding, and what readers
and writers with and without keys do with signed and unsigned records (local store, S3 on
moto, and the tiered store); no key ever shows in a log line, message or ``repr``."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from plancache import PlanCache, PlanStore, PutOutcome, open_store
from plancache._backends.local import LocalStore
from plancache._backends.tiered import TieredStore
from plancache._config import Settings, keyring_from_env
from plancache._inventory.plans import copy, prune, verify
from plancache._keys import plan_object_name
from plancache._merge import frontier
from plancache._plan import Plan, Signature
from plancache._reasons import Reason
from plancache._signing import MIN_KEY_CHARS, NO_KEYS, Keyring, SignatureVerdict, key_id, parse_keys
from plancache.errors import (
    ConfigError,
    InvalidPlanError,
    InvalidSignatureError,
    PlanStorePermissionError,
)
from plancache.testing import FACTORS, GiB, make_plan
from plancache.testing.contract import race
from plancache.testing.plans import newer_schema_record
from plancache.testing.servers import MotoS3

OLD = secrets.token_hex(32)
NEW = secrets.token_hex(32)
OTHER = secrets.token_hex(32)
KEYS = (OLD, NEW, OTHER)
FREE = 80 * GiB
A = make_plan(kv=10 * GiB, baseline=60 * GiB, created_at=1000.0)
B = make_plan(kv=12 * GiB, baseline=70 * GiB, created_at=2000.0)  # incomparable with A
C = make_plan(kv=9 * GiB, baseline=50 * GiB, created_at=3000.0)  # incomparable with both
FP = A.fingerprint

Node = Callable[[Keyring], PlanStore]
"""Opens another handle on the same store, signing and judging with the keyring given."""


@pytest.fixture(params=["local", "s3"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    opened: list[PlanStore] = []

    def open_node(keyring: Keyring) -> PlanStore:
        if request.param == "local":
            store: PlanStore = PlanStore(LocalStore(tmp_path / "shared"))
        else:
            moto: MotoS3 = request.getfixturevalue("moto_s3")
            bucket = request.getfixturevalue("s3_bucket")
            store = open_store(f"s3://{bucket}/plans", endpoint_url=moto.endpoint)
        store.use_keyring(keyring)
        opened.append(store)
        return store

    yield open_node
    for store in opened:
        store.close()


def overwrite(store: PlanStore, fp: str, data: bytes) -> None:
    """Replace the record under ``fp`` by ``data`` verbatim (as anyone who can write the
    bucket could), through the store's own primitives."""
    found = store._read(fp)
    assert found is not None and store._replace(fp, data, found[1])


def edited(raw: bytes, edit: Callable[[dict[str, Any]], object]) -> bytes:
    """``raw`` with ``edit`` applied to its JSON, still a well-formed record."""
    obj = json.loads(raw)
    edit(obj)
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def cache_on(store: PlanStore) -> PlanCache:
    """A cache on ``store`` whose budget a loaded machine cannot exceed (S3 on moto)."""
    return PlanCache(store, timeout=30.0)


def signer(key: str, *verify: str) -> Keyring:
    return Keyring(key, verify)


# -- keys, key ids and the signature ----------------------------------------------------------
def test_key_id_is_derived_from_the_key() -> None:
    expected = hmac.new(OLD.encode(), b"plancache key id", hashlib.sha256).hexdigest()[:16]
    assert key_id(OLD) == expected
    assert len({key_id(k) for k in KEYS}) == 3
    assert key_id(OLD) != hashlib.sha256(OLD.encode()).hexdigest()[:16]  # not the key's hash
    ring = Keyring(NEW, [OLD, OLD])
    assert ring.signing_key_id == key_id(NEW)
    assert ring.key_ids == tuple(sorted([key_id(NEW), key_id(OLD)]))
    assert ring.can_sign and ring.requires_signature
    verify_only = Keyring(verify_keys=[OLD])
    assert not verify_only.can_sign and verify_only.requires_signature
    assert not NO_KEYS.can_sign and not NO_KEYS.requires_signature


def test_a_signature_covers_the_canonical_encoding_without_it() -> None:
    ring = signer(OLD)
    signed = ring.sign(A)
    assert signed == A and signed.signature is not None and A.signature is None
    assert signed.payload() == A.payload() == A.encode()  # unsigned: encoded as before
    mac = hmac.new(OLD.encode(), A.encode(), hashlib.sha256).hexdigest()
    assert signed.signature == Signature(key_id(OLD), mac)
    data = signed.encode()
    assert orjson.loads(data) == orjson.loads(A.encode()) | {
        "signature": {"keyid": key_id(OLD), "hmac_sha256": mac}
    }
    assert data == orjson.dumps(orjson.loads(data), option=orjson.OPT_SORT_KEYS)
    read = Plan.decode(data, expected_fingerprint=FP)
    assert read.signature == signed.signature and ring.verdict(read) is SignatureVerdict.VALID
    assert ring.check(read) is read


def test_every_change_after_signing_breaks_the_signature() -> None:
    ring = signer(OLD)
    raw = ring.sign(make_plan(kv=10 * GiB, baseline=60 * GiB, created_at=1000.0)).encode()
    points = frontier((*A.observations, *B.observations))
    raw_two = ring.sign(Plan(FP, FACTORS, points, {"model": "m"})).encode()

    def kv(obj: dict[str, Any]) -> None:
        obj["observations"][0]["kv_cache_memory_bytes"] -= GiB

    def drop_point(obj: dict[str, Any]) -> None:
        obj["observations"].pop()

    def label(obj: dict[str, Any]) -> None:
        obj["labels"] = {"model": "n"}

    for data, edit in [(raw, kv), (raw_two, drop_point), (raw_two, label)]:
        tampered = Plan.decode(edited(data, edit), expected_fingerprint=FP)  # well formed
        assert ring.verdict(tampered) is SignatureVerdict.BAD_MAC
        with pytest.raises(InvalidSignatureError, match="does not match its content"):
            ring.check(tampered)
    unsigned = Plan.decode(edited(raw, lambda o: o.pop("signature")), expected_fingerprint=FP)
    assert ring.verdict(unsigned) is SignatureVerdict.UNSIGNED
    with pytest.raises(InvalidSignatureError, match="not signed"):
        ring.check(unsigned)
    # another key: unknown id; another key's MAC under this key's id: bad MAC
    theirs = signer(OTHER).sign(A)
    assert ring.verdict(theirs) is SignatureVerdict.UNKNOWN_KEY
    with pytest.raises(InvalidSignatureError, match=f"key {key_id(OTHER)}, not an accepted"):
        ring.check(theirs)
    assert theirs.signature is not None
    forged = A.signed(Signature(key_id(OLD), theirs.signature.hmac_sha256))
    assert ring.verdict(forged) is SignatureVerdict.BAD_MAC
    assert NO_KEYS.check(forged) is forged  # no keys: carried, not judged


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "x",
        {"keyid": "ab"},
        {"keyid": "A" * 16, "hmac_sha256": "0" * 64},
        {"keyid": "0" * 16, "hmac_sha256": "0" * 63},
    ],
)
def test_a_malformed_signature_makes_the_record_invalid(signature: object) -> None:
    data = orjson.dumps(A.to_dict() | {"signature": signature})
    with pytest.raises(InvalidPlanError, match="signature"):
        Plan.decode(data)


# -- settings ---------------------------------------------------------------------------------
def test_keys_from_variables_and_files(tmp_path: Path) -> None:
    assert keyring_from_env({}) is NO_KEYS
    assert Settings.from_env({}).keyring is NO_KEYS
    ring = keyring_from_env(
        {"PLANCACHE_SIGNING_KEY": f" {NEW}\n", "PLANCACHE_VERIFY_KEYS": f"{OLD}, {OTHER}"}
    )
    assert ring == Keyring(NEW, [OLD, OTHER])
    key_file, verify_file = tmp_path / "key", tmp_path / "verify"
    key_file.write_text(NEW + "\n")
    verify_file.write_text(f"# retired 2026-11\n{OLD}\n\n{OTHER}\n")
    env = {
        "PLANCACHE_SIGNING_KEY_FILE": str(key_file),
        "PLANCACHE_VERIFY_KEYS_FILE": str(verify_file),
    }
    assert Settings.from_env(env).keyring == ring
    assert keyring_from_env({"PLANCACHE_VERIFY_KEYS": OLD}) == Keyring(verify_keys=[OLD])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PLANCACHE_SIGNING_KEY": "short-secret"}, "PLANCACHE_SIGNING_KEY: key 1 has 12"),
        ({"PLANCACHE_VERIFY_KEYS": f"{OLD},tiny-secret"}, "PLANCACHE_VERIFY_KEYS: key 2 has 11"),
        ({"PLANCACHE_SIGNING_KEY": f"{OLD} {NEW}"}, "holds 2 keys; it takes one"),
        ({"PLANCACHE_SIGNING_KEY": OLD, "PLANCACHE_SIGNING_KEY_FILE": "/k"}, "not both"),
        (
            {"PLANCACHE_SIGNING_KEY_FILE": "/nonexistent/key"},
            "cannot read PLANCACHE_SIGNING_KEY_FILE '/nonexistent/key': No such file",
        ),
    ],
)
def test_bad_keys_name_the_variable_never_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env(env)
    for value in env.values():
        for word in value.replace(",", " ").split():
            if len(word) > 4 and not word.startswith("/"):
                assert word not in str(info.value)
    with pytest.raises(ConfigError, match=f"at least {MIN_KEY_CHARS}") as direct:
        Keyring("short-secret")
    assert "short-secret" not in str(direct.value)
    assert parse_keys("# only a comment\n\n", "X", comments=True) == []


def test_a_hash_starts_a_comment_in_key_files_only(tmp_path: Path) -> None:
    """In a variable, ``#`` is a key character: a key that starts with it signs, and an
    unsigned record is not applied. In a key file, a word that starts with ``#`` begins a
    comment that runs to the end of its line."""
    hashed = "#" + OLD
    assert keyring_from_env({"PLANCACHE_SIGNING_KEY": hashed}) == Keyring(hashed)
    ring = keyring_from_env({"PLANCACHE_VERIFY_KEYS": f"{NEW},{hashed}"})
    assert ring == Keyring(verify_keys=[NEW, hashed])
    key_file = tmp_path / "keys"
    key_file.write_text(f"# retired 2026-11\n  {hashed}\n{NEW}  # the fleet's, {OTHER}\n")
    key_file.chmod(0o600)
    from_file = keyring_from_env({"PLANCACHE_VERIFY_KEYS_FILE": str(key_file)})
    assert from_file == Keyring(verify_keys=[NEW])
    PlanStore(LocalStore(tmp_path / "plans")).put(A)  # unsigned
    env = {"PLANCACHE_URL": str(tmp_path / "plans"), "PLANCACHE_SIGNING_KEY": hashed}
    cache = PlanCache.from_env(env | {"PLANCACHE_TIMEOUT": "30"})
    assert cache.lookup(FACTORS, FREE).reason is Reason.INVALID_SIGNATURE
    recorded = cache.record(FACTORS, kv_cache_memory_bytes=GiB, free_memory_baseline=70 * GiB)
    assert recorded.outcome is PutOutcome.REPLACED
    stored = cache.store.get(FP)
    assert stored is not None and stored.signature is not None
    assert stored.signature.keyid == key_id(hashed)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PLANCACHE_SIGNING_KEY": "\u2003" * 24}, "PLANCACHE_SIGNING_KEY: key 1 holds whitespace"),
        ({"PLANCACHE_VERIFY_KEYS": f"{OLD}\u3000{NEW}"}, "PLANCACHE_VERIFY_KEYS: key 1 holds"),
        ({"PLANCACHE_VERIFY_KEYS": f"{OLD},\x1b[0m{NEW}"}, "PLANCACHE_VERIFY_KEYS: key 2 holds"),
        ({"PLANCACHE_SIGNING_KEY": ""}, "PLANCACHE_SIGNING_KEY is set but holds no key;"),
        ({"PLANCACHE_VERIFY_KEYS": " ,\n\t"}, "PLANCACHE_VERIFY_KEYS is set but holds no key;"),
        ({"PLANCACHE_VERIFY_KEYS": OLD, "PLANCACHE_SIGNING_KEY": ""}, "SIGNING_KEY is set but"),
        ({"PLANCACHE_SIGNING_KEY": "", "PLANCACHE_SIGNING_KEY_FILE": "/k"}, "not both"),
        ({"PLANCACHE_SIGNING_KEY_FILE": "comments"}, "SIGNING_KEY_FILE is set but holds no key"),
        ({"PLANCACHE_VERIFY_KEYS_FILE": "empty"}, "VERIFY_KEYS_FILE is set but holds no key"),
    ],
)
def test_a_key_setting_without_a_usable_key_is_an_error(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    """A key variable or file that is set but yields no usable key (Unicode spaces, control
    characters, nothing at all, comments only) never means "no signing"."""
    for name, text in {"comments": f"# {OLD}\n   #{NEW}\n", "empty": ""}.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o600)
    env = {k: str(tmp_path / v) if k.endswith("_FILE") and v != "/k" else v for k, v in env.items()}
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        keyring_from_env(env)
    assert OLD not in str(info.value) and NEW not in str(info.value)


# -- readers ----------------------------------------------------------------------------------
def test_readers_never_apply_tampered_unsigned_or_foreign_records(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "plancache")
    writer, reader, plain = node(signer(OLD)), node(signer(OLD)), node(NO_KEYS)
    assert (
        cache_on(writer)
        .record(A.factors, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=60 * GiB)
        .outcome
        is PutOutcome.CREATED
    )
    cache = cache_on(reader)
    assert cache.lookup(FACTORS, FREE).reason is Reason.HIT
    raw = reader.read_raw(FP)
    assert raw is not None

    def kv(obj: dict[str, Any]) -> None:
        obj["observations"][0]["kv_cache_memory_bytes"] += GiB

    cases = [
        (edited(raw, kv), "does not match its content"),  # one observation's KV changed
        (A.encode(), "not signed"),  # the signature left out
        (signer(OTHER).sign(A).encode(), "not an accepted one"),  # another key
    ]
    for data, why in cases:
        overwrite(plain, FP, data)
        d = cache.lookup(FACTORS, FREE)
        assert (d.reason, d.kv_cache_memory_bytes, d.plan) == (Reason.INVALID_SIGNATURE, None, None)
        assert why in d.detail
        with pytest.raises(InvalidSignatureError):
            reader.get(FP)
        assert plain.get(FP) is not None  # a reader with no keys reads it as usual
        assert cache_on(plain).lookup(FACTORS, FREE).reason is Reason.HIT
    warnings = [r for r in caplog.records if "lookup invalid:signature" in r.getMessage()]
    assert len(warnings) == 3 and all(r.levelno == logging.WARNING for r in warnings)


# -- writers ----------------------------------------------------------------------------------
def test_a_signed_write_replaces_an_untrusted_record_without_its_observations(node: Node) -> None:
    plain, writer = node(NO_KEYS), node(signer(OLD))
    for untrusted in (A, signer(OTHER).sign(A)):
        writer.delete(FP)
        assert plain.put(untrusted) is PutOutcome.CREATED
        outcome, stored = writer.put_merged(B)
        assert outcome is PutOutcome.REPLACED and stored is not None
        assert stored.observations == B.observations  # A's observation is not trusted
        read = writer.get(FP)
        assert read is not None and read.observations == B.observations
        assert read.signature is not None and read.signature.keyid == key_id(OLD)
    raw = writer.read_raw(FP)
    assert raw is not None
    overwrite(plain, FP, edited(raw, lambda o: o["labels"].update(model="evil")))
    assert writer.put_merged(C)[1] == C  # a tampered record counts as untrusted too


def test_a_record_of_another_schema_no_accepted_key_signed_never_blocks_a_signed_write(
    node: Node,
) -> None:
    """A planted ``{"schema": 3}`` (unsigned, signed by another key, or changed after
    signing) is replaced by the next signed write through the compare-and-swap; writers
    without keys, and unsigned writes, keep it as before; a newer version's record that an
    accepted key signed is never overwritten."""
    plain = node(NO_KEYS)
    ours = newer_schema_record(FP, OLD, points=[1, 2.5])
    changed = edited(ours, lambda o: o.update(points=[2, 2.5]))  # after signing
    unsigned, theirs = newer_schema_record(FP), newer_schema_record(FP, OTHER)
    deep = b'{"schema": 3, "x": ' + b"[" * 600 + b"]" * 600 + b"}"  # too deep to re-encode
    for planted in (unsigned, theirs, changed, b'{"schema": 3}', deep):
        plain.delete(FP)
        assert plain._create(FP, planted)
        assert plain.put(A) is PutOutcome.KEPT  # without keys: never overwritten
        assert node(Keyring(verify_keys=[OLD])).put(A) is PutOutcome.KEPT  # an unsigned write
        assert plain.read_raw(FP) == planted
        outcome, stored = node(signer(OLD)).put_merged(B)
        assert outcome is PutOutcome.REPLACED and stored == B
        assert stored.signature is not None and stored.signature.keyid == key_id(OLD)
        assert cache_on(node(signer(OLD))).lookup(FACTORS, FREE).kv_cache_memory_bytes == 12 * GiB
    plain.delete(FP)
    assert plain._create(FP, theirs)
    verify_only = node(Keyring(verify_keys=[OLD]))
    assert verify_only.put(signer(OLD).sign(A)) is PutOutcome.REPLACED  # a signed copy
    plain.delete(FP)
    assert plain._create(FP, ours)
    assert node(signer(NEW, OLD)).put_merged(B) == (PutOutcome.KEPT, None)
    assert node(signer(NEW, OLD)).put_merged(C) == (PutOutcome.KEPT, None)
    assert plain.read_raw(FP) == ours


def test_an_unsigned_writer_never_strips_a_signature(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    writer, plain = node(signer(OLD)), node(NO_KEYS)
    writer.put(A)
    writer.put(B)
    raw = writer.read_raw(FP)
    with caplog.at_level(logging.WARNING, "plancache"):
        assert plain.put(C) is PutOutcome.KEPT  # would merge: keeps the signed record instead
    assert "is signed and this writer holds no signing key" in caplog.text
    assert plain.put(A) is PutOutcome.KEPT
    with pytest.raises(PlanStorePermissionError, match="needs the signing key"):
        plain.retract(FP, A.observations[0])
    with pytest.raises(PlanStorePermissionError):
        prune(plain, older_than=1000.0, now=2500.0)  # would drop A and keep B
    assert writer.read_raw(FP) == raw
    # a reader with keys still applies it; one without reads it as usual
    assert cache_on(node(signer(OLD))).lookup(FACTORS, FREE).kv_cache_memory_bytes == 12 * GiB
    assert cache_on(plain).lookup(FACTORS, FREE).kv_cache_memory_bytes == 12 * GiB
    # a signed record copied whole keeps its signature: an unsigned writer may pass it on
    newer = writer.get(FP)
    assert newer is not None and newer.signature is not None
    elsewhere = node(NO_KEYS)
    elsewhere.delete(FP)
    assert elsewhere.put(newer) is PutOutcome.CREATED
    assert elsewhere.read_raw(FP) == newer.encode()
    assert node(signer(OLD)).get(FP) == newer


def test_signed_copies_pass_through_writers_without_a_signing_key(node: Node) -> None:
    """A writer without a signing key (no keys, or verify keys only) writes a signed record
    it is handed whole, signature and all, but never one signed by a key it does not
    accept over a record it does."""
    node(signer(OLD)).put(A)
    both = signer(OLD).sign(Plan(FP, FACTORS, frontier((*A.observations, *B.observations))))
    assert node(NO_KEYS).put(both) is PutOutcome.REPLACED  # e.g. a tier's backfill, `cp`
    assert node(NO_KEYS).read_raw(FP) == both.encode()
    verify_only = node(Keyring(verify_keys=[OLD]))
    three = Plan(FP, FACTORS, frontier((*both.observations, *C.observations)))
    assert verify_only.put(signer(OLD).sign(three)) is PutOutcome.REPLACED
    better = make_plan(kv=20 * GiB, baseline=40 * GiB)  # dominates every point
    assert verify_only.put(signer(OTHER).sign(better)) is PutOutcome.KEPT
    assert verify_only.put(better) is PutOutcome.KEPT
    assert verify_only.get(FP) == three


def test_a_store_shared_with_unsigned_writers_converges_on_a_signed_record(node: Node) -> None:
    """Unsigned and signing writers take turns on one record: the signing ones replace what
    the unsigned ones wrote, and the unsigned ones leave the signed record alone."""
    plain, signing = node(NO_KEYS), node(signer(OLD))
    assert plain.put(A) is PutOutcome.CREATED
    assert plain.put(C) is PutOutcome.REPLACED  # unsigned writers merge as before
    assert signing.put(B) is PutOutcome.REPLACED  # drops the unsigned A and C
    assert plain.put(A) is PutOutcome.KEPT
    assert signing.put(C) is PutOutcome.REPLACED  # signed C joins the signed B
    final = signing.get(FP)
    assert final is not None and final.observations == frontier((*B.observations, *C.observations))
    assert final.signature is not None and final.signature.keyid == key_id(OLD)
    for reader in (node(signer(OLD)), node(NO_KEYS)):
        assert cache_on(reader).lookup(FACTORS, FREE).kv_cache_memory_bytes == 12 * GiB


def test_without_keys_records_are_byte_identical(tmp_path: Path) -> None:
    settings = Settings.from_env({"PLANCACHE_URL": str(tmp_path)})
    store = settings.open_store()
    assert store.keyring is NO_KEYS
    store.put(A)
    store.put(B)
    data = (tmp_path / plan_object_name(FP)).read_bytes()
    expected = Plan(FP, FACTORS, frontier((*A.observations, *B.observations)))
    assert (
        data == expected.encode() == orjson.dumps(expected.to_dict(), option=orjson.OPT_SORT_KEYS)
    )
    assert b"signature" not in data


@pytest.mark.parametrize("planted", [None, newer_schema_record(FP)])
def test_racing_signing_threads_converge_on_a_signed_frontier(
    tmp_path: Path, planted: bytes | None
) -> None:
    """Also over a record of another schema no key signed: it is replaced by compare-and-swap,
    so the writers racing to replace it lose no observation."""
    if planted is not None:
        assert PlanStore(LocalStore(tmp_path))._create(FP, planted)
    plans = [make_plan(kv=(10 + i) * GiB, baseline=(60 + 2 * i) * GiB) for i in range(8)]
    ring = signer(OLD)

    def put(plan: Plan) -> None:
        store = PlanStore(LocalStore(tmp_path))
        store.use_keyring(ring)
        store.put(plan)

    assert not race(put, plans)
    reader = PlanStore(LocalStore(tmp_path))
    reader.use_keyring(Keyring(verify_keys=[OLD]))
    final = reader.get(FP)
    assert final is not None
    assert final.observations == frontier(o for p in plans for o in p.observations)


# -- rotation ---------------------------------------------------------------------------------
def test_rotation_accepts_the_old_key_re_signs_and_then_drops_it(node: Node) -> None:
    """Rotation: the old key stays a verify key while writers sign with the new one; a
    record's next write re-signs it; once the old key is removed, a record still signed by
    it is not applied, and the next signed write replaces it."""
    node(signer(OLD)).put(A)
    other_fp = make_plan(factors={"model": "other"})
    node(signer(OLD)).put(other_fp)
    rotated = node(signer(NEW, OLD))
    assert cache_on(rotated).lookup(FACTORS, FREE).reason is Reason.HIT
    assert rotated.put(A) is PutOutcome.REPLACED  # same content, re-signed with the new key
    assert rotated.put(A) is PutOutcome.KEPT
    assert rotated.put(B) is PutOutcome.REPLACED
    stored = rotated.get(FP)
    assert stored is not None and stored.signature is not None
    assert stored.signature.keyid == key_id(NEW)
    assert stored.observations == frontier((*A.observations, *B.observations))
    with pytest.raises(InvalidSignatureError):  # so every node learns the new key first
        node(signer(OLD)).get(FP)
    # the old key removed: what it alone signed is no longer applied, then replaced
    done = node(signer(NEW))
    d = cache_on(done).lookup(other_fp.factors, FREE)
    assert d.reason is Reason.INVALID_SIGNATURE and "not an accepted one" in d.detail
    assert cache_on(done).lookup(FACTORS, FREE).reason is Reason.HIT
    fresh = make_plan(kv=11 * GiB, baseline=71 * GiB, factors={"model": "other"})
    assert done.put_merged(fresh)[1] == fresh  # the old-key observation is not merged in
    assert cache_on(done).lookup(other_fp.factors, FREE).kv_cache_memory_bytes == 11 * GiB


# -- retract, prune, copy, record -------------------------------------------------------------
def test_retract_prune_and_record_sign_what_they_write(tmp_path: Path) -> None:
    env = {"PLANCACHE_URL": str(tmp_path), "PLANCACHE_SIGNING_KEY": NEW, "PLANCACHE_TIMEOUT": "30"}
    cache = PlanCache.from_env(env)
    recorded = cache.record(FACTORS, kv_cache_memory_bytes=12 * GiB, free_memory_baseline=70 * GiB)
    assert recorded.reason is PutOutcome.CREATED
    cache.store.put(A)  # an old observation (created at 1000)
    verify_only = PlanStore(LocalStore(tmp_path))
    verify_only.use_keyring(Keyring(verify_keys=[NEW]))
    stored = verify_only.get(FP)
    assert stored is not None and len(stored.observations) == 2
    assert cache.retract(FP, stored.observations[1])  # the fresh one
    after = verify_only.get(FP)
    assert after is not None and after.observations == A.observations
    assert after.retracted and after.signature is not None
    result = prune(cache.store, older_than=3600.0)
    assert (result.observations, result.deleted) == (1, 0)  # the tombstone is fresh: kept
    pruned = verify_only.get(FP)
    assert pruned is not None and pruned.observations == () and pruned.signature is not None
    # a signing store does not rewrite a record it cannot vouch for
    PlanStore(LocalStore(tmp_path)).delete(FP)
    PlanStore(LocalStore(tmp_path)).put(A)
    with pytest.raises(InvalidSignatureError):
        cache.store.retract(FP, A.observations[0])
    result = prune(cache.store, older_than=1.0)
    assert (result.rejected, result.observations, result.plans) == (1, 0, [])
    assert PlanStore(LocalStore(tmp_path)).read_raw(FP) == A.encode()


def test_copy_keeps_signatures_and_skips_what_the_keys_reject(tmp_path: Path) -> None:
    src = PlanStore(LocalStore(tmp_path / "src"))
    src.use_keyring(signer(OLD))
    src.put(A)
    PlanStore(LocalStore(tmp_path / "src")).put(make_plan(factors={"model": "unsigned"}))
    plain_dst = PlanStore(LocalStore(tmp_path / "plain"))
    assert (
        copy(PlanStore(LocalStore(tmp_path / "src")), plain_dst).created == 2
    )  # no keys: all, as is
    assert plain_dst.read_raw(FP) == src.read_raw(FP)  # the signature travels
    keyed_dst = PlanStore(LocalStore(tmp_path / "keyed"))
    keyed_dst.use_keyring(signer(NEW, OLD))
    counts = copy(src, keyed_dst)
    assert (counts.created, counts.rejected) == (1, 1)  # the unsigned one is never signed
    copied = keyed_dst.get(FP)
    assert copied is not None and copied.signature is not None
    assert copied.signature.keyid == key_id(NEW)
    assert len(verify(src, require_signature=True).findings) == 1
    with pytest.raises(ValueError, match="needs keys"):
        verify(plain_dst, require_signature=True)


# -- the tiered store -------------------------------------------------------------------------
def test_a_tampered_local_tier_is_not_applied(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        "PLANCACHE_URL": f"s3://{s3_bucket}/plans",
        "PLANCACHE_STORAGE_OPTIONS": json.dumps({"endpoint_url": moto_s3.endpoint}),
        "PLANCACHE_LOCAL_TIER": str(tmp_path / "tier"),
        "PLANCACHE_SIGNING_KEY": OLD,
        "PLANCACHE_TIMEOUT": "30",
    }
    cache = PlanCache.from_env(env)
    (o,) = A.observations
    cache.record(
        FACTORS,
        kv_cache_memory_bytes=o.kv_cache_memory_bytes,
        free_memory_baseline=o.free_memory_baseline,
    )
    store = cache.store
    assert isinstance(store, TieredStore) and store.local is not None
    assert store.local.keyring == store.remote.keyring == signer(OLD)
    local_file = tmp_path / "tier" / plan_object_name(FP)
    raw = local_file.read_bytes()
    local_file.write_bytes(
        edited(raw, lambda obj: obj["observations"][0].update(kv_cache_memory_bytes=50 * GiB))
    )
    with caplog.at_level(logging.WARNING, "plancache"):
        d = cache.lookup(FACTORS, FREE)
    assert d.reason is Reason.HIT and d.kv_cache_memory_bytes == 10 * GiB  # from the remote
    assert "local tier" in caplog.text and "does not match its content" in caplog.text
    assert local_file.read_bytes() == raw  # repaired from the remote's signed record
    # both tiers tampered: nothing applied
    remote_plain = open_store(f"s3://{s3_bucket}/plans", endpoint_url=moto_s3.endpoint)
    overwrite(remote_plain, FP, A.encode())
    local_file.write_bytes(A.encode())
    d = cache.lookup(FACTORS, FREE)
    assert d.reason is Reason.INVALID_SIGNATURE and d.kv_cache_memory_bytes is None


def test_a_read_only_verifying_node_keeps_signed_copies_in_its_tier(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    """A replica with verify keys only, reading a bucket CI signs: its local tier holds the
    remote's signed bytes, which it accepts on the next boot without asking the remote."""
    ci = open_store(f"s3://{s3_bucket}/plans", endpoint_url=moto_s3.endpoint)
    ci.use_keyring(signer(OLD))
    ci.put(A)
    env = {
        "PLANCACHE_URL": f"s3://{s3_bucket}/plans",
        "PLANCACHE_STORAGE_OPTIONS": json.dumps({"endpoint_url": moto_s3.endpoint}),
        "PLANCACHE_LOCAL_TIER": str(tmp_path / "tier"),
        "PLANCACHE_READ_ONLY": "1",
        "PLANCACHE_VERIFY_KEYS": OLD,
        "PLANCACHE_TIMEOUT": "30",
    }
    assert PlanCache.from_env(env).lookup(FACTORS, FREE).reason is Reason.HIT
    assert (tmp_path / "tier" / plan_object_name(FP)).read_bytes() == ci.read_raw(FP)
    ci.delete(FP)
    assert PlanCache.from_env(env).lookup(FACTORS, FREE).reason is Reason.HIT  # local tier


# -- no key leaks -----------------------------------------------------------------------------
def test_keys_never_show_in_logs_messages_or_reprs(
    node: Node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    key_file = tmp_path / "keys"
    key_file.write_text(f"{OLD}\n{OTHER}\n")
    env = {"PLANCACHE_SIGNING_KEY": NEW, "PLANCACHE_VERIFY_KEYS_FILE": str(key_file)}
    settings = Settings.from_env(env | {"PLANCACHE_URL": str(tmp_path / "s")})
    tiered = Settings(
        "memory://plans-leak", local_tier=str(tmp_path / "t"), keyring=settings.keyring
    ).open_store()
    texts += [repr(settings), repr(settings.keyring), repr(settings.open_store()), repr(tiered)]
    texts.append(str(vars(settings)))
    signing, plain = node(settings.keyring), node(NO_KEYS)
    texts.append(repr(signing))
    cache = cache_on(signing)
    cache.record(FACTORS, kv_cache_memory_bytes=10 * GiB, free_memory_baseline=60 * GiB)
    texts.append(repr(cache.lookup(FACTORS, FREE)))
    overwrite(plain, FP, A.encode())
    texts.append(repr(cache.lookup(FACTORS, FREE)))
    actions: list[Callable[[], object]] = [
        lambda: signing.get(FP),
        lambda: signing.retract(FP, A.observations[0]),
    ]
    for action in actions:
        with pytest.raises(InvalidSignatureError) as refused:
            action()
        texts += [str(refused.value), repr(refused.value)]
    signing.put(B)
    plain.put(C)
    with pytest.raises(PlanStorePermissionError) as denied:
        plain.retract(FP, B.observations[0])
    texts += [str(denied.value), repr(denied.value)]
    cache.retract(FP, B.observations[0])
    for bad in ({"PLANCACHE_SIGNING_KEY": NEW[:12]}, {"PLANCACHE_VERIFY_KEYS": f"{OLD} {NEW[:9]}"}):
        with pytest.raises(ConfigError) as info:
            Settings.from_env(bad)
        texts.append(str(info.value))
    texts += [r.getMessage() for r in caplog.records]
    text = "\n".join(texts)
    assert "invalid:signature" in text and key_id(NEW) in text  # ids are shown, keys never
    for key in (*KEYS, NEW[:12], NEW[:9]):
        assert key not in text
