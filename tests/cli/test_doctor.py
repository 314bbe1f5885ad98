"""``plancache doctor``: run for real against honest, lying, write-denied and flaky stores
on 127.0.0.1, and on a local store; exit 0 all good, 1 findings, 2 could not run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from plancache._backends import open_layer
from plancache._backends._remote import RemoteStore
from plancache._backends.verdicts import SHARED_VERDICT, VERDICTS_DIR
from plancache._breaker import MARKS_DIR
from plancache._defaults import EXPLAIN_DIR
from plancache.integrations.vllm.factors import keep_for_explain
from plancache.testing import child_env
from plancache.testing.hostile import FaultyProxy, LyingProxy, SilentServer, writes
from plancache.testing.servers import CountingProxy
from tests.cli.helpers import LocalFixture, RemoteSpec, run


def doctor(
    spec: RemoteSpec, endpoint: str, tmp_path: Path, code: int, **env: str
) -> dict[str, Any]:
    """``plancache doctor URL --json`` with the store behind ``endpoint``; must exit ``code``."""
    url, options = spec
    # bounds a machine loaded by parallel test runs stays within (defaults: 1 s reads)
    options = {"read_timeout": 5, "timeout": 10, **options, "endpoint_url": endpoint}
    environment = child_env(VLLM_CACHE_ROOT=str(tmp_path / "root"), **env)
    result = run("doctor", url, "--json", "--storage-options", json.dumps(options), env=environment)
    assert result.returncode == code, (result.stdout, result.stderr)
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def status(report: dict[str, Any], check: str) -> tuple[str, str]:
    row = next(c for c in report["checks"] if c["check"] == check)
    return row["status"], row["detail"]


def test_an_honest_store_is_all_good(remote: RemoteSpec, tmp_path: Path) -> None:
    with CountingProxy(remote[1]["endpoint_url"]) as proxy:
        report = doctor(remote, proxy.endpoint, tmp_path, 0)
    assert report["findings"] == 0
    assert status(report, "verdict")[0] == "ok"
    assert status(report, "verdict")[1].startswith("honest")
    for check in ("read", "list", "write", "delete", "clock", "cas-wrong-version"):
        assert status(report, check)[0] == "ok", check
    assert "p50" in status(report, "read")[1]
    assert status(report, "credentials")[0] == "info"
    assert status(report, "version")[0] == "info"  # no vLLM here: shown, not a finding
    assert len(list((tmp_path / "root" / "startup_plan" / VERDICTS_DIR).iterdir())) == 1
    store = open_layer(remote[0], **remote[1])
    assert isinstance(store, RemoteStore)
    shared = store.probe_store().read_object(SHARED_VERDICT, 4096)  # for the fleet's nodes
    assert shared is not None and json.loads(shared[0])["verdict"] == "honest"


def test_a_lying_store_is_a_finding_naming_the_step(remote: RemoteSpec, tmp_path: Path) -> None:
    with LyingProxy(remote[1]["endpoint_url"]) as proxy:
        report = doctor(remote, proxy.endpoint, tmp_path, 1)
    assert status(report, "create-existing")[0] == "finding"
    assert status(report, "verdict")[0] == "finding"
    assert status(report, "verdict")[1].startswith("lies")
    assert status(report, "concurrent-create")[0] == "info"  # not run after the lie


def test_write_denied_is_a_finding_unless_read_only_is_meant(
    remote: RemoteSpec, tmp_path: Path
) -> None:
    with FaultyProxy(remote[1]["endpoint_url"], 403, writes) as proxy:
        report = doctor(remote, proxy.endpoint, tmp_path, 1)
        assert status(report, "write")[0] == "finding"
        assert status(report, "verdict")[1].startswith("read-only")
        replica = doctor(remote, proxy.endpoint, tmp_path, 0, PLANCACHE_READ_ONLY="1")
        assert status(replica, "write")[0] == "info"


def test_a_flaky_store_gives_no_verdict(remote: RemoteSpec, tmp_path: Path) -> None:
    flaky = FaultyProxy(remote[1]["endpoint_url"], 503, lambda n, m, p: m in ("PUT", "POST"))
    with flaky as proxy:
        report = doctor(remote, proxy.endpoint, tmp_path, 1)
    assert status(report, "read")[0] == "ok"
    assert status(report, "verdict")[1].startswith("unknown")
    assert not (tmp_path / "root" / "startup_plan" / VERDICTS_DIR).exists()


def test_node_checks_on_a_local_store(tmp_path: Path) -> None:
    env = child_env(VLLM_CACHE_ROOT=str(tmp_path), PLANCACHE_COMPILE_CACHE="1")
    store = tmp_path / "plans"
    store.mkdir(mode=0o700)
    result = run("doctor", str(store), env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "atomic by construction" in result.stdout
    assert "0 findings" in result.stdout
    filtered = run("doctor", str(store), "--json", env={**env, "VLLM_PLUGINS": "other"})
    assert filtered.returncode == 1
    assert status(json.loads(filtered.stdout), "VLLM_PLUGINS")[0] == "finding"
    assert "VLLM_PLUGINS" in status(json.loads(filtered.stdout), "compile artifacts")[1]
    aot_off = run("doctor", str(store), "--json", env={**env, "VLLM_USE_AOT_COMPILE": "0"})
    kind = status(json.loads(aot_off.stdout), "compile artifacts")
    assert kind == ("info", "off: VLLM_USE_AOT_COMPILE=0 (vLLM saves no AOT artifact)")
    both = {**env, "VLLM_USE_AOT_COMPILE": "0", "VLLM_DISABLE_COMPILE_CACHE": "1"}
    kind = status(
        json.loads(run("doctor", str(store), "--json", env=both).stdout), "compile artifacts"
    )
    assert kind == (  # unsetting one of them is not enough: both are named
        "info",
        "off: VLLM_DISABLE_COMPILE_CACHE=1 (vLLM keeps no compile cache); "
        "VLLM_USE_AOT_COMPILE=0 (vLLM saves no AOT artifact)",
    )


def test_doctor_points_to_explain_for_the_newest_miss(tmp_path: Path) -> None:
    env = child_env(VLLM_CACHE_ROOT=str(tmp_path), PLANCACHE_URL=str(tmp_path / "plans"))
    report = json.loads(run("doctor", "--json", env=env).stdout)
    assert status(report, "misses")[1].startswith("none kept")
    local = tmp_path / "plans"  # the node's local directory: its local store
    for at, fp in enumerate(("b" * 64, "a" * 64)):
        newest = keep_for_explain(local, fp, {"rank": 0}, {})
        os.utime(newest, (1e9 + at, 1e9 + at))
    report = json.loads(run("doctor", "--json", env=env).stdout)
    assert status(report, "misses") == (
        "info",
        f"2 missed lookups kept in {local / EXPLAIN_DIR}; why the newest missed: "
        f"plancache explain {tmp_path / 'plans'} --factors {newest}",
    )


def test_doctor_follows_no_link_planted_in_the_local_directory(tmp_path: Path) -> None:
    """A neighbour who may write the local directory links ``explain`` to a directory of
    JSON files and ``marks`` elsewhere: doctor read both through the links (it named a file
    of theirs as the newest miss to pass to ``plancache explain``, and reported the other
    directory's owner and mode as the marks directory's). Now the explain listing goes
    through the guarded handle (no miss kept) and the link is a finding."""
    local, elsewhere = tmp_path / "plans", tmp_path / "elsewhere"
    local.mkdir()
    elsewhere.mkdir()
    (elsewhere / "theirs.json").write_text("{}")
    (local / EXPLAIN_DIR).symlink_to(elsewhere)
    (local / MARKS_DIR).symlink_to(elsewhere)
    env = child_env(VLLM_CACHE_ROOT=str(tmp_path), PLANCACHE_URL=str(local))
    report = json.loads(run("doctor", "--json", env=env).stdout)
    assert status(report, "misses")[1].startswith("none kept"), status(report, "misses")
    assert status(report, "marks dir") == (
        "finding",
        f"{local / MARKS_DIR}: a symbolic link, not opened",
    )


def test_no_secret_in_the_report(s3_spec: RemoteSpec, tmp_path: Path) -> None:
    url, options = s3_spec
    secret = "sekrit-VALUE-0123456789"
    spec = (url, {**options, "key": "AKIAEXAMPLEKEYID9876", "secret": secret})
    with CountingProxy(options["endpoint_url"]) as proxy:
        report = doctor(spec, proxy.endpoint, tmp_path, 0)
    text = json.dumps(report)
    assert secret not in text and "AKIAEXAMPLEKEYID9876" not in text
    assert status(report, "credentials")[1] == "storage options (key and secret)"


@pytest.mark.parametrize("env", [{"PLANCACHE_TIMEOUT": "never"}, {}])
def test_could_not_run_exits_2(env: dict[str, str], tmp_path: Path) -> None:
    with SilentServer() as silent:
        options = json.dumps({"endpoint_url": silent.endpoint})
        args = ["doctor", "s3://bucket/p", "--storage-options", options, "--timeout", "2"]
        result = run(*args, env=child_env(VLLM_CACHE_ROOT=str(tmp_path), **env))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "plancache: error:" in result.stderr and "Traceback" not in result.stderr


def test_commands_never_write_through_a_lying_store(
    remote: RemoteSpec, store: LocalFixture, tmp_path: Path
) -> None:
    """``cp`` into a lying store stops at its first write with one error line, having
    written no plan; reading commands never probe; the setting writes anyway."""
    root, plans, _ = store
    url, options = remote
    env = child_env(VLLM_CACHE_ROOT=str(tmp_path))
    with LyingProxy(options["endpoint_url"]) as proxy:
        lying = json.dumps({**options, "endpoint_url": proxy.endpoint})
        cp = run("cp", str(root), url, "--dst-storage-options", lying, env=env)
        assert cp.returncode == 2, (cp.stdout, cp.stderr)
        assert "ignores write preconditions (create-existing" in cp.stderr
        proxy.reset()
        listed = run("ls", url, "--storage-options", lying, env=env)
        assert listed.returncode == 0 and "nothing stored" in listed.stdout, listed.stdout
        assert all(method == "GET" for method, _ in proxy.requests)
        trusting = {**env, "PLANCACHE_TRUST_PRECONDITIONS": "1"}
        cp = run("cp", str(root), url, "--dst-storage-options", lying, env=trusting)
        assert cp.returncode == 0, cp.stderr
        assert "PLANCACHE_TRUST_PRECONDITIONS=1" in cp.stderr
        assert f"{len(plans)} plans" in run("ls", url, "--storage-options", lying, env=env).stdout
