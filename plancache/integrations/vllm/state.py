"""The plugin's state in this process: one ``Plugin`` object (``current()``) holds what
``apply``, ``compile`` and ``caches`` keep between calls, each part made on first use under
its lock. A test builds its own and installs it with ``use`` instead of patching modules."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the plugin off imports none of them
    from plancache._artifacts.engine import CompileSettings
    from plancache._artifacts.store import ArtifactStore
    from plancache._background import Job
    from plancache._breaker import Breaker
    from plancache._cache import PlanCache
    from plancache._config import Settings
    from plancache.caches import GeneratedCache


@dataclass(eq=False)
class Plugin:
    """What the plugin keeps in one process (a field left None is made on first use)."""

    cache: PlanCache | None = None
    """The plans' cache (``apply.get_cache``)."""
    breaker: Breaker | None = None
    """The crash-loop breaker (``apply.get_breaker``)."""
    settings: Settings | None = None
    """The ``PLANCACHE_*`` settings, read once (``apply``)."""
    config_error: str | None = None
    """Why those settings cannot be used: the plugin is off in this process."""
    plans_lock: threading.Lock = field(default_factory=threading.Lock)
    compile_settings: CompileSettings | None = None
    """The ``PLANCACHE_COMPILE_*`` settings, read once (``compile.settings``)."""
    artifacts: ArtifactStore | None = None
    """The artifact store, once opened (``compile.store``)."""
    opening: Job[None] | None = None
    """Its opening, started once (``compile.opened``)."""
    used: dict[Path, set[str]] = field(default_factory=dict)
    """The ``<key>`` directories vLLM loaded or compiled in this process, with their ranks."""
    additions_known: dict[Path, set[str]] = field(default_factory=dict)
    """The ``inductor_cache/`` paths the stored bundles of each ``<key>`` directory list."""
    compile_lock: threading.Lock = field(default_factory=threading.Lock)
    fetching: Job[None] | None = None
    """The fetch of the generated caches, started once (``caches.start_fetch``)."""
    known: dict[GeneratedCache, set[str]] = field(default_factory=dict)
    """The paths the bundles read at the fetch list, per cache."""
    bundles: dict[GeneratedCache, int] = field(default_factory=dict)
    """How many bundles the fetch read, per cache."""
    before: dict[GeneratedCache, frozenset[str]] = field(default_factory=dict)
    """Triton's group files already there when the fetch started: not compiled by this boot."""
    ready: bool = False
    """Whether the caches' upload was started (once per process: ``caches.ready``)."""
    caches_lock: threading.Lock = field(default_factory=threading.Lock)


_current = Plugin()


def current() -> Plugin:
    """This process's plugin state."""
    return _current


def use(plugin: Plugin) -> Plugin:
    """Make ``plugin`` this process's state (a test's own, or the one it replaced, given
    back); the one it replaces."""
    global _current
    previous, _current = _current, plugin
    return previous
