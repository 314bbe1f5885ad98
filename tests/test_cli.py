"""The ``plancache`` command, run for real (``python -m plancache``) in subprocesses."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from benchmarks.servers import FakeGCS, MotoS3, closed_port
from plancache import Plan, fingerprint, open_store
from plancache.fingerprint import object_name
from plancache.plan import MAX_RECORD_BYTES

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
DAY = 86400.0


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a command: this checkout importable, no PLANCACHE_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANCACHE_")}
    path = [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra)
    return env


def run(
    *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m plancache ARGS`` and return its result (never raises on exit codes)."""
    return subprocess.run(
        [sys.executable, "-m", "plancache", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else cli_env(),
        timeout=120,
    )


def ok(*args: str, **kwargs: Any) -> str:
    """Run a command that must succeed; its stdout."""
    result = run(*args, **kwargs)
    assert result.returncode == 0, result.stderr
    return result.stdout


def failure(*args: str, code: int = 2, **kwargs: Any) -> str:
    """Run a command that must fail with ``code`` and one error line; its stderr."""
    result = run(*args, **kwargs)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def make_plan(
    name: str, *, kv_gib: float = 1, baseline_gib: float = 70, age_days: float = 0, **factors: Any
) -> Plan:
    return Plan.new(
        {"model": name, "device_name": "NVIDIA H100", **factors},
        kv_cache_memory_bytes=int(kv_gib * GIB),
        free_memory_baseline=int(baseline_gib * GIB),
        producer={"host": f"host-{name}", "plancache": "test"},
        created_at=time.time() - age_days * DAY,
    )


def write_raw(root: Path, fp: str, data: bytes) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / object_name(fp)).write_bytes(data)


def record_bytes(drop: str = "", **fields: Any) -> bytes:
    """A schema-1 record with ``fields`` overridden and ``drop`` left out (may break any rule)."""
    factors = fields.pop("factors", {"model": "broken"})
    record = {
        "schema": 1,
        "fingerprint": fingerprint(factors),
        "factors": factors,
        "kv_cache_memory_bytes": GIB,
        "free_memory_baseline": 2 * GIB,
        "created_at": time.time(),
        "producer": {},
        **fields,
    }
    record.pop(drop, None)
    return json.dumps(record).encode()


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[Plan], str]:
    """A local store with three plans (ages 0, 20 and 40 days) and one invalid record."""
    root = tmp_path / "store"
    plans = [
        make_plan("a", kv_gib=3, age_days=0),
        make_plan("b", kv_gib=1, baseline_gib=60, age_days=20, device_name="NVIDIA A10G"),
        make_plan("c", kv_gib=2, baseline_gib=80, age_days=40),
    ]
    s = open_store(str(root))
    for p in plans:
        s.put(p)
    bad = fingerprint({"model": "broken"})
    write_raw(root, bad, record_bytes(kv_cache_memory_bytes=3 * GIB))  # kv > baseline
    return root, plans, bad


# -- ls, show, stats ---------------------------------------------------------------------------
def test_ls_lists_plans_and_invalid_records(store: tuple[Path, list[Plan], str]) -> None:
    root, plans, bad = store
    text = ok("ls", str(root))
    lines = text.splitlines()
    headers = ["FINGERPRINT", "DEVICE", "KV", "GiB", "BASELINE", "GiB", "AGE", "HOST"]
    assert lines[0].split() == headers
    assert [line[:12] for line in lines[1:4]] == [p.fingerprint[:12] for p in plans]  # newest 1st
    assert "NVIDIA A10G" in lines[2] and "1.00" in lines[2] and "60.00" in lines[2]
    assert "20d" in lines[2] and "host-b" in lines[2]
    assert bad[:12] in text and "exceeds free_memory_baseline" in text
    assert lines[-1] == f"3 plans, 1 invalid, in {root}"

    rows = json.loads(ok("ls", str(root), "--json", "--sort", "kv"))
    valid = [r for r in rows if r["valid"]]
    assert [r["kv_cache_memory_bytes"] for r in valid] == [3 * GIB, 2 * GIB, 1 * GIB]
    assert valid[0]["fingerprint"] == plans[0].fingerprint
    assert valid[0]["device"] == "NVIDIA H100" and valid[0]["producer"]["host"] == "host-a"
    assert rows[-1] == {
        "fingerprint": bad,
        "valid": False,
        "error": rows[-1]["error"],
        "bytes": rows[-1]["bytes"],
    }
    assert "exceeds" in rows[-1]["error"]

    by_baseline = json.loads(ok("ls", str(root), "--json", "--sort", "baseline"))
    assert [r["free_memory_baseline"] for r in by_baseline if r["valid"]] == [
        80 * GIB,
        70 * GIB,
        60 * GIB,
    ]
    by_device = json.loads(ok("ls", str(root), "--json", "--sort", "device"))
    assert by_device[0]["device"] == "NVIDIA A10G"
    by_fp = json.loads(ok("ls", str(root), "--json", "--sort", "fp"))
    fps = [r["fingerprint"] for r in by_fp if r["valid"]]
    assert fps == sorted(fps)


