"""``plancache show``, ``verify``, ``rm`` and ``fingerprint``: one record by name, every
record against the format's rules."""

from __future__ import annotations

import json
from pathlib import Path

from plancache import Plan, fingerprint, open_store
from plancache._keys import Scalar
from plancache._plan import MAX_RECORD_BYTES
from plancache.testing import GiB
from tests.cli.helpers import (
    LocalFixture,
    failure,
    frontier_plan,
    named_plan,
    ok,
    record_bytes,
    run,
    write_raw,
)


def test_show_by_prefix(store: LocalFixture) -> None:
    root, plans, bad = store
    p = plans[1]
    text = ok("show", p.fingerprint[:8], "--url", str(root))
    assert f"fingerprint  {p.fingerprint}" in text
    assert '"NVIDIA A10G"' in text and '"b"' in text and "host=host-b" in text
    assert json.loads(ok("show", p.fingerprint.upper(), "--url", str(root), "--json")) == (
        p.to_dict()
    )
    result = run("show", bad, "--url", str(root))  # shown as stored, and flagged
    assert result.returncode == 1
    assert json.loads(result.stdout)["fingerprint"] == bad
    assert "invalid record" in result.stderr and "exceeds" in result.stderr


def test_show_lists_every_observation(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    wide = frontier_plan("wide", [(10, 70, 3), (9.5, 66, 4), (11, 75, 1)])
    open_store(str(root)).put(wide)
    lines = ok("show", wide.fingerprint[:6], "--url", str(root)).splitlines()
    assert "observations 3 (a node applies the largest KV whose baseline fits)" in lines
    start = lines.index(next(line for line in lines if "BASELINE GiB" in line))
    rows = [line.split() for line in lines[start + 1 : start + 4]]
    assert [(r[0], r[1]) for r in rows] == [
        ("66.00", "9.50"),
        ("70.00", "10.00"),
        ("75.00", "11.00"),
    ]
    assert [r[-4] for r in rows] == ["(4d", "(3d", "(1d"]
    assert all(r[-2:] == ["host=host-wide", "plancache=test"] for r in rows)
    assert lines[start + 4 : start + 6] == ["labels", '  model  "wide"']
    shown = json.loads(ok("show", wide.fingerprint, "--url", str(root), "--json"))
    assert shown == wide.to_dict() and len(shown["observations"]) == 3


def test_show_reads_a_schema_1_record(tmp_path: Path) -> None:
    root = tmp_path / "old"
    factors: dict[str, Scalar] = {"model": "old"}
    fp = fingerprint(factors)
    write_raw(root, fp, record_bytes(factors=factors, producer={"host": "h-old"}))
    text = ok("show", fp[:8], "--url", str(root))
    assert "observations 1 " in text and "host=h-old" in text and "model        -" in text
    shown = json.loads(ok("show", fp, "--url", str(root), "--json"))  # as this version reads it
    assert shown["schema"] == 2 and shown["labels"] == {}
    assert [
        (o["kv_cache_memory_bytes"], o["free_memory_baseline"]) for o in shown["observations"]
    ] == [(GiB, 2 * GiB)]


def test_show_errors(tmp_path: Path, store: LocalFixture) -> None:
    root, _, _ = store
    err = failure("show", "0" * 64, "--url", str(root))
    assert err == f"plancache: error: no plan matches '{'0' * 64}' in {root}\n"
    assert "not a fingerprint" in failure("show", "../etc/passwd", "--url", str(root))
    # two plans whose fingerprints share a first digit make that digit ambiguous
    twins = tmp_path / "twins"
    seen: dict[str, Plan] = {}
    for i in range(17):
        plan = named_plan(f"t{i}")
        if plan.fingerprint[0] in seen:
            break
        seen[plan.fingerprint[0]] = plan
    for q in (plan, seen[plan.fingerprint[0]]):
        open_store(str(twins)).put(q)
    err = failure("show", plan.fingerprint[0], "--url", str(twins))
    assert "is ambiguous" in err and "matches 2 plans" in err and plan.fingerprint[:12] in err


def frontier_record(tag: str, *, bad_kv: float) -> bytes:
    """A schema-2 record under ``{"r": tag}`` whose three observations are valid but for the
    last, which allocated ``bad_kv`` GiB from a 4 GiB baseline."""
    plan = frontier_plan(tag, [(1, 2, 0), (2, 3, 0)])
    record = plan.to_dict()
    record["factors"] = {"r": tag}
    record["fingerprint"] = fingerprint({"r": tag})
    last = dict(record["observations"][-1])
    last.update(kv_cache_memory_bytes=int(bad_kv * GiB), free_memory_baseline=4 * GiB)
    record["observations"].append(last)
    return json.dumps(record).encode()


def test_verify_reports_every_rule_and_fix_deletes(store: LocalFixture) -> None:
    root, plans, bad = store

    def key(tag: str) -> str:
        return fingerprint({"r": tag})

    breakers = {  # reason -> (key, record), each record under its own fingerprint's name
        "not valid JSON": (key("json"), b"{not json"),
        "must be an int, not bool": (
            key("bool"),
            record_bytes(factors={"r": "bool"}, kv_cache_memory_bytes=True),
        ),
        "does not match the sha256": (
            key("other"),
            record_bytes(factors={"r": "sum"}, fingerprint=key("other")),
        ),
        "schema must be an int, not '1'": (
            key("schema"),
            record_bytes(factors={"r": "schema"}, schema="1"),
        ),
        "over 65536 bytes": (
            key("big"),
            record_bytes(factors={"r": "big"}, pad="x" * MAX_RECORD_BYTES),
        ),
        "lacks producer": (key("short"), record_bytes(factors={"r": "short"}, drop="producer")),
        "exceeds free_memory_baseline": (key("one-bad"), frontier_record("one-bad", bad_kv=5)),
        "not a frontier": (key("dominated"), frontier_record("dominated", bad_kv=0.5)),
    }
    names = {}
    for reason, (fp, data) in breakers.items():
        write_raw(root, fp, data)
        names[fp] = reason
    # a valid record stored under another plan's key
    moved = fingerprint({"key": "moved"})
    write_raw(root, moved, plans[0].encode())
    names[moved] = "does not match the key"
    names[bad] = "exceeds free_memory_baseline"
    newer = key("newer")  # a newer plancache's record: reported, never counted or deleted
    write_raw(root, newer, b'{"schema": 3, "fingerprint": "%s"}' % newer.encode())
    kept_line = (
        f"{newer}  record has schema 3; this plancache reads 1 and 2 "
        "(another version's record: kept)"
    )

    result = run("verify", str(root))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == kept_line
    reported = dict(line.split("  ", 1) for line in lines[1:-1])
    assert set(reported) == set(names)
    for fp, reason in names.items():
        assert reason in reported[fp], (reason, reported[fp])
    assert lines[-1] == f"{4 + len(names)} records checked in {root}: {len(names)} invalid"

    fixed = ok("verify", str(root), "--fix")
    assert fixed.count("(deleted)") == len(names)
    assert fixed.splitlines()[-1].endswith(f": {len(names)} invalid, {len(names)} deleted")
    assert ok("verify", str(root)).splitlines() == [
        kept_line,
        f"4 records checked in {root}: 0 invalid",
    ]
    left = sorted(open_store(str(root)).iter_fingerprints())
    assert left == sorted([newer, *(p.fingerprint for p in plans)])


def test_rm(store: LocalFixture) -> None:
    root, plans, bad = store
    s = open_store(str(root))
    err = failure("rm", plans[0].fingerprint[:10], "ffff" * 16, "--url", str(root))
    assert "no plan matches" in err
    assert s.get(plans[0].fingerprint) is not None  # nothing deleted when one name is unknown
    out = ok("rm", plans[0].fingerprint[:10], plans[1].fingerprint, bad[:6], "--url", str(root))
    assert out.splitlines() == [
        f"deleted {plans[0].fingerprint}",
        f"deleted {plans[1].fingerprint}",
        f"deleted {bad}",
    ]
    assert list(s.iter_fingerprints()) == [plans[2].fingerprint]


def test_fingerprint(tmp_path: Path, store: LocalFixture) -> None:
    root, plans, _ = store
    factors: dict[str, Scalar] = {
        "model": "m",
        "gpu_memory_utilization": 0.9,
        "tp": 2,
        "eager": False,
        "x": None,
    }
    path = tmp_path / "factors.json"
    path.write_text(json.dumps(factors, indent=4))
    expected = [
        fingerprint(factors),
        '{"eager":false,"gpu_memory_utilization":0.9,"model":"m","tp":2,"x":null}',
    ]
    assert ok("fingerprint", str(path)).splitlines() == expected
    assert ok("fingerprint", "-", stdin=json.dumps(factors)).splitlines() == expected
    record = ok("show", plans[0].fingerprint, "--url", str(root), "--json")
    assert ok("fingerprint", "-", stdin=record).splitlines()[0] == plans[0].fingerprint

    assert "is not valid JSON" in failure("fingerprint", "-", stdin="{oops")
    assert "expected a JSON object" in failure("fingerprint", "-", stdin="[1, 2]")
    assert "must be str, int, float" in failure("fingerprint", "-", stdin='{"a": [1]}')
    err = failure("fingerprint", str(tmp_path / "missing.json"))
    assert err == f"plancache: error: cannot read {tmp_path / 'missing.json'}: " + (
        "No such file or directory\n"
    )
