"""The ``plancache`` command where torch is installed: it imports torch only for a kind that
needs it, and ``--kind inductor`` never falls back to a directory torch would make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from plancache.testing import child_env

_PROBE = """
import sys
from plancache._command.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:  # --help
    status = exc.code
print("torch imported" if "torch" in sys.modules else "no torch", status, file=sys.stderr)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command ``args`` in a fresh process that says at its end whether torch was
    imported (``sys.modules``), with the temp directory (torch's default Inductor cache's
    parent) below ``tmp_path`` and no ``TORCHINDUCTOR_CACHE_DIR``."""
    env = child_env(TMPDIR=str(tmp_path))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_command_imports_no_torch_for_what_does_not_need_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "jit").mkdir()
    for args in (
        ("--help",),
        ("cache", "push", "--help"),
        ("ls", "--url", str(store)),
        ("cache", "push", "--kind", "myjit", "--dir", str(tmp_path / "jit")),
        ("cache", "push", "--kind", "myjit", "--factor", "a=1", "--url", str(store)),
        ("cache", "push", "--kind", "inductor", "--url", str(store)),
    ):
        done = _run(tmp_path, *args)
        assert "no torch" in done.stderr, (args, done.stderr)


def test_kind_inductor_without_a_directory_is_an_error_and_makes_none(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    for verb in ("push", "pull"):
        done = _run(tmp_path, "cache", verb, "--kind", "inductor", "--url", str(store))
        assert done.returncode == 0, done.stderr  # the probe's own exit
        assert "kind inductor needs --dir (or TORCHINDUCTOR_CACHE_DIR)" in done.stderr
        assert "no torch 2" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no torchinductor_*
    missing = tmp_path / "missing"
    done = _run(tmp_path, "cache", "push", "--kind", "inductor", "--dir", str(missing))
    assert "not a directory" in done.stderr and not missing.exists()
