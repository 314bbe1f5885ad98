"""Boot reports: what each process's boot decided and rebuilt anyway, one signed envelope per
boot, summed per kind by ``plancache stats`` (run for real in subprocesses), pruned by age,
checked by ``verify``, never copied by ``cp``; and the process tally they are made of."""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest

from plancache import _metrics as metrics
from plancache import open_store
from plancache._artifacts import reports
from plancache._signing import Keyring, SignatureVerdict
from plancache.errors import ArtifactError, UnreadableHereError
from plancache.testing import child_env
from tests.artifacts.helpers import artifact_store
from tests.cli.helpers import DAY, ok, run

K1 = "k1-" + "e" * 30
TRITON_HIT = {"cache_triton": {"hit": 1, "rebuilt": 2}, "plans": {"hit": 1}}


def _report(tally: dict[str, dict[str, int]], keyring: Keyring | None = None) -> reports.Report:
    return reports.made(tally, {"host": "node-a"}, keyring or Keyring())


def test_a_report_round_trips_is_named_by_time_and_content_and_signed() -> None:
    report = _report(TRITON_HIT, Keyring(K1))
    assert report.decisions == {"cache_triton": {"hit": 1}, "plans": {"hit": 1}}
    assert report.rebuilt == {"cache_triton": 2}
    assert reports.is_report_object_name(report.name)
    assert report.name.startswith(f"{reports.NAME_PREFIX}{int(report.created_at):010d}_")
    again = reports.Report.decode(report.encode())
    assert again == report and again.name == report.name
    assert again.verdict(Keyring(verify_keys=[K1])) is SignatureVerdict.VALID
    other = _report(TRITON_HIT)  # the same tally, another boot: another object
    assert other.name != report.name and other.signature is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"decisions": {"plans": {"hit": -1}}}, "not a count"),
        ({"decisions": {"plans": {"hit": True}}}, "not a count"),
        ({"decisions": {"plans": {"hit": 1.5}}}, "not a count"),
        ({"decisions": {"Plans!": {"hit": 1}}}, "malformed name"),
        ({"decisions": {f"k{i}": {} for i in range(65)}}, "at most 64"),
        ({"rebuilt": {"plans": 2**31 + 1}}, "not a count"),
        ({"boot": "x"}, "boot id"),
        ({"producer": {"x": "y" * 2000}}, "at most 1024 bytes"),
        ({"created_at": "now"}, "is a number"),
        ({"format": 0}, "not boot report of format 1"),
        ({"signature": {"keyid": 1}}, "signature is malformed"),
    ],
)
def test_a_malformed_report_is_refused(change: dict[str, object], message: str) -> None:
    body = {**orjson.loads(_report(TRITON_HIT).encode()), **change}
    with pytest.raises(ArtifactError, match=message):
        reports.Report.decode(orjson.dumps(body))


def test_a_newer_format_or_an_oversized_report_is_not_read() -> None:
    body = {**orjson.loads(_report(TRITON_HIT).encode()), "format": 2}
    with pytest.raises(UnreadableHereError):
        reports.Report.decode(orjson.dumps(body))
    with pytest.raises(ArtifactError, match="over 16384 bytes"):
        reports.Report.decode(b" " * (reports.MAX_BYTES + 1))


def test_a_tally_past_the_bounds_is_cut_not_refused() -> None:
    tally = {f"kind{i}": {f"r{j}": j for j in range(80)} for i in range(70)}
    tally["Bad Kind"] = {"hit": 1}
    report = _report(tally)
    assert 0 < len(report.decisions) < reports.MAX_ENTRIES  # cut to half of MAX_BYTES
    assert all(len(r) == reports.MAX_ENTRIES for r in report.decisions.values())
    assert len(report.encode()) <= reports.MAX_BYTES
    assert reports.Report.decode(report.encode()) == report


def test_the_process_tally_counts_decisions_and_rebuilds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "_tally", {})
    monkeypatch.setenv("PLANCACHE_METRICS", "0")  # the tally is kept without Prometheus
    metrics.decision("cache_triton", "hit", 0.1)
    metrics.decision("cache_triton", "hit", 0.1)
    metrics.rebuilt("cache_triton", 3)
    metrics.rebuilt("model_info", 0)  # nothing rebuilt: not counted
    assert metrics.tally() == {"cache_triton": {"hit": 2, "rebuilt": 3}}
    for i in range(metrics.MAX_TALLIED + 5):
        metrics.decision(f"k{i}", "miss", 0.0)
    assert len(metrics.tally()) == metrics.MAX_TALLIED