def test_ls_uses_the_environment(tmp_path: Path, store: tuple[Path, list[Plan], str]) -> None:
    root, plans, _ = store
    assert plans[0].fingerprint[:12] in ok("ls", env=cli_env(PLANCACHE_URL=str(root)))
    default = tmp_path / "vllm-cache" / "startup_plan"  # {VLLM_CACHE_ROOT}/startup_plan
    open_store(str(default)).put(plans[1])
    out = ok("ls", "--json", env=cli_env(VLLM_CACHE_ROOT=str(default.parent)))
    assert [r["fingerprint"] for r in json.loads(out)] == [plans[1].fingerprint]
    err = failure("ls", env=cli_env(PLANCACHE_URL=str(root), PLANCACHE_TIMEOUT="soon"))
    assert err.startswith("plancache: error: PLANCACHE_TIMEOUT='soon'")


def test_local_commands_import_no_cloud_client(store: tuple[Path, list[Plan], str]) -> None:
    root, _, _ = store
    code = (
        "import sys; from plancache.cli import main; main(['stats', sys.argv[1]]); "
        "print(sorted(m for m in ('s3fs', 'gcsfs', 'botocore') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=cli_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_show_by_prefix(store: tuple[Path, list[Plan], str]) -> None:
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


def test_show_errors(tmp_path: Path, store: tuple[Path, list[Plan], str]) -> None:
    root, _, _ = store
    err = failure("show", "0" * 64, "--url", str(root))
    assert err == f"plancache: error: no plan matches '{'0' * 64}' in {root}\n"
    assert "not a fingerprint" in failure("show", "../etc/passwd", "--url", str(root))
    # two plans whose fingerprints share a first digit make that digit ambiguous
    twins = tmp_path / "twins"
    seen: dict[str, Plan] = {}
    for i in range(17):
        plan = make_plan(f"t{i}")
        if plan.fingerprint[0] in seen:
            break
        seen[plan.fingerprint[0]] = plan
    for q in (plan, seen[plan.fingerprint[0]]):
        open_store(str(twins)).put(q)
    err = failure("show", plan.fingerprint[0], "--url", str(twins))
    assert "is ambiguous" in err and "matches 2 plans" in err and plan.fingerprint[:12] in err


def test_stats(store: tuple[Path, list[Plan], str]) -> None:
    root, plans, _ = store
    stats = json.loads(ok("stats", str(root), "--json"))
    size = sum(f.stat().st_size for f in root.glob("startup_plan_*.json"))
    assert stats["url"] == str(root)
    assert (stats["plans"], stats["invalid"], stats["bytes"]) == (3, 1, size)
    assert stats["oldest"] == pytest.approx(plans[2].created_at)
    assert stats["newest"] == pytest.approx(plans[0].created_at)
    assert stats["devices"] == {"NVIDIA H100": 2, "NVIDIA A10G": 1}
    text = ok("stats", str(root))
    assert "3 (1 invalid)" in text and "(40d ago)" in text
    assert "NVIDIA H100 (2), NVIDIA A10G (1)" in text


# -- verify, rm, prune -------------------------------------------------------------------------
def test_verify_reports_every_rule_and_fix_deletes(store: tuple[Path, list[Plan], str]) -> None:
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
        "unsupported schema '1'": (
            key("schema"),
            record_bytes(factors={"r": "schema"}, schema="1"),
        ),
        "over 65536 bytes": (
            key("big"),
            record_bytes(factors={"r": "big"}, pad="x" * MAX_RECORD_BYTES),
        ),
        "lacks producer": (key("short"), record_bytes(factors={"r": "short"}, drop="producer")),
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
    write_raw(root, newer, b'{"schema": 2, "fingerprint": "%s"}' % newer.encode())
    kept_line = (
        f"{newer}  record has schema 2; this plancache reads 1 (another version's record: kept)"
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
    assert ok("verify", str(root)).splitlines() == [
        kept_line,
        f"4 records checked in {root}: 0 invalid",
    ]
    left = sorted(open_store(str(root)).iter_fingerprints())
    assert left == sorted([newer, *(p.fingerprint for p in plans)])


def test_rm(store: tuple[Path, list[Plan], str]) -> None:
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


def test_prune(store: tuple[Path, list[Plan], str]) -> None:
    root, plans, _ = store
    s = open_store(str(root))
    stale = root / f".{object_name(plans[0].fingerprint)}.host.1.abcd.x.tmp"
    live = root / f".{object_name(plans[0].fingerprint)}.host.2.ef01.y.tmp"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    dry = ok("prune", "--older-than", "30d", "--dry-run", str(root))
    assert dry.splitlines()[0].startswith(f"would delete {plans[2].fingerprint}  40d old")
    assert "would delete 1 plan older than 30d" in dry and "1 abandoned temp file" in dry
    assert "1 invalid record left" in dry
    assert len(list(s.iter_fingerprints())) == 4 and stale.exists()

    out = ok("prune", str(root), "--older-than", "10d")
    assert "deleted 2 plans older than 10d" in out and "1 abandoned temp file" in out
    assert not stale.exists() and live.exists()
    assert s.get(plans[0].fingerprint) is not None
    assert s.get(plans[1].fingerprint) is None and s.get(plans[2].fingerprint) is None
    for duration in ("12h", "45m", "10s"):
        assert run("prune", "--older-than", duration, "--dry-run", str(root)).returncode == 0
    result = run("prune", "--older-than", "30 days", str(root))
    assert result.returncode == 2 and "not a duration like 30d" in result.stderr


# -- cp ----------------------------------------------------------------------------------------
def test_cp_merges(tmp_path: Path, store: tuple[Path, list[Plan], str]) -> None:
    root, plans, _ = store
    dst = tmp_path / "new" / "dst"  # created on the first write
    out = ok("cp", str(root), str(dst))
    assert out == f"copied {root} -> {dst}: 3 created, 0 replaced, 0 kept, 1 invalid skipped\n"
    assert sorted(open_store(str(dst)).iter_fingerprints()) == sorted(p.fingerprint for p in plans)
    # DST holds a plan that dominates one of SRC's, and SRC a plan that dominates one of DST's
    better = make_plan("a", kv_gib=4, age_days=0)
    worse = make_plan("b", kv_gib=0.5, baseline_gib=60)
    open_store(str(root)).put(better)
    open_store(str(dst)).put(worse)  # kept: the stored one dominates
    out = ok("cp", str(root), str(dst))
    assert "0 created, 1 replaced, 2 kept, 1 invalid skipped" in out
    assert open_store(str(dst)).get(better.fingerprint) == better


def _fill(root: Path, n: int) -> None:
    s = open_store(str(root))
    for i in range(n):
        s.put(make_plan(f"p{i}"))


def test_cp_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _fill(src, 25)
    result = run("cp", str(src), str(tmp_path / "piped"))
    assert result.returncode == 0 and result.stderr == ""

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plancache", "cp", str(src), str(tmp_path / "tty")],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=cli_env(),
    )
    os.close(slave)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        stdout, _ = proc.communicate(timeout=60)
    finally:  # pytest-timeout may interrupt the read: never leave the command running
        os.close(master)
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0
    assert b"copying [" in seen and b"] 25/25" in seen
    assert b"25 created" in stdout


# -- fingerprint -------------------------------------------------------------------------------
def test_fingerprint(tmp_path: Path, store: tuple[Path, list[Plan], str]) -> None:
    root, plans, _ = store
    factors = {"model": "m", "gpu_memory_utilization": 0.9, "tp": 2, "eager": False, "x": None}
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


# -- errors ------------------------------------------------------------------------------------
def test_expected_errors_are_one_line(tmp_path: Path, store: tuple[Path, list[Plan], str]) -> None:
    root, _, _ = store
    err = failure("ls", "nosuch://bucket/plans")
    assert (
        err.startswith("plancache: error: unknown store scheme 'nosuch'") and err.count("\n") == 1
    )
    assert "does not exist" in failure("stats", str(tmp_path / "absent"))
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "Not a directory" in failure("verify", str(a_file))
    assert "--storage-options is not valid JSON" in failure(
        "ls", str(root), "--storage-options", "{secret"
    )
    assert "must be a JSON object" in failure("ls", str(root), "--storage-options", "[]")
    # storage options never reach the output, even in messages that name them
    result = run("ls", str(root), "--storage-options", '{"secret": "hunter2-not-for-logs"}')
    assert result.returncode == 2 and "hunter2" not in result.stdout + result.stderr
    debug = run("--debug", "ls", "nosuch://bucket")
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert debug.stderr.rstrip().endswith(
        "unknown store scheme 'nosuch'; "
        + ("supported: file://, gcs://, gs://, s3://, s3a://, memory:// and other fsspec protocols")
    )
    assert run("ls", "nosuch://bucket", "--debug").stderr.count("Traceback") == 1
    assert run().returncode == 2  # no subcommand: usage


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_store(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        assert "Permission denied" in failure("ls", str(locked))
    finally:
        locked.chmod(0o700)


def test_missing_extra_is_one_line(tmp_path: Path) -> None:
    # a stand-in s3fs that fails to import the way a missing package does
    shadow = tmp_path / "shadow" / "s3fs"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 's3fs'\", name='s3fs')\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), env["PYTHONPATH"]])
    err = failure("ls", "s3://bucket/plans", env=env)
    assert err == "plancache: error: s3:// stores need 's3fs': pip install 'plancache[s3]'\n"


# -- S3 and GCS --------------------------------------------------------------------------------
@pytest.fixture
def s3_spec(moto_s3: MotoS3, s3_bucket: str) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of a fresh empty store on moto (credentials: environment)."""
    return f"s3://{s3_bucket}/plans", {"endpoint_url": moto_s3.endpoint}


@pytest.fixture
def gcs_spec(fake_gcs: FakeGCS, gcs_bucket: str) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of a fresh empty store on fake-gcs-server."""
    return f"gs://{gcs_bucket}/plans", {"endpoint_url": fake_gcs.endpoint, "token": "anon"}


@pytest.fixture(params=["s3", "gcs"])
def remote(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of a fresh empty store on the S3 or GCS test server."""
    spec: tuple[str, dict[str, Any]] = request.getfixturevalue(f"{request.param}_spec")
    return spec


def test_remote_store_end_to_end(tmp_path: Path, remote: tuple[str, dict[str, Any]]) -> None:
    url, options = remote
    opts = json.dumps(options)
    local = tmp_path / "local"
    _fill(local, 3)
    bad = fingerprint({"model": "broken"})
    write_raw(local, bad, record_bytes(kv_cache_memory_bytes=3 * GIB))

    out = ok("cp", str(local), url, "--dst-storage-options", opts)
    assert "3 created, 0 replaced, 0 kept, 1 invalid skipped" in out
    rows = json.loads(ok("ls", url, "--json", "--storage-options", opts))
    fps = sorted(r["fingerprint"] for r in rows)
    assert fps == sorted(set(open_store(str(local)).iter_fingerprints()) - {bad})
    # the shared --storage-options flag applies to the remote side only
    assert "0 created, 0 replaced, 3 kept" in ok("cp", str(local), url, "--storage-options", opts)

    env = cli_env(PLANCACHE_URL=url, PLANCACHE_STORAGE_OPTIONS=opts)
    stats = json.loads(ok("stats", "--json", env=env))
    assert (stats["url"], stats["plans"], stats["invalid"]) == (url, 3, 0)
    assert ok("show", fps[0][:10], env=env).startswith(f"fingerprint  {fps[0]}")

    back = tmp_path / "back"
    out = ok("cp", url, str(back), "--src-storage-options", opts)
    assert "3 created, 0 replaced, 0 kept, 0 invalid skipped" in out
    assert sorted(open_store(str(back)).iter_fingerprints()) == fps

    # an invalid record planted in the bucket is found, and --fix deletes it
    store = open_store(url, **options)
    try:
        assert store._create(bad, record_bytes(kv_cache_memory_bytes=3 * GIB))
    finally:
        store.close()
    result = run("verify", env=env)
    assert result.returncode == 1 and f"{bad}  kv_cache_memory_bytes" in result.stdout
    assert "1 deleted" in ok("verify", "--fix", env=env)

    assert ok("rm", fps[0][:10], env=env) == f"deleted {fps[0]}\n"
    assert "would delete 0 plans" in ok("prune", "--older-than", "1d", "--dry-run", env=env)
    assert len(json.loads(ok("ls", "--json", env=env))) == 2


def test_s3_errors_are_one_line(s3_spec: tuple[str, dict[str, Any]]) -> None:
    url, options = s3_spec
    secret = "hunter2-not-for-logs"
    dead = {"endpoint_url": f"http://127.0.0.1:{closed_port()}", "key": "id", "secret": secret}
    result = run("ls", url, "--storage-options", json.dumps(dead))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"plancache: error: {url}: ") and "reach" in result.stderr
    assert secret not in result.stdout + result.stderr

    # no credentials anywhere: none in the options, no AWS_* variables, no config files
    env = {k: v for k, v in cli_env().items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    err = failure("ls", url, "--storage-options", json.dumps(options), env=env)
    assert err.startswith(f"plancache: error: {url}: ") and "credentials" in err
