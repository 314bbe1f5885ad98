"""The module paths of plancache 0.3.0, which still import with a ``DeprecationWarning``.

A finder on ``sys.meta_path`` answers an old path (``plancache.store``, or a module below an
old package, ``plancache.backends.local``) with the module now at the new one: the same
module object, so every name in it is the same object as before. ``plancache.fingerprint``
is not among them: that name is the public function (the old module of that name, which
the function shadowed, is ``plancache._keys``), and importing the old module raises
``MovedModuleError`` naming what to import instead (``GONE``), never a bare "No module named".
The moved paths are removed in ``DEPRECATED_REMOVED_IN`` (see the CHANGELOG's deprecation
policy).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

from plancache._version import DEPRECATED_REMOVED_IN
from plancache.errors import MovedModuleError

MOVED = {
    "plancache.artifact_commands": "plancache._command.artifacts",
    "plancache.artifacts": "plancache._artifacts",
    "plancache.artifacts.share": "plancache._artifacts.store",  # split: ArtifactStore's home
    "plancache.backends": "plancache._backends",
    "plancache.background": "plancache._background",
    "plancache.breaker": "plancache._breaker",
    "plancache.cache": "plancache._cache",
    "plancache.cli": "plancache._command.cli",
    "plancache.commands": "plancache._command.cli",  # its cmd_* names are imported there
    "plancache.config": "plancache._config",
    "plancache.defaults": "plancache._defaults",
    "plancache.display": "plancache._command.display",
    "plancache.doctor": "plancache._command.doctor",
    "plancache.gate": "plancache._gate",
    "plancache.integrations.vllm.enable": "plancache._switches",
    "plancache.inventory": "plancache._inventory.plans",
    "plancache.merge": "plancache._merge",
    "plancache.observation": "plancache._observation",
    "plancache.parse": "plancache._defaults",
    "plancache.plan": "plancache._plan",
    "plancache.probe": "plancache._probe",
    "plancache.reasons": "plancache._reasons",
    "plancache.redaction": "plancache._redaction",
    "plancache.signing": "plancache._signing",
    "plancache.store": "plancache._store",
    "plancache.units": "plancache._units",
}
"""Old module path -> where the module is now."""


GONE = {
    "plancache.fingerprint": (
        "plancache.fingerprint is a function since plancache 0.4.0, not a module: "
        "`from plancache import fingerprint` (fingerprint(factors)); a plan's object name is "
        "plancache.testing.plan_object_name(fp) (0.3.0's object_name)"
    ),
}
"""Module paths of 0.3.0 that import nothing now -> what to write instead."""


def new_path(name: str) -> str | None:
    """Where the module of the old path ``name`` is now (the longest old path that covers it
    decides); None if ``name`` did not move."""
    for old in sorted(MOVED, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return MOVED[old] + name[len(old) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new one, with a ``DeprecationWarning``."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is deprecated and will be removed in plancache "
            f"{DEPRECATED_REMOVED_IN}: its names are public in plancache itself, or internal "
            f"({self.new})",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is executed already; only its own spec is put back
        (the import system has just set the old path's on it), so that its ``__spec__``,
        ``importlib.reload`` and pickling by module name keep naming the new path."""
        module.__spec__ = self.spec


class _Gone(importlib.abc.Loader):
    """Loads nothing: raises ``MovedModuleError`` naming what to import instead."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        raise MovedModuleError(GONE[spec.name], name=spec.name)

    def exec_module(self, module: ModuleType) -> None:
        raise MovedModuleError(GONE[module.__name__], name=module.__name__)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name in GONE:
            return importlib.machinery.ModuleSpec(name, _Gone())
        new = new_path(name) if name.startswith("plancache.") else None
        return None if new is None else importlib.machinery.ModuleSpec(name, _Alias(new))


def install_moved_finder() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # before the path finder: one module object
