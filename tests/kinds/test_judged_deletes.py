"""Deletes are conditional on what was judged: ``prune``, ``verify --fix`` and a retraction
keep an artifact another writer put in the place of the one they judged."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path

from plancache.testing import child_env
from tests.kinds.helpers import (
    DAY,
    KEY,
    PRUNE,
    RANK,
    VERIFY_FIX,
    artifacts,
    cli,
    output,
    rewrite,
    upload,
)

# -- deletes are conditional on what was judged --------------------------------------------
RACE_HOOK = '''"""Stage a race in this process: just before its first delete or rename of
TARGET, or its first lock on a file in TARGET's directory, another writer deletes TARGET and
creates it anew from NEW (create-if-absent, as plancache's writers do); FLAG records it."""
import fcntl
import os

_real = {n: getattr(os, n) for n in ("unlink", "remove", "rename", "replace")}
_real_locks = {n: getattr(fcntl, n) for n in ("flock", "lockf")}
_state = {}


def _where(path, dir_fd=None):
    path = os.fsdecode(os.fspath(path))
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.realpath(path)


def _swap():
    if _state.get("done") or not _state:
        return
    _state["done"] = True
    try:
        _real["unlink"](_state["target"])
    except FileNotFoundError:
        pass
    os.link(_state["new"], _state["target"])
    with open(_state["flag"], "w") as f:
        f.write("swapped")


def _mutating(name):
    real = _real[name]

    def hooked(src, *args, **kwargs):
        fd = kwargs.get("src_dir_fd", kwargs.get("dir_fd"))
        if _state and _where(src, fd) == _state["target"]:
            _swap()
        return real(src, *args, **kwargs)

    return hooked


def _locking(name):
    real = _real_locks[name]

    def hooked(fd, *args, **kwargs):
        number = fd if isinstance(fd, int) else fd.fileno()
        try:
            where = os.path.dirname(os.readlink(f"/proc/self/fd/{number}"))
        except OSError:
            where = None
        if _state and where == _state["dir"]:
            _swap()
        return real(fd, *args, **kwargs)

    return hooked


def install(target, new, flag):
    target = os.path.realpath(target)
    _state.update(target=target, dir=os.path.dirname(target), new=new, flag=flag)
    for n in _real:
        setattr(os, n, _mutating(n))
    for n in _real_locks:
        setattr(fcntl, n, _locking(n))


def uninstall():
    _state.clear()
    for n, f in _real.items():
        setattr(os, n, f)
    for n, f in _real_locks.items():
        setattr(fcntl, n, f)
'''
RACE_RUNNER = (
    "import os, runpy, plancache_race_hook as h; "
    "h.install(os.environ['RACE_TARGET'], os.environ['RACE_NEW'], os.environ['RACE_FLAG']); "
    "runpy.run_module('plancache', run_name='__main__', alter_sys=True)"
)


def _race_hook(tmp_path: Path) -> Path:
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "plancache_race_hook.py").write_text(RACE_HOOK)
    return hooks


def _new_artifact(tmp_path: Path) -> Path:
    """A fresh, valid artifact of (KEY, RANK), outside the store (the other writer's)."""
    return upload(tmp_path / "elsewhere", tmp_path, model=b"NEW-COMPILE" * 100)


def _racing_cli(tmp_path: Path, target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    new = _new_artifact(tmp_path)
    flag = tmp_path / "swapped"
    env = child_env(
        pythonpath=[_race_hook(tmp_path)],
        RACE_TARGET=str(target),
        RACE_NEW=str(new),
        RACE_FLAG=str(flag),
    )
    result = subprocess.run(
        [sys.executable, "-c", RACE_RUNNER, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert flag.exists(), f"the race was not staged (no delete of {target}):\n{output(result)}"
    assert "Traceback" not in result.stderr, output(result)
    assert target.exists(), f"the new artifact written meanwhile was deleted:\n{output(result)}"
    assert target.read_bytes() == new.read_bytes()
    return result


def test_prune_keeps_an_artifact_written_after_it_judged_the_old_one(tmp_path: Path) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    rewrite(path, lambda body: body.update(created_at=time.time() - 40 * DAY))
    _racing_cli(tmp_path, path, *PRUNE, str(root))


def _corrupt(name: str, data: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in data) if name.endswith("/model") else data


def test_verify_fix_keeps_an_artifact_written_after_it_judged_the_old_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    rewrite(path, files=_corrupt)  # the model no longer matches its digest
    before = cli("verify", str(root))
    assert before.returncode == 1 and path.name in before.stdout, output(before)
    _racing_cli(tmp_path, path, *VERIFY_FIX, str(root))


def test_retraction_keeps_an_artifact_written_after_it_judged_the_old_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    path = upload(root, tmp_path)
    store = artifacts(str(root))
    fetched = store.fetch(tmp_path / "node-a" / KEY, KEY, RANK)
    assert fetched.reason == "hit" and fetched.manifest is not None
    new = _new_artifact(tmp_path)
    hook = types.ModuleType("plancache_race_hook")
    exec(RACE_HOOK, hook.__dict__)  # the same hook, in this process
    flag = tmp_path / "swapped"
    hook.install(str(path), str(new), str(flag))
    try:
        gone = store.retract(KEY, RANK, fetched.manifest.digest)
    finally:
        hook.uninstall()
        store.close()
    assert flag.exists(), "the race was not staged (no delete)"
    assert path.exists(), f"the new artifact written meanwhile was deleted (gone from {gone})"
    assert path.read_bytes() == new.read_bytes() and gone == []
