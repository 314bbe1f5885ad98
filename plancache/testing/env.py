"""Environments for the child processes that tests start (fresh boots, CLI runs, ranks)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import plancache

SETTINGS_VARS = (
    "PLANCACHE_URL",
    "PLANCACHE_ENABLE",
    "PLANCACHE_TIMEOUT",
    "PLANCACHE_READ_ONLY",
    "PLANCACHE_LOCAL_TIER",
    "PLANCACHE_STORAGE_OPTIONS",
    "PLANCACHE_SIGNING_KEY",
    "PLANCACHE_SIGNING_KEY_FILE",
    "PLANCACHE_VERIFY_KEYS",
    "PLANCACHE_VERIFY_KEYS_FILE",
    "PLANCACHE_TRUST_PRECONDITIONS",
    "VLLM_ENABLE_STARTUP_PLAN",
)
"""Variables that change what plancache does; a child inherits none of them from the test."""

PACKAGE_ROOT = Path(plancache.__file__).resolve().parent.parent
"""The directory holding the ``plancache`` package in use (a checkout's root in development)."""


def child_env(pythonpath: Iterable[str | os.PathLike[str]] = (), **extra: str) -> dict[str, str]:
    """This process's environment without plancache's settings, with ``pythonpath`` and
    ``PACKAGE_ROOT`` on ``PYTHONPATH`` (so the child imports this same plancache), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*pythonpath, PACKAGE_ROOT])
    env.update(extra)
    return env
