"""Defaults every layer shares: where plans live locally and the boot-path time budget (pure)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DEFAULT_BUDGET_S = 2.0
"""Seconds one ``PlanCache.lookup`` or ``record`` may take in all (``PLANCACHE_TIMEOUT``)."""
PUT_BUDGET_S = 30.0
"""Seconds a write's compare-and-swap loop may go on losing races (``PlanStore.put_budget_s``).
Longer than the record budget on purpose: a boot never waits for its save (the plugin saves
in a daemon thread, and ``PlanCache.record`` stops waiting at its budget), and an observation
given up is lost to the fleet. Measured: 64 writers racing on one key of a moto S3 server on
2 cores need up to 3 s."""
RECORD_EXIT_WAIT_S = 10.0
"""Seconds a process's exit waits, in all, for records still being written past their
budget (on a slow store a short-lived process would otherwise take its observation with it;
the wait is bounded like compile uploads')."""
CLOCK_SKEW_S = 300.0
"""Seconds an object's own date may be ahead of this node's clock (another node's clock): a
shared verdict, an upload claim, what the bounded reader ranks among the newest."""
EXPLAIN_DIR = "explain"
"""Below a node's local directory: the factors of its recent misses (the vLLM plugin writes
them), for ``plancache explain``."""
MAX_SECONDS = 600.0
"""Largest time bound a setting or storage option may give (a larger one is a mistake that
would make every call fail or hang)."""


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``{VLLM_CACHE_ROOT or $XDG_CACHE_HOME/vllm or ~/.cache/vllm}/startup_plan``: where vLLM
    keeps its own plans."""
    env = os.environ if environ is None else environ
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"
    )
    return Path(os.path.expanduser(root)) / "startup_plan"
