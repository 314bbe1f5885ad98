"""Which kinds plancache shares in this process (the vLLM plugin on or off, compile
artifacts on or off, Triton's cache on or off), read from the environment as
``plancache._defaults`` declares each switch (pure)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from plancache._defaults import COMPILE_CACHE, ENABLE, TRITON_CACHE, URL, parse_bool
from plancache.errors import ConfigError

log = logging.getLogger("plancache.vllm")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True if the plugin should act: ``PLANCACHE_ENABLE`` decides when set; otherwise
    ``PLANCACHE_URL`` set or ``VLLM_ENABLE_STARTUP_PLAN=1``. A malformed value: warning, off."""
    env = os.environ if environ is None else environ
    try:
        explicit = ENABLE.read(env)
        if explicit is not None:
            return explicit
        builtin = parse_bool("VLLM_ENABLE_STARTUP_PLAN", env.get("VLLM_ENABLE_STARTUP_PLAN", "0"))
        return URL.read(env) is not None or builtin
    except ConfigError as exc:
        log.warning("plancache: vLLM plugin disabled: %s", exc)
        return False


def compile_on(environ: Mapping[str, str] | None = None) -> bool:
    """True if compile artifacts are shared (``plancache._artifacts.engine``):
    ``PLANCACHE_COMPILE_CACHE`` decides when set, else ``enabled``. Raises ``ConfigError``
    for a malformed ``PLANCACHE_COMPILE_CACHE``."""
    env = os.environ if environ is None else environ
    explicit = COMPILE_CACHE.read(env)
    return enabled(env) if explicit is None else explicit


def triton_on(environ: Mapping[str, str] | None = None) -> bool:
    """True if Triton's cache is shared (``plancache.integrations.triton``):
    ``PLANCACHE_TRITON_CACHE`` decides when set; else on where ``PLANCACHE_URL`` is set and
    ``PLANCACHE_COMPILE_CACHE`` is not ``0`` (the vLLM plugin's own switch,
    ``PLANCACHE_ENABLE``, is not this cache manager's). A malformed value: warning, off."""
    env = os.environ if environ is None else environ
    try:
        explicit = TRITON_CACHE.read(env)
        if explicit is not None:
            return explicit
        return COMPILE_CACHE.read(env) is not False and URL.read(env) is not None
    except ConfigError as exc:
        log.warning("plancache: Triton's cache not shared: %s", exc)
        return False


def compile_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """``compile_on``; a malformed setting: warning, off."""
    try:
        return compile_on(environ)
    except ConfigError as exc:
        log.warning("plancache: compile artifacts not shared: %s", exc)
        return False


def _vllm_compile_off(env: Mapping[str, str]) -> list[str]:
    """Every vLLM setting that leaves no compile artifact to share (read as vLLM 0.33's
    ``vllm.envs`` does: ``VLLM_USE_AOT_COMPILE`` unset is on with torch 2.10 or newer unless
    the compile cache is disabled): all of them, so that unsetting one is seen not to be
    enough."""
    out = []
    disabled = env.get("VLLM_DISABLE_COMPILE_CACHE", "0").strip()
    if disabled not in ("", "0"):
        out.append(f"VLLM_DISABLE_COMPILE_CACHE={disabled} (vLLM keeps no compile cache)")
    aot = env.get("VLLM_USE_AOT_COMPILE")
    if aot is not None and aot != "1":
        out.append(f"VLLM_USE_AOT_COMPILE={aot} (vLLM saves no AOT artifact)")
    return out


def kinds(environ: Mapping[str, str] | None = None) -> list[tuple[str, bool, str]]:
    """Each kind the vLLM plugin shares, whether it is on in this environment, and why:
    every setting, plancache's or vLLM's, that turns it off is named (``plancache doctor``
    shows them)."""
    env = os.environ if environ is None else environ
    plugins = env.get("VLLM_PLUGINS")
    filtered = plugins is not None and "plancache" not in [p.strip() for p in plugins.split(",")]
    if filtered:
        off = f"VLLM_PLUGINS={plugins} filters the plugin out"
        return [(k, False, off) for k in ("plans", "compile artifacts")]
    explicit = env.get(ENABLE.name, "").strip()
    plans = enabled(env)
    if plans:
        why = "PLANCACHE_ENABLE=1" if explicit else "PLANCACHE_URL or VLLM_ENABLE_STARTUP_PLAN=1"
    elif explicit:
        why = f"off: PLANCACHE_ENABLE={explicit}"
    else:
        why = "off: neither PLANCACHE_URL nor VLLM_ENABLE_STARTUP_PLAN=1 is set"
    out = [("plans", plans, f"on ({why})" if plans else why)]
    try:
        compiled, detail = compile_on(env), ""
    except ConfigError as exc:
        compiled, detail = False, f"off: {exc}"
    if not detail:
        switch = env.get(COMPILE_CACHE.name, "").strip()
        offs = (
            []
            if compiled
            else [f"PLANCACHE_COMPILE_CACHE={switch}" if switch else f"as plans ({why})"]
        )
        offs += _vllm_compile_off(env)
        if offs:
            compiled, detail = False, "off: " + "; ".join(offs)
        else:
            detail = "on, with model info and the Inductor, Triton and FlashInfer autotune caches"
    out.append(("compile artifacts", compiled, detail))
    return out
