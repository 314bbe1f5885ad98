"""Running the ``plancache`` command for real (``python -m plancache``) in a subprocess, and
writing records as raw bytes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plancache import Plan, fingerprint, open_store
from plancache._keys import plan_object_name
from plancache._merge import frontier
from plancache._observation import Observation
from plancache.testing import GiB, child_env

DAY = 86400.0
LocalFixture = tuple[Path, list[Plan], str]
"""A local store's root, its plans (newest first) and the fingerprint of its invalid record."""
RemoteSpec = tuple[str, dict[str, Any]]
"""A remote store's URL and storage options."""


def run(
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m plancache ARGS`` (in ``cwd``) and return its result (never raises on
    exit codes; fails the test past ``timeout`` seconds)."""
    return subprocess.run(
        [sys.executable, "-m", "plancache", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else child_env(),
        timeout=timeout,
        cwd=cwd,
    )


def ok(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None) -> str:
    """Run a command that must succeed; its stdout."""
    result = run(*args, env=env, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def failure(
    *args: str, code: int = 2, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> str:
    """Run a command that must fail with ``code`` and one error line; its stderr."""
    result = run(*args, env=env, stdin=stdin)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def named_plan(
    name: str, *, kv_gib: float = 1, baseline_gib: float = 70, age_days: float = 0, **factors: Any
) -> Plan:
    """A one-observation plan of model ``name`` (also its ``model`` label) on an
    ``NVIDIA H100`` (unless ``factors`` say otherwise), recorded ``age_days`` ago by host
    ``host-{name}``."""
    return frontier_plan(name, [(kv_gib, baseline_gib, age_days)], **factors)


def observation(
    kv_gib: float, baseline_gib: float, age_days: float = 0, host: str = ""
) -> Observation:
    """One observation: ``kv_gib`` of KV cache from ``baseline_gib`` free, ``age_days`` old."""
    return Observation(
        kv_cache_memory_bytes=int(kv_gib * GiB),
        free_memory_baseline=int(baseline_gib * GiB),
        created_at=time.time() - age_days * DAY,
        producer={"host": host or "-", "plancache": "test"},
    )


def frontier_plan(name: str, points: list[tuple[float, float, float]], **factors: Any) -> Plan:
    """A plan of model ``name`` holding the frontier of ``points`` (KV GiB, baseline GiB,
    age in days), each recorded by host ``host-{name}``; factors as ``named_plan``'s."""
    keyed: dict[str, Any] = {"model": name, "device_name": "NVIDIA H100", **factors}
    obs = frontier(observation(kv, base, age, f"host-{name}") for kv, base, age in points)
    return Plan(fingerprint(keyed), keyed, obs, {"model": name})


def fill(root: Path, n: int) -> None:
    """Put ``n`` distinct plans into the local store at ``root``."""
    s = open_store(str(root))
    for i in range(n):
        s.put(named_plan(f"p{i}"))


def write_raw(root: Path, fp: str, data: bytes) -> None:
    """Store ``data`` as the record under ``fp`` in the local store at ``root``, unchecked."""
    root.mkdir(parents=True, exist_ok=True)
    (root / plan_object_name(fp)).write_bytes(data)


def record_bytes(drop: str = "", **fields: Any) -> bytes:
    """A schema-1 record with ``fields`` overridden and ``drop`` left out (may break any rule)."""
    factors = fields.pop("factors", {"model": "broken"})
    record = {
        "schema": 1,
        "fingerprint": fingerprint(factors),
        "factors": factors,
        "kv_cache_memory_bytes": GiB,
        "free_memory_baseline": 2 * GiB,
        "created_at": time.time(),
        "producer": {},
        **fields,
    }
    record.pop(drop, None)
    return json.dumps(record).encode()
