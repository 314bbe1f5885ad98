"""Which kinds plancache shares in this process (the vLLM plugin on or off, compile
artifacts on or off), read from the environment (pure)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from plancache._parse import parse_bool
from plancache.errors import ConfigError

log = logging.getLogger("plancache.vllm")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True if the plugin should act: ``PLANCACHE_ENABLE`` decides when set; otherwise
    ``PLANCACHE_URL`` set or ``VLLM_ENABLE_STARTUP_PLAN=1``. A malformed value: warning, off."""
    env = os.environ if environ is None else environ
    try:
        explicit = env.get("PLANCACHE_ENABLE", "").strip()
        if explicit:
            return parse_bool("PLANCACHE_ENABLE", explicit)
        builtin = parse_bool("VLLM_ENABLE_STARTUP_PLAN", env.get("VLLM_ENABLE_STARTUP_PLAN", "0"))
        return bool(env.get("PLANCACHE_URL")) or builtin
    except ConfigError as exc:
        log.warning("plancache: vLLM plugin disabled: %s", exc)
        return False


def compile_on(environ: Mapping[str, str] | None = None) -> bool:
    """True if compile artifacts are shared (``plancache._artifacts.share``):
    ``PLANCACHE_COMPILE_CACHE`` decides when set, else ``enabled``. Raises ``ConfigError``
    for a malformed ``PLANCACHE_COMPILE_CACHE``."""
    env = os.environ if environ is None else environ
    explicit = env.get("PLANCACHE_COMPILE_CACHE", "").strip()
    return parse_bool("PLANCACHE_COMPILE_CACHE", explicit) if explicit else enabled(env)


def compile_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """``compile_on``; a malformed setting: warning, off."""
    try:
        return compile_on(environ)
    except ConfigError as exc:
        log.warning("plancache: compile artifacts not shared: %s", exc)
        return False
