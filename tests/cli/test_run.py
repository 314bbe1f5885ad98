"""``plancache run -- CMD``: the program's caches pulled before it starts and pushed after it
ends (SIGTERM included), its exit status kept, plancache's own failures never its own. A
tiny Python program stands for a compiling one: a kind of its own (``--dir``, ``--factor``)
needs no torch."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plancache import open_store
from plancache.testing import child_env

KIND = ("--kind", "myjit", "--factor", "compiler=1.2.3")


def _run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plancache", "run", *args],
        capture_output=True,
        text=True,
        env=child_env() if env is None else env,
        cwd=cwd,
        timeout=120,
    )


def _program(source: str) -> list[str]:
    return ["--", sys.executable, "-c", textwrap.dedent(source)]


def _bundles(store: Path) -> list[str]:
    return list(open_store(str(store)).layer.list_objects("cache_myjit_"))


def test_run_pulls_before_pushes_after_and_keeps_the_exit_status(tmp_path: Path) -> None:
    store, first, second = tmp_path / "store", tmp_path / "first", tmp_path / "second"
    where = (*KIND, "--url", str(store))
    compiles = _program(
        f"""
        from pathlib import Path
        Path({str(first)!r}, "5e").mkdir(parents=True)
        Path({str(first)!r}, "5e", "kernel.bin").write_bytes(b"compiled")
        raise SystemExit(3)
        """
    )
    result = _run(*where, "--dir", str(first), *compiles)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"plancache: store {store}")
    assert ": miss, 0 bundles" in lines[1] and "1 file stored as one bundle" in lines[2]
    assert len(_bundles(store)) == 1
    # a new machine: the file is there before the program starts; nothing new to push
    finds = _program(
        f"""
        from pathlib import Path
        print(Path({str(second)!r}, "5e", "kernel.bin").read_bytes().decode())
        """
    )
    result = _run(*where, "--dir", str(second), *finds)
    assert (result.returncode, result.stdout) == (0, "compiled\n"), result.stderr
    assert "hit, 1 bundle, 1 file installed" in result.stderr
    assert "nothing new: nothing stored" in result.stderr
    assert len(_bundles(store)) == 1


def test_sigterm_is_forwarded_to_the_program_and_the_cache_pushed_after(tmp_path: Path) -> None:
    store, cache, marker = tmp_path / "store", tmp_path / "cache", tmp_path / "got-term"
    waits = _program(
        f"""
        import signal, sys, threading
        from pathlib import Path
        def stop(signum, frame):
            Path({str(marker)!r}).write_text(str(signum))
            sys.exit(7)
        signal.signal(signal.SIGTERM, stop)
        Path({str(cache)!r}, "ab").mkdir(parents=True)
        Path({str(cache)!r}, "ab", "graph.py").write_text("compiled before the signal")
        print("ready", flush=True)
        threading.Event().wait(100)
        raise SystemExit(1)
        """
    )
    command = [sys.executable, "-m", "plancache", "run", *KIND, "--url", str(store)]
    with subprocess.Popen(
        [*command, "--dir", str(cache), *waits],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    ) as wrapper:
        assert wrapper.stdout is not None
        assert wrapper.stdout.readline() == "ready\n"  # the program runs, its handler set
        wrapper.send_signal(signal.SIGTERM)  # to plancache, as a pod's stop sends it
        _, err = wrapper.communicate(timeout=120)
    assert wrapper.returncode == 7, err  # the program's own status: it got the signal
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert "1 file stored as one bundle" in err
    assert len(_bundles(store)) == 1


@pytest.mark.parametrize(
    ("given", "seen"), [("SIG_DFL", "default_int_handler"), ("SIG_IGN", "SIG_IGN")]
)
def test_the_program_keeps_its_own_ctrl_c(tmp_path: Path, given: str, seen: str) -> None:
    """plancache leaves SIGINT to the program (a terminal sends it to both): the program
    starts with the disposition plancache was given (a shell's background job is given
    SIGINT ignored), not the one plancache sets for itself while the program runs."""
    asks = _program(
        "import signal; h = signal.getsignal(signal.SIGINT); "
        "print(getattr(h, 'name', None) or h.__name__)"
    )
    given_then_run = (
        "import os, signal, sys; "
        f"signal.signal(signal.SIGINT, signal.{given}); "
        "os.execv(sys.executable, [sys.executable, '-m', 'plancache', *sys.argv[1:]])"
    )
    where = ("--dir", str(tmp_path / "c"), "--url", str(tmp_path / "s"))
    result = subprocess.run(
        [sys.executable, "-c", given_then_run, "run", *KIND, *where, *asks],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, f"{seen}\n"), result.stderr


def test_a_program_killed_by_a_signal_exits_128_plus_it(tmp_path: Path) -> None:
    dies = _program("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    result = _run(*KIND, "--dir", str(tmp_path / "c"), "--url", str(tmp_path / "s"), *dies)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr


def test_the_cache_never_fails_the_program(tmp_path: Path) -> None:
    """A mistyped store URL is one line; the program runs, its status kept, nothing written
    where the typo points."""
    runs = _program("print('ran'); raise SystemExit(5)")
    result = _run(*KIND, "--dir", "d", "--url", "s3:/fleet/caches", *runs, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (5, "ran\n")
    assert "caches not shared" in result.stderr and "'s3:' is not followed by '//'" in result.stderr
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "d").exists()
    # a kind that cannot be scoped here (no --factor) is the same: a line, the program runs
    result = _run("--kind", "myjit", "--dir", "d", *runs, cwd=tmp_path)
    assert result.returncode == 5 and "caches not shared" in result.stderr


def test_a_program_that_cannot_start_is_127_and_nothing_pushed(tmp_path: Path) -> None:
    result = _run(
        *KIND, "--dir", str(tmp_path / "c"), "--url", str(tmp_path / "s"), "--", "no-such-program-x"
    )
    assert result.returncode == 127 and "no-such-program-x" in result.stderr
    assert "stored" not in result.stderr