def _boots(root: Path, tallies: list[dict[str, dict[str, int]]], keyring: Keyring) -> list[str]:
    """One report per tally, written as a node writes it (create-if-absent, every
    destination)."""
    store = artifact_store(str(root), keyring)
    names = []
    for tally in tallies:
        report = _report(tally, keyring)
        assert store.upload_report(report) == {"store": True}
        names.append(report.name)
    return names


FLEET = [
    {"cache_triton": {"miss": 1}, "plans": {"miss": 1}},  # the first node
    {"cache_triton": {"hit": 1}, "plans": {"hit": 1}},
    {"cache_triton": {"hit": 1, "rebuilt": 1}, "plans": {"hit": 1}},
    {"cache_triton": {"hit": 1, "rebuilt": 4}, "compile_artifact": {"hit": 1, "rebuilt": 1}},
]


def test_stats_sums_the_fleets_reports_per_kind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _boots(root, FLEET, Keyring())
    data = json.loads(ok("stats", "--json", str(root)))["boot_reports"]
    assert (data["stored"], data["read"]) == (4, 4)
    assert data["kinds"]["cache_triton"] == {
        "boots": 4,
        "results": {"miss": 1, "hit": 3},
        "rebuilt": 5,
        "boots_rebuilt": 2,
    }
    assert data["kinds"]["plans"] == {
        "boots": 3,
        "results": {"miss": 1, "hit": 2},
        "rebuilt": 0,
        "boots_rebuilt": 0,
    }
    assert data["kinds"]["compile_artifact"]["rebuilt"] == 1
    text = ok("stats", str(root))
    assert "boots    4 reported (the newest of 4 stored)" in text
    assert "cache_triton      4 boots: hit 3, miss 1; rebuilt 5 on 2 boots" in text
    assert "plans             3 boots: hit 2, miss 1; rebuilt 0 on 0 boots" in text


def test_where_keys_require_signatures_only_signed_reports_count(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _boots(root, FLEET[:1], Keyring(K1))
    _boots(root, FLEET[1:], Keyring())
    data = json.loads(ok("stats", "--json", str(root), env=child_env(PLANCACHE_VERIFY_KEYS=K1)))
    assert (data["boot_reports"]["stored"], data["boot_reports"]["read"]) == (4, 1)
    assert data["boot_reports"]["kinds"]["cache_triton"]["results"] == {"miss": 1}


def test_stats_reads_the_newest_reports_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = artifact_store(str(tmp_path / "store"))
    for i, tally in enumerate(FLEET):
        monkeypatch.setattr(time, "time", lambda i=i: 1_700_000_000.0 + i)
        store.upload_report(_report(tally))
    monkeypatch.undo()
    monkeypatch.setattr(reports, "MAX_READ", 1)
    from plancache._command.artifacts import stats

    got = stats(open_store(str(tmp_path / "store")).layer, 1 << 30, Keyring())["boot_reports"]
    assert (got["stored"], got["read"]) == (4, 1)
    assert set(got["kinds"]) == {"cache_triton", "compile_artifact"}  # the newest: FLEET[3]


def test_reports_are_pruned_by_age_verified_and_not_copied(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old = reports.Report(time.time() - 40 * DAY, {}, {"plans": {"hit": 1}}, {}, "a" * 32)
    layer = open_store(str(root)).layer
    assert layer.write_object(old.name, [old.encode()])
    (new,) = _boots(root, FLEET[:1], Keyring())
    assert "2 boot reports checked: 0 failed" in run("verify", str(root)).stdout
    corrupt = root / new
    corrupt.write_bytes(corrupt.read_bytes().replace(b'"miss":1', b'"miss":-1'))
    result = run("verify", str(root))
    assert result.returncode == 1 and f"{new}  " in result.stdout and "not a count" in result.stdout
    corrupt.write_bytes(_report(FLEET[0]).encode())  # valid, but not the report its name says
    assert "not the report its name says" in run("verify", str(root)).stdout
    copied = ok("cp", str(root), str(tmp_path / "copy"))
    assert "boot report" not in copied
    assert not list(open_store(str(tmp_path / "copy")).layer.list_objects(reports.NAME_PREFIX))
    pruned = ok("prune", "--older-than", "30d", str(root))
    assert f"deleted {old.name}" in pruned and "deleted 1 boot report older than 30d" in pruned
    assert [n for n in layer.list_objects(reports.NAME_PREFIX)] == [new]
