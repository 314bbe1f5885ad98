"""Expected failures: one ``plancache: error: ...`` line and exit 2, no secret in it;
``--debug`` adds the traceback."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from plancache.testing import child_env
from plancache.testing.servers import closed_port
from tests.cli.helpers import LocalFixture, RemoteSpec, failure, run


def test_expected_errors_are_one_line(tmp_path: Path, store: LocalFixture) -> None:
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
    assert "unknown store scheme 'nosuch': give a local path" in debug.stderr
    assert debug.stderr.rstrip().endswith(
        "(served here: file://, gcs://, gs://, s3://, s3a://, memory:// and other fsspec protocols)"
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
    err = failure("ls", "s3://bucket/plans", env=child_env([shadow.parent]))
    assert err == "plancache: error: s3:// stores need 's3fs': pip install 'plancache[s3]'\n"


def test_s3_errors_are_one_line(s3_spec: RemoteSpec) -> None:
    url, options = s3_spec
    secret = "hunter2-not-for-logs"
    dead = {
        **options,
        "endpoint_url": f"http://127.0.0.1:{closed_port()}",
        "key": "id",
        "secret": secret,
    }
    result = run("ls", url, "--storage-options", json.dumps(dead))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"plancache: error: {url}: ") and "reach" in result.stderr
    assert secret not in result.stdout + result.stderr

    # no credentials anywhere: none in the options, no AWS_* variables, no config files
    env = {k: v for k, v in child_env().items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    err = failure("ls", url, "--storage-options", json.dumps(options), env=env)
    assert err.startswith(f"plancache: error: {url}: ") and "credentials" in err


@pytest.mark.parametrize(
    ("url", "package"), [("abfs://container/plans", "adlfs"), ("sftp://host/plans", "paramiko")]
)
def test_a_missing_fsspec_package_is_one_line(url: str, package: str) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    scheme = url.partition("://")[0]
    err = failure("ls", url)
    assert err == f"plancache: error: {scheme}:// stores need {package!r}: pip install {package}\n"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e10", "601", "2h"])
def test_a_timeout_out_of_range_is_a_usage_error(value: str, tmp_path: Path) -> None:
    """Every time setting is a number of seconds in (0, 600] (as ``PLANCACHE_TIMEOUT``):
    anything else is a usage error, exit 2 with one error line, never a traceback."""
    for args in (
        ("--timeout", value, "ls", str(tmp_path)),
        ("ls", str(tmp_path), "--timeout", value),
    ):
        result = run(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if "error:" in line]
        assert errors == [result.stderr.splitlines()[-1]], result.stderr
        assert (
            f"argument --timeout: {value!r}: expected a positive number of seconds, at most 600"
            in errors[0]
        )


def test_a_timeout_in_range_bounds_the_command(tmp_path: Path) -> None:
    for value in ("600", "10m", "0.5"):
        assert run("--timeout", value, "ls", str(tmp_path)).returncode == 0, value
