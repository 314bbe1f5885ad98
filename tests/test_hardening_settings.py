"""Small hardening items: settings out of range, key files that are no plain small file,
duplicate JSON keys, extreme ``created_at``, an empty URL, and a tiered store used after
``os.fork()``."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plancache import open_store
from plancache.config import MAX_KEY_FILE_BYTES, Settings, keyring_from_env
from plancache.errors import ConfigError, InvalidPlanError, UnsupportedStoreError
from plancache.plan import Plan
from plancache.signing import Keyring
from plancache.testing import child_env, make_plan
from plancache.testing.servers import MotoS3

ROOT = Path(__file__).resolve().parents[1]


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
from plancache.config import keyring_from_env
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
    assert float(seconds.split()[0]) < 5


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
    ("mode", "warned"),
    [(0o600, False), (0o400, False), (0o640, True), (0o604, True), (0o620, True), (0o602, True)],
)
def test_a_key_file_other_users_may_read_or_write_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, warned: bool
) -> None:
    """Read either way (followed through a link, as Kubernetes mounts secrets), with one
    warning naming the file and its mode, never the key."""
    key_file = tmp_path / "..data" / "key"
    key_file.parent.mkdir()
    key_file.write_text(KEY + "\n")
    key_file.chmod(mode)
    link = tmp_path / "key"
    link.symlink_to(key_file)
    with caplog.at_level(logging.WARNING, "plancache"):
        assert keyring_from_env({"PLANCACHE_SIGNING_KEY_FILE": str(link)}) == Keyring(KEY)
    lines = [r.getMessage() for r in caplog.records]
    if warned:
        assert lines == [
            f"plancache: PLANCACHE_SIGNING_KEY_FILE {str(link)!r} can be read or written by "
            f"users other than its owner (mode {mode:04o}); make it 0600 or 0400"
        ]
    else:
        assert lines == []
    assert KEY not in caplog.text


def test_duplicate_json_keys_are_rejected() -> None:
    data = make_plan().encode()
    top = data[:-1] + b',"schema":2}'
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(top)
    inner = data.replace(b'"producer":{', b'"producer":{"host":"a","host":"b",')
    with pytest.raises(InvalidPlanError, match="duplicate"):
        Plan.decode(inner)
    assert Plan.decode(data).fingerprint == make_plan().fingerprint
    tricky = data.replace(b'"producer":{', b'"producer":{"note":"a\\":b \\" :c",')
    assert Plan.decode(tricky).observations[0].producer["note"] == 'a":b " :c'  # valid


@pytest.mark.parametrize("created_at", [1e300, 253402300800.0, -1.0, 1e17])
def test_created_at_is_bounded_by_the_format(created_at: float) -> None:
    record = json.loads(make_plan().encode())
    record["observations"][0]["created_at"] = created_at
    with pytest.raises(InvalidPlanError, match="created_at"):
        Plan.decode(json.dumps(record).encode())


def test_an_empty_url_is_rejected() -> None:
    with pytest.raises(UnsupportedStoreError, match="empty"):
        open_store("")
    with pytest.raises(UnsupportedStoreError, match="empty"):
        open_store("   ")
    with pytest.raises(UnsupportedStoreError, match="empty"):
        Settings(url="").open_store()


FORKED = """
import os, sys
from plancache.config import Settings
from plancache.backends.local import LocalStore
from plancache.errors import PlanStoreError
from plancache.testing import make_plan

endpoint, bucket, tier = sys.argv[1:]
store = Settings(f"s3://{bucket}/p", local_tier=tier,
                 storage_options={"endpoint_url": endpoint}).open_store()
store.put(make_plan(kv=1 << 30))  # the client and its loop now exist in this process
pid = os.fork()
if pid == 0:
    code = 0
    try:
        store.put(make_plan(kv=2 << 30))
    except PlanStoreError as exc:
        print("store-error:", exc, flush=True)
    except BaseException as exc:
        print("other:", type(exc).__name__, exc, flush=True)
        code = 3
    plan = LocalStore(tier).get(make_plan().fingerprint)
    print("local-kv:", None if plan is None else plan.kv_cache_memory_bytes, flush=True)
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_after_a_fork_the_local_tier_is_still_written(
    moto_s3: MotoS3, s3_bucket: str, tmp_path: Path
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(FORKED),
            moto_s3.endpoint,
            s3_bucket,
            str(tmp_path / "tier"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert f"local-kv: {2 << 30}" in out.stdout, out.stdout
