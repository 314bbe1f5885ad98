"""The launcher the real-Worker boots fork from (``tox -e vllm``): each child is a process of
its own with its own environment, started from a zygote that holds no thread."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.vllm.launcher import Launcher
from tests.vllm.support import REPO, boot_env, vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (tox -e vllm)"),
]
PROBE = """
import json, os, sys, threading, time
import vllm.envs
tasks = len(os.listdir("/proc/self/task"))
print(json.dumps({
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "cache_root": vllm.envs.VLLM_CACHE_ROOT,
    "marker": os.environ.get("PROBE_MARKER"),
    "tasks": tasks,
    "plancache_loaded": any(m.startswith("plancache") for m in sys.modules),
    "gpu_worker_loaded": "vllm.v1.worker.gpu_worker" in sys.modules,
    "torch_loaded": "torch" in sys.modules,
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(120)
sys.exit(int(sys.argv[2]))
"""


def test_each_child_is_a_fresh_process_with_its_own_environment(
    launcher: Launcher, tmp_path: Path
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    first = launcher.start(
        [str(script), "exit", "3"],
        boot_env(VLLM_CACHE_ROOT=str(tmp_path / "one"), PROBE_MARKER="one"),
        tmp_path,
    )
    second = launcher.start([str(script), "exit", "0"], boot_env(), REPO)
    out, err = first.communicate(timeout=60)
    report = json.loads(out)
    assert first.returncode == 3 and err == "to stderr\n"
    assert report["argv"] == ["exit", "3"] and report["cwd"] == str(tmp_path)
    assert (report["cache_root"], report["marker"]) == (str(tmp_path / "one"), "one")
    assert report["torch_loaded"] and report["tasks"] == 1
    assert not report["plancache_loaded"] and not report["gpu_worker_loaded"]
    assert report["pid"] == first.pid and report["ppid"] != os.getpid()

    out, _ = second.communicate(timeout=60)
    other = json.loads(out)
    assert second.returncode == 0 and other["pid"] not in (first.pid, report["ppid"])
    assert other["marker"] is None and other["cache_root"] != report["cache_root"]


def test_a_child_is_killed_with_sigkill(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    child = launcher.start([str(script), "sleep", "0"], boot_env(), tmp_path)
    assert child.poll() is None
    child.kill()
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
