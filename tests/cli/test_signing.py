"""The command with signed plans: ``verify --require-signature`` (exit codes, reasons, keys
from the environment or ``--keys-file``), who signed in ``ls`` and ``show``, ``cp`` and
``prune`` with a signing key, and no key in any output."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import orjson
import pytest

from plancache import PlanStore, open_store
from plancache._backends.local import LocalStore
from plancache._keys import plan_object_name
from plancache._signing import NO_KEYS, Keyring, key_id
from plancache.testing import GiB, child_env
from plancache.testing.plans import newer_schema_record
from tests.cli.helpers import RemoteSpec, failure, named_plan, ok, record_bytes, run, write_raw

KEY = secrets.token_hex(32)
OTHER = secrets.token_hex(32)
ID = key_id(KEY)
GOOD, UNSIGNED, TAMPERED, FOREIGN = (
    named_plan(n) for n in ("good", "unsigned", "tampered", "foreign")
)
BROKEN = "f" * 64


def signing(store: PlanStore, key: str = KEY) -> PlanStore:
    store.use_keyring(Keyring(key))
    return store


def stock(store: PlanStore) -> None:
    """One record each: validly signed, unsigned, signed then changed, signed by another key."""
    signing(store).put(GOOD)
    store.use_keyring(NO_KEYS)
    store.put(UNSIGNED)
    signing(store, OTHER).put(FOREIGN)
    signing(store).put(TAMPERED)
    raw = store.read_raw(TAMPERED.fingerprint)
    assert raw is not None
    obj = json.loads(raw)
    obj["observations"][0]["kv_cache_memory_bytes"] += GiB
    found = store._read(TAMPERED.fingerprint)
    assert found is not None
    store._replace(TAMPERED.fingerprint, orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), found[1])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    stock(PlanStore(LocalStore(root)))
    write_raw(root, BROKEN, record_bytes(kv_cache_memory_bytes=3 * GiB))  # kv > baseline
    return root


def keyed(**extra: str) -> dict[str, str]:
    return child_env(PLANCACHE_SIGNING_KEY=KEY, **extra)


def lines_of(text: str) -> dict[str, str]:
    """Findings by fingerprint."""
    return {
        line[:64]: line[66:] for line in text.splitlines() if len(line) > 66 and line[64:66] == "  "
    }


def test_verify_require_signature_reports_unsigned_and_badly_signed_records(
    root: Path, tmp_path: Path
) -> None:
    outputs: list[str] = []
    plain = run("verify", str(root), env=keyed())  # the format alone
    assert plain.returncode == 1 and list(lines_of(plain.stdout)) == [BROKEN]
    result = run("verify", "--require-signature", str(root), env=keyed())
    assert result.returncode == 1, result.stderr
    found = lines_of(result.stdout)
    assert found.keys() == {BROKEN, UNSIGNED.fingerprint, TAMPERED.fingerprint, FOREIGN.fingerprint}
    assert found[UNSIGNED.fingerprint] == "invalid:signature: record is not signed"
    assert found[TAMPERED.fingerprint] == (
        f"invalid:signature: record's signature by key {ID} does not match its content "
        "(changed after signing)"
    )
    assert found[FOREIGN.fingerprint] == (
        f"invalid:signature: record is signed by key {key_id(OTHER)}, not an accepted one"
    )
    assert result.stdout.splitlines()[-1] == (
        f"5 records checked in {root}: 1 invalid, 3 not validly signed (keys {ID})"
    )
    outputs += [plain.stdout, plain.stderr, result.stdout, result.stderr]
    # the same keys from a file, or as verify keys; a rotated-in key is accepted too
    keys = tmp_path / "keys"
    keys.write_text(f"# fleet keys\n{KEY}\n{OTHER}\n")
    from_file = run("verify", "--require-signature", "--keys-file", str(keys), str(root))
    assert from_file.returncode == 1
    assert lines_of(from_file.stdout).keys() == {BROKEN, UNSIGNED.fingerprint, TAMPERED.fingerprint}
    env = child_env(PLANCACHE_VERIFY_KEYS=f"{KEY},{OTHER}")
    assert run("verify", "--require-signature", str(root), env=env).stdout == from_file.stdout
    outputs += [from_file.stdout, from_file.stderr]
    # --fix deletes what it reported; then all is well
    fixed = run("verify", "--require-signature", "--fix", str(root), env=keyed())
    assert fixed.returncode == 0 and fixed.stdout.count("(deleted)") == 4
    again = run("verify", "--require-signature", str(root), env=keyed())
    assert again.returncode == 0
    assert (
        again.stdout == f"1 record checked in {root}: 0 invalid, 0 not validly signed (keys {ID})\n"
    )
    outputs += [fixed.stdout, fixed.stderr, again.stdout, again.stderr]
    assert not any(KEY in text or OTHER in text for text in outputs)


def test_verify_require_signature_needs_keys(root: Path, tmp_path: Path) -> None:
    assert "--require-signature needs keys" in failure("verify", "--require-signature", str(root))
    keys = tmp_path / "keys"
    keys.write_text("# nothing yet\n")
    stderr = failure("verify", "--require-signature", "--keys-file", str(keys), str(root))
    assert "needs keys" in stderr
    assert "goes with --require-signature" in failure("verify", "--keys-file", str(keys), str(root))
    assert "cannot read --keys-file" in failure(
        "verify", "--require-signature", "--keys-file", str(tmp_path / "none"), str(root)
    )


def test_ls_and_show_say_who_signed(root: Path, tmp_path: Path) -> None:
    text = ok("ls", "--sort", "fp", str(root), env=keyed())
    header, *rows = text.splitlines()
    assert header.split()[-1] == "SIGNED"
    signed = {
        row[:12]: row.split("host-")[1].split(maxsplit=1)[1] for row in rows if "host-" in row
    }
    assert signed == {
        GOOD.fingerprint[:12]: ID,
        UNSIGNED.fingerprint[:12]: "- (unsigned)",
        TAMPERED.fingerprint[:12]: f"{ID} (bad-mac)",
        FOREIGN.fingerprint[:12]: f"{key_id(OTHER)} (unknown-key)",
    }
    assert text.splitlines()[-1] == (
        f"4 plans, 1 invalid, 3 not validly signed (never applied with these keys), in {root}"
    )
    rows_json = {
        r["fingerprint"]: r for r in json.loads(ok("ls", "--json", str(root), env=keyed()))
    }
    assert rows_json[GOOD.fingerprint]["signed_by"] == ID
    assert rows_json[GOOD.fingerprint]["signature_error"] is None
    assert rows_json[UNSIGNED.fingerprint]["signed_by"] is None
    assert rows_json[UNSIGNED.fingerprint]["signature_error"] == "record is not signed"
    # without keys: who signed, not judged; a store without signed records lists as before
    plain_rows = ok("ls", "--sort", "fp", str(root)).splitlines()
    assert plain_rows[0].split()[-1] == "SIGNED"
    [unsigned_row] = [r for r in plain_rows if r.startswith(UNSIGNED.fingerprint[:12])]
    assert unsigned_row.endswith("host-unsigned  -")
    [tampered_row] = [r for r in plain_rows if r.startswith(TAMPERED.fingerprint[:12])]
    assert tampered_row.endswith(f"host-tampered  {ID}")
    unsigned_root = tmp_path / "unsigned"
    open_store(str(unsigned_root)).put(UNSIGNED)
    assert ok("ls", str(unsigned_root), env=keyed()).splitlines()[0].split()[-1] == "SIGNED"
    assert ok("ls", str(unsigned_root)).splitlines()[0].split()[-1] == "HOST"
    # show
    shown = ok("show", GOOD.fingerprint[:10], "--url", str(root), env=keyed()).splitlines()
    assert f"signed       {ID} (valid)" in shown
    shown = ok("show", TAMPERED.fingerprint[:10], "--url", str(root)).splitlines()
    assert f"signed       {ID}" in shown
    shown = ok("show", UNSIGNED.fingerprint[:10], "--url", str(root), env=keyed()).splitlines()
    assert "signed       no (invalid:signature: record is not signed)" in shown
    assert not any(
        line.startswith("signed")
        for line in ok("show", UNSIGNED.fingerprint[:10], "--url", str(root)).splitlines()
    )
    as_json = json.loads(ok("show", GOOD.fingerprint, "--url", str(root), "--json"))
    assert as_json["signature"]["keyid"] == ID


def test_cp_and_prune_sign_with_the_signing_key(root: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    out = ok("cp", str(root), str(dst), env=keyed())
    assert out == (
        f"copied {root} -> {dst}: 1 created, 0 replaced, 0 kept, 1 invalid skipped, "
        "3 not validly signed skipped\n"
    )
    reader = PlanStore(LocalStore(dst))
    reader.use_keyring(Keyring(verify_keys=[KEY]))
    assert [fp for fp in reader.iter_fingerprints()] == [GOOD.fingerprint]
    # without a key every valid record is copied as it is, signatures included
    plain_dst = tmp_path / "plain"
    assert "4 created" in ok("cp", str(root), str(plain_dst))
    for p in (GOOD, TAMPERED, FOREIGN):
        name = plan_object_name(p.fingerprint)
        assert (plain_dst / name).read_bytes() == (root / name).read_bytes()
    # prune: an unsigned prune cannot rewrite a signed record; a signing one can
    old = named_plan("good", kv_gib=2, baseline_gib=75, age_days=40)
    signing(PlanStore(LocalStore(dst))).put(old)
    stderr = failure("prune", "--older-than", "30d", str(dst))
    assert "is signed; changing it needs the signing key" in stderr
    out = ok("prune", "--older-than", "30d", str(dst), env=keyed())
    assert out.startswith(f"dropped 1 of 2 observations {GOOD.fingerprint}")
    after = reader.get(GOOD.fingerprint)
    assert after is not None and after.observations == GOOD.observations
    assert after.signature is not None and after.signature.keyid == ID
    pruned = ok("prune", "--older-than", "30d", str(root), env=keyed())
    assert "3 records not validly signed left as they are" in pruned


def test_rotation_steps_from_the_readme(tmp_path: Path) -> None:
    """Sign with the new key, accept the old one; `cp URL URL` re-signs every record; the
    new key alone then accepts them all."""
    root = tmp_path / "store"
    old = PlanStore(LocalStore(root))
    for name in ("a", "b", "c"):
        signing(old, OTHER).put(named_plan(name))
    new_keys = tmp_path / "new.keys"
    new_keys.write_text(KEY + "\n")
    check = ["verify", "--require-signature", "--keys-file", str(new_keys), str(root)]
    assert run(*check).returncode == 1
    rotating = keyed(PLANCACHE_VERIFY_KEYS=OTHER)
    assert "0 created, 3 replaced, 0 kept" in ok("cp", str(root), str(root), env=rotating)
    assert "0 created, 0 replaced, 3 kept" in ok("cp", str(root), str(root), env=rotating)
    assert ok(*check).endswith(": 0 invalid, 0 not validly signed (keys " + ID + ")\n")


def test_verify_require_signature_on_s3(s3_spec: RemoteSpec) -> None:
    url, options = s3_spec
    store = open_store(url, **options)
    stock(store)
    store.close()
    args = ["verify", "--require-signature", url, "--storage-options", json.dumps(options)]
    result = run(*args, env=keyed())
    assert result.returncode == 1, result.stderr
    assert len(lines_of(result.stdout)) == 3
    assert result.stdout.splitlines()[-1].endswith(
        ": 0 invalid, 3 not validly signed (keys " + ID + ")"
    )
    assert ok(*args, "--fix", env=keyed()).count("(deleted)") == 3
    assert ok(*args, env=keyed()).startswith("1 record checked")
    assert KEY not in result.stdout + result.stderr


@pytest.mark.parametrize("debug", [[], ["--debug"]])
def test_bad_keys_fail_in_one_line_without_the_key(
    root: Path, tmp_path: Path, debug: list[str]
) -> None:
    short = KEY[:10]
    for env, name in [
        (child_env(PLANCACHE_SIGNING_KEY=short), "PLANCACHE_SIGNING_KEY"),
        (child_env(PLANCACHE_VERIFY_KEYS=f"{KEY} {short}"), "PLANCACHE_VERIFY_KEYS"),
        (child_env(PLANCACHE_SIGNING_KEY=KEY, PLANCACHE_SIGNING_KEY_FILE="/k"), "not both"),
    ]:
        result = run(*debug, "ls", str(root), env=env)
        assert result.returncode == 2 and name in result.stderr
        assert short not in result.stdout + result.stderr and KEY not in result.stderr
        if not debug:
            assert result.stderr.count("\n") == 1
    pasted = run(*debug, "ls", KEY, env=keyed())  # a key given as the URL by mistake
    assert pasted.returncode == 2 and "***: no store there" in pasted.stderr
    assert KEY not in pasted.stdout + pasted.stderr
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n{short}\n")
    result = run(*debug, "verify", "--require-signature", "--keys-file", str(keys), str(root))
    assert result.returncode == 2 and "--keys-file: key 2 has 10 characters" in result.stderr
    assert short not in result.stdout + result.stderr and KEY not in result.stdout + result.stderr


@pytest.mark.parametrize("where", ["local", "s3"])
def test_verify_require_signature_reports_and_fixes_other_schemas_no_key_signed(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        url, options = request.getfixturevalue("s3_spec")
        flags = ["--storage-options", json.dumps(options)]
    else:
        url, options, flags = str(tmp_path / "store"), {}, []
    store = open_store(url, **options)
    signing(store).put(GOOD)
    unsigned, foreign, ours = (named_plan(n).fingerprint for n in ("unsigned", "foreign", "ours"))
    for fp, key in [(unsigned, None), (foreign, OTHER), (ours, KEY)]:
        assert store._create(fp, newer_schema_record(fp, key))
    store.close()
    args = ["verify", "--require-signature", url, *flags]
    result = run(*args, env=keyed())
    assert result.returncode == 1, result.stderr
    found = lines_of(result.stdout)
    assert found.keys() == {ours, unsigned, foreign}
    assert found[ours].endswith("(another version's record: kept)")
    assert found[unsigned] == (
        "invalid:signature: record is not signed "
        "(record has schema 3; this plancache reads 1 and 2)"
    )
    assert found[foreign].startswith(
        f"invalid:signature: record is signed by key {key_id(OTHER)}, not an accepted one"
    )
    assert result.stdout.splitlines()[-1] == (
        f"4 records checked in {url}: 0 invalid, 2 not validly signed (keys {ID})"
    )
    assert ok(*args, "--fix", env=keyed()).count("(deleted)") == 2
    after = open_store(url, **options)
    assert sorted(after.iter_fingerprints()) == sorted([GOOD.fingerprint, ours])
    after.close()
    assert "(another version's record: kept)" in ok(*args, env=keyed())
    # without keys, a record of another schema is kept as before
    plain = ok("verify", "--fix", url, *flags)
    assert "another version's record: kept" in plain and "(deleted)" not in plain


def test_a_keys_file_that_is_a_fifo_fails_at_once(root: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "keys"
    os.mkfifo(fifo)
    result = run("verify", "--require-signature", "--keys-file", str(fifo), str(root), timeout=30)
    assert result.returncode == 2
    assert (
        result.stderr == f"plancache: error: cannot read --keys-file '{fifo}': not a regular file\n"
    )
