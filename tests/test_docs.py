"""Every code block of the docs (README.md, CONTRIBUTING.md, docs/*.md) runs here.

- ``python``: executed in a fresh interpreter, with a temporary ``HOME`` and
  ``VLLM_CACHE_ROOT``, ``PLANCACHE_URL`` a temporary local store and no other ``PLANCACHE_*``
  setting (a block that defines pytest tests only defines them: the store contract's
  example is run whole by ``tests/testing/test_contract.py``);
- ``console``: each ``$ plancache ...`` line is run against a local store seeded by ``seed``
  (``PLANCACHE_URL``); the first line of its output must be the line that follows it;
- ``bash``: ``bash -n`` (syntax), and every ``PLANCACHE_*``/``VLLM_*`` name it uses must be one
  the README's configuration tables document;
- ``yaml``: parses, with the same rule for the names it uses.

A block in any other language, or without one, fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from plancache import Plan, open_store
from plancache._keys import Scalar, plan_object_name

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.M | re.S)
ENV_NAME = re.compile(r"\b((?:PLANCACHE|VLLM)_[A-Z0-9_]+)\b")
CHECKED = ("python", "console", "bash", "yaml")
GiB = 1 << 30

QWEN: dict[str, Scalar] = {
    "model": "Qwen/Qwen3-8B",
    "device_name": "NVIDIA H100 80GB HBM3",
    "gpu_memory_utilization": 0.9,
    "rank": 0,
}
LLAMA: dict[str, Scalar] = {
    **QWEN,
    "model": "meta-llama/Llama-3.1-8B",
    "device_name": "NVIDIA A10G",
}


def blocks() -> list[tuple[str, str, str]]:
    """(``file:line``, language, code) of every fenced block of the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return found


BLOCKS = blocks()


def of(language: str) -> list[tuple[str, str]]:
    return [(where, code) for where, lang, code in BLOCKS if lang == language]


def documented() -> set[str]:
    """The variables named in the first column of the README's Configuration tables."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in ENV_NAME.findall(cell)}


def seed(directory: Path) -> None:
    """The store the console examples show: a plan of three observations, one of one, and a
    record that breaks a rule."""
    store = open_store(str(directory))
    now = time.time()
    labels: dict[str, Scalar] = {
        "model": "Qwen/Qwen3-8B",
        "dtype": "bfloat16",
        "tensor_parallel_size": 1,
    }
    for host, kv, baseline, age in (
        ("node-a", 61.2, 75.1, 7340),
        ("node-b", 60.9, 74.3, 7300),
        ("node-c", 59.0, 72.0, 7220),
    ):
        producer = {"host": host, "plancache": "0.2.0"}
        kv_bytes, base_bytes = int(kv * GiB), int(baseline * GiB)
        plan = Plan.new(
            QWEN,
            kv_cache_memory_bytes=kv_bytes,
            free_memory_baseline=base_bytes,
            producer=producer,
            created_at=now - age,
            labels=labels,
        )
        store.put(plan)
    llama: dict[str, Scalar] = {"model": "meta-llama/Llama-3.1-8B"}
    store.put(
        Plan.new(
            LLAMA,
            kv_cache_memory_bytes=int(14.85 * GiB),
            free_memory_baseline=int(21.3 * GiB),
            producer={"host": "node-q", "plancache": "0.2.0"},
            created_at=now - 20 * 86400,
            labels=llama,
        )
    )
    (directory / plan_object_name("ab" * 32)).write_bytes(b'{"schema": 2}')


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment every block runs in: no setting of the caller's leaks in."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PLANCACHE_", "VLLM_"))}
    home = tmp_path / "home"
    home.mkdir()
    return {
        **clean,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "PLANCACHE_URL": str(tmp_path / "store"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def test_every_block_has_a_checked_language() -> None:
    assert len(BLOCKS) >= 5
    unchecked = [(where, lang) for where, lang, _ in BLOCKS if lang not in CHECKED]
    assert not unchecked, f"blocks no test runs (use one of {CHECKED}): {unchecked}"


def test_every_setting_the_code_reads_is_documented() -> None:
    read = set()
    for path in (ROOT / "plancache").rglob("*.py"):
        read |= set(re.findall(r"\"(PLANCACHE_[A-Z0-9_]+)\"", path.read_text()))
    assert read, "no setting found: the pattern is stale"
    assert read <= documented(), f"missing from the README's table: {read - documented()}"


@pytest.mark.parametrize(("where", "code"), of("python"))
def test_python_block_runs(where: str, code: str, env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "test_block.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{where}\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize(("where", "code"), of("console"))
def test_console_block_matches_a_real_run(
    where: str, code: str, env: dict[str, str], tmp_path: Path
) -> None:
    seed(Path(env["PLANCACHE_URL"]))
    lines = code.splitlines()
    commands = [i for i, line in enumerate(lines) if line.startswith("$ ")]
    assert commands, f"{where}: no command"
    for i in commands:
        args = shlex.split(lines[i][2:])
        assert args[0] == "plancache", f"{where}: only plancache commands are run: {lines[i]}"
        result = subprocess.run(
            [sys.executable, "-m", "plancache", *args[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode in (0, 1), f"{where}: {lines[i]}\n{result.stderr}"
        shown = lines[i + 1].split() if i + 1 < len(lines) else []
        assert result.stdout.splitlines()[0].split() == shown, f"{where}: {lines[i]}"


@pytest.mark.parametrize(("where", "code"), of("bash"))
def test_bash_block_parses_and_names_documented_settings(where: str, code: str) -> None:
    result = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
    assert result.returncode == 0, f"{where}: {result.stderr}"
    unknown = set(ENV_NAME.findall(code)) - documented()
    assert not unknown, f"{where}: undocumented settings {unknown}"


@pytest.mark.parametrize(("where", "code"), of("yaml"))
def test_yaml_block_parses_and_names_documented_settings(where: str, code: str) -> None:
    assert yaml.safe_load(code) is not None, where
    unknown = set(ENV_NAME.findall(code)) - documented()
    assert not unknown, f"{where}: undocumented settings {unknown}"
