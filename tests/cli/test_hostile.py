"""Hostile endpoints against the command (scripted HTTP servers on 127.0.0.1): whatever an
endpoint answers, every command ends on time with exit 0, 1 or 2 and at most one error line."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import pytest

from plancache.testing import child_env
from plancache.testing.hostile import EchoingServer, FixedResponseServer, ScriptedServer
from tests.cli.helpers import run
from tests.test_hostile_remotes import GCS_ODD, PAGE, S3_ODD, _listing

COMMAND_BOUND_S = 30.0


def plancache(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m plancache ARGS`` (which must end within ``COMMAND_BOUND_S``) and the
    seconds it took."""
    start = time.monotonic()
    result = run(*args, timeout=COMMAND_BOUND_S)
    return result, time.monotonic() - start


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The error line of a command that failed with exit 2 and printed nothing else there."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("plancache: error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def remote_args(backend: str, endpoint: str) -> list[str]:
    """A store URL on ``endpoint`` and its ``--storage-options``."""
    if backend == "s3":
        options = {"endpoint_url": endpoint, "key": "id", "secret": "not-a-secret"}
        return ["s3://hostile/p", "--storage-options", json.dumps(options)]
    options = {"endpoint_url": endpoint, "token": "anon"}
    return ["gs://hostile/p", "--storage-options", json.dumps(options)]


def every_listing_command(backend: str, endpoint: str, tmp_path: Path) -> dict[str, list[str]]:
    """The commands that list a store, each against the store on ``endpoint``."""
    url, flag, options = remote_args(backend, endpoint)
    return {
        "ls": ["ls", url, flag, options],
        "verify": ["verify", url, flag, options],
        "cp": ["cp", url, str(tmp_path / "copy"), flag, options],
        "prune": ["prune", "--older-than", "1d", url, flag, options],
    }


@pytest.mark.parametrize("backend", ["s3", "gcs"])
def test_a_repeated_page_token_ends_every_listing_command(backend: str, tmp_path: Path) -> None:
    with ScriptedServer(_listing(backend, lambda n: PAGE[backend]("same"))) as server:
        for name, args in every_listing_command(backend, server.endpoint, tmp_path).items():
            result, seconds = plancache(*args)
            assert "repeated a page token" in one_error_line(result), name
            assert seconds < 10, (name, seconds)


@pytest.mark.parametrize(
    ("backend", "body"), [("gcs", b) for b in GCS_ODD] + [("s3", b) for b in S3_ODD]
)
def test_an_unexpected_listing_answer_is_one_error_line(
    backend: str, body: bytes, tmp_path: Path
) -> None:
    with ScriptedServer(_listing(backend, lambda n: body)) as server:
        for name, args in every_listing_command(backend, server.endpoint, tmp_path).items():
            result, _ = plancache(*args)
            assert "unexpected answer from the endpoint" in one_error_line(result), name


def test_an_unexpected_failure_is_one_error_line_and_debug_shows_it_scrubbed() -> None:
    secret = "hunter2-not-for-logs"
    with FixedResponseServer(500, b"failing") as server:
        host = server.endpoint.removeprefix("http://")
        for url in (f"http://{host}/p?token={secret}", f"http://user:{secret}@{host}/p"):
            result, _ = plancache("ls", url)
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
            assert result.stderr.splitlines()[-1].startswith("plancache: error: ")
            assert secret not in result.stdout + result.stderr
            debug, _ = plancache("--debug", "ls", url)
            assert debug.returncode == 2 and "Traceback" in debug.stderr
            assert secret not in debug.stdout + debug.stderr, debug.stderr


# -- endpoints that echo the credentials they got ----------------------------------------------
ECHO_KEY_ID = "AKIAECHOTESTKEYID0001"
ECHO_SECRET = "echo-test-secret-access-key-0001"
ECHO_SESSION = "EchoTestSessionToken0001"  # letters and digits: a plausible S3 error code
ECHO_USER, ECHO_PASSWORD = "echo-user", "echo-test-password-0001"
ECHO_BASIC = base64.b64encode(f"{ECHO_USER}:{ECHO_PASSWORD}".encode()).decode()


def assert_no_credential(result: subprocess.CompletedProcess[str]) -> None:
    """Nothing the command resolved or was given, in any form the tests know, was printed."""
    printed = result.stdout + result.stderr
    for secret in (ECHO_KEY_ID, ECHO_SECRET, ECHO_SESSION, ECHO_PASSWORD, ECHO_BASIC):
        assert secret not in printed, printed


@pytest.mark.parametrize("code", ["key", "token"])
def test_s3_credentials_an_endpoint_echoes_are_never_printed(code: str) -> None:
    """The credentials come from the environment (botocore's chain), not from the storage
    options: the command masks what the client resolved. The endpoint echoes the access key
    id or the session token as its error code, and all of them in its message."""
    env = child_env(
        AWS_ACCESS_KEY_ID=ECHO_KEY_ID,
        AWS_SECRET_ACCESS_KEY=ECHO_SECRET,
        AWS_SESSION_TOKEN=ECHO_SESSION,
    )
    with EchoingServer("s3", code=code) as server:
        options = json.dumps({"endpoint_url": server.endpoint})
        for debug in ((), ("--debug",)):
            result = run(*debug, "ls", "s3://echo/p", "--storage-options", options, env=env)
            assert result.returncode == 2, result.stderr
            last = result.stderr.splitlines()[-1]
            assert last == "plancache: error: s3://echo/p: list: access denied: *** (HTTP 403)"
            assert_no_credential(result)
        assert server.seen[-1][code] == {"key": ECHO_KEY_ID, "token": ECHO_SESSION}[code]


def test_the_basic_auth_of_an_endpoint_url_an_endpoint_echoes_is_never_printed() -> None:
    with EchoingServer("gcs") as server:
        endpoint = server.endpoint.replace("://", f"://{ECHO_USER}:{ECHO_PASSWORD}@")
        options = json.dumps({"endpoint_url": endpoint, "token": "anon"})
        for debug in ((), ("--debug",)):
            result = run(*debug, "ls", "gs://echo/p", "--storage-options", options)
            assert result.returncode == 2, result.stderr
            assert result.stderr.splitlines()[-1] == (
                "plancache: error: gs://echo/p: list: access denied: HTTP 403: "
                "not allowed: basic=***"
            )
            assert_no_credential(result)
        assert server.seen[-1]["basic"] == ECHO_BASIC
