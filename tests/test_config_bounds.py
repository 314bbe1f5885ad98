"""Settings at their bounds: out-of-range timeouts and storage options, key files that are no
plain small file, and an empty URL."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from plancache import open_store
from plancache._config import MAX_KEY_FILE_BYTES, Settings, keyring_from_env
from plancache._signing import Keyring
from plancache.errors import ConfigError, UnsupportedStoreError
from plancache.testing import child_env


@pytest.mark.parametrize("value", ["1e10", "601", "1e308", "86400"])
def test_an_out_of_range_timeout_is_rejected_at_parse_time(value: str) -> None:
    with pytest.raises(ConfigError, match="PLANCACHE_TIMEOUT"):
        Settings.from_env({"PLANCACHE_TIMEOUT": value})


def test_a_sane_timeout_is_accepted() -> None:
    assert Settings.from_env({"PLANCACHE_TIMEOUT": "600"}).timeout == 600.0


@pytest.mark.parametrize(
    "option",
    [
        {"timeout": 1e10},
        {"connect_timeout": 1e6},
        {"read_timeout": float("inf")},
        {"timeout": float("nan")},
        {"retries": 1000},
    ],
)
def test_out_of_range_storage_option_bounds_are_rejected(option: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        open_store("s3://bucket/p", endpoint_url="http://127.0.0.1:9", **option)


KEY = secrets.token_hex(32)
ONE_GIB_OF_MEMORY = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
"""
"""Set first in the child (not by ``preexec_fn``, which is unsafe in a threaded parent)."""
READ_KEYS = """
import time
from plancache._config import keyring_from_env
from plancache.errors import ConfigError
start = time.monotonic()
try:
    keyring_from_env()
except ConfigError as exc:
    print(exc)
print(f"{time.monotonic() - start:.3f} s")
"""


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "link-to-a-fifo"])
def test_a_key_file_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """In a fresh process with 1 GiB of address space (what the vLLM plugin does when vLLM
    imports the GPU worker): ``/dev/zero`` is not read without end, a FIFO is not waited on."""
    path = Path("/dev/zero") if kind == "dev-zero" else tmp_path / "fifo"
    if kind != "dev-zero":
        os.mkfifo(tmp_path / "fifo")
    if kind == "link-to-a-fifo":
        path = tmp_path / "link"
        path.symlink_to(tmp_path / "fifo")
    out = subprocess.run(
        [sys.executable, "-c", ONE_GIB_OF_MEMORY + READ_KEYS],
        env=child_env(PLANCACHE_SIGNING_KEY_FILE=str(path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    message, seconds = out.stdout.splitlines()
    assert message == f"cannot read PLANCACHE_SIGNING_KEY_FILE {str(path)!r}: not a regular file"
    assert float(seconds.split()[0]) < 20  # a FIFO waited on, or /dev/zero read, never ends


def test_a_key_file_is_read_up_to_its_cap(tmp_path: Path) -> None:
    lines = f"{KEY}\n" * (MAX_KEY_FILE_BYTES // (len(KEY) + 1))
    key_file = tmp_path / "keys"
    key_file.write_text(lines + "#" * (MAX_KEY_FILE_BYTES - len(lines)))
    key_file.chmod(0o600)
    env = {"PLANCACHE_VERIFY_KEYS_FILE": str(key_file)}
    assert keyring_from_env(env) == Keyring(verify_keys=[KEY])  # exactly the cap
    with key_file.open("a") as f:
        f.write("\n")
    with pytest.raises(ConfigError, match=f"is over {MAX_KEY_FILE_BYTES} bytes: not a key file"):
        keyring_from_env(env)


@pytest.mark.parametrize(
    ("mode", "warned"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True)]
)
def test_a_key_file_other_users_may_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, warned: bool
) -> None:
    """Read either way (followed through a link, as Kubernetes mounts secrets), with one
    warning naming the file and its mode, never the key."""
    link = _linked_key(tmp_path, mode)
    with caplog.at_level(logging.WARNING, "plancache"):
        assert keyring_from_env({"PLANCACHE_SIGNING_KEY_FILE": str(link)}) == Keyring(KEY)
    lines = [r.getMessage() for r in caplog.records]
    if warned:
        assert lines == [
            f"plancache: PLANCACHE_SIGNING_KEY_FILE {str(link)!r} can be read by users other "
            f"than its owner (mode {mode:04o}); make it 0600 or 0400"
        ]
    else:
        assert lines == []
    assert KEY not in caplog.text


def _linked_key(tmp_path: Path, mode: int) -> Path:
    key_file = tmp_path / "..data" / "key"
    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")
    key_file.chmod(mode)
    link = tmp_path / "key"
    link.symlink_to(key_file)
    return link


@pytest.mark.parametrize("how", ["0620", "0602", "owner"])
def test_a_key_file_another_user_could_have_written_is_refused(tmp_path: Path, how: str) -> None:
    """A verify-keys file a neighbour could write would make the node accept what they sign
    (a signing-key file: sign with their key): refused, naming why, never the key."""
    link = _linked_key(tmp_path, 0o600)
    if how == "owner":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(tmp_path / "..data" / "key", 65534, -1)
        why = "it is owned by uid 65534"
    else:
        (tmp_path / "..data" / "key").chmod(int(how, 8))
        why = f"it is writable by its group or others (mode {how})"
    with pytest.raises(ConfigError) as raised:
        keyring_from_env({"PLANCACHE_VERIFY_KEYS_FILE": str(link)})
    assert str(raised.value) == (
        f"PLANCACHE_VERIFY_KEYS_FILE {str(link)!r} is not used: {why}; make it this user's, 0600"
    )
    assert KEY not in str(raised.value)


def test_an_empty_url_is_rejected() -> None:
    with pytest.raises(UnsupportedStoreError, match="empty"):
        open_store("")
    with pytest.raises(UnsupportedStoreError, match="empty"):
        open_store("   ")
    with pytest.raises(UnsupportedStoreError, match="empty"):
        Settings(url="").open_store()
