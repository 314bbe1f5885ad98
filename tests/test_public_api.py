"""The public API stands alone: no signature of a public name mentions a private type (one
from a module whose path has a component starting with ``_``) unless a public module exports
that type too; ``PlanCache`` closes like ``CacheShare``; result types are frozen; the public
names of 0.4.0 that said the wrong thing resolve, with a ``DeprecationWarning``."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import plancache
from plancache import PlanCache, PlanStore
from plancache.testing import FACTORS, GiB

PUBLIC = (
    "plancache",
    "plancache.errors",
    "plancache.caches",
    "plancache.integrations.vllm",
    "plancache.integrations.triton",
    "plancache.integrations.torch",
    "plancache.testing",
)


def _exported(modules: tuple[str, ...]) -> dict[int, str]:
    """{id(object): its public name} for every name in the ``__all__`` of ``modules``."""
    out: dict[int, str] = {}
    for name in modules:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            out.setdefault(id(getattr(module, attr)), f"{name}.{attr}")
    return out


def _namespace(root: str) -> dict[str, object]:
    """Every class of ``root``'s modules (each imported) by name: what annotations imported
    only for type checking name."""
    package = importlib.import_module(root)
    for found in pkgutil.walk_packages(package.__path__, f"{root}."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)
    out: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == root or name.startswith(f"{root}.")):
            for value in vars(module).values():
                if isinstance(value, type) and value.__module__.startswith(root):
                    out.setdefault(value.__name__, value)
    return out


def _types(hint: object) -> Iterator[type]:
    """The classes a type hint names, its arguments' included."""
    if isinstance(hint, type):
        yield hint
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        yield origin
    for arg in typing.get_args(hint):
        yield from _types(arg)


def _callables(value: object, root: str) -> Iterator[tuple[str, object]]:
    """(suffix, callable or class) whose annotations are ``value``'s public signature."""
    if not isinstance(value, type):
        if callable(value):
            yield "", value
        return
    if issubclass(value, BaseException | enum.Enum):
        return
    yield "", value  # a dataclass's or protocol's fields
    for attr in ["__init__", *(a for a in dir(value) if not a.startswith("_"))]:
        member = inspect.getattr_static(value, attr)
        if isinstance(member, classmethod | staticmethod):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member) and member.__module__.startswith(root):
            yield f".{attr}", member


def private_types(modules: tuple[str, ...]) -> list[str]:
    """``name: type`` for each private type a public signature of ``modules`` names (a type
    of their root package from a module with a private component, exported by none of
    them); annotations that do not resolve are named too."""
    root = modules[0].partition(".")[0]
    exported = _exported(modules)
    namespace = _namespace(root)
    found: set[str] = set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        for attr in getattr(module, "__all__", ()):
            for suffix, target in _callables(getattr(module, attr), root):
                where = f"{module_name}.{attr}{suffix}"
                try:
                    hints = typing.get_type_hints(target, localns=namespace)
                except Exception as exc:
                    found.add(f"{where}: unresolved ({exc})")
                    continue
                for hint in hints.values():
                    for t in _types(hint):
                        parts = t.__module__.split(".")
                        private = any(p.startswith("_") for p in parts)
                        if parts[0] == root and private and id(t) not in exported:
                            found.add(f"{where}: {t.__module__}.{t.__qualname__}")
    return sorted(found)


def test_no_public_signature_names_a_private_type() -> None:
    assert private_types(PUBLIC) == []


def test_a_planted_private_type_in_a_public_signature_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "planted"
    package.mkdir()
    (package / "_hidden.py").write_text("class Secret:\n    pass\n")
    (package / "__init__.py").write_text(
        "from __future__ import annotations\n"
        "from planted._hidden import Secret\n"
        "__all__ = ['use']\n"
        "def use(x: Secret) -> None:\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert private_types(("planted",)) == ["planted.use: planted._hidden.Secret"]
    (package / "__init__.py").write_text(
        (package / "__init__.py").read_text().replace("['use']", "['Secret', 'use']")
    )
    monkeypatch.delitem(sys.modules, "planted")
    assert private_types(("planted",)) == []  # exported: public


def test_what_a_registered_factory_returns_is_public() -> None:
    from plancache._backends import open_layer

    assert plancache.open_layer is open_layer
    assert "open_layer" in plancache.__all__


class _Closing(PlanStore):
    """A plans kind that counts its closes."""

    closes = 0

    def close(self) -> None:
        type(self).closes += 1
        super().close()


def test_plan_cache_closes_the_store_it_opened(tmp_path: Path) -> None:
    """Before, ``PlanCache`` had no ``close`` and no ``with`` (``CacheShare`` had both)."""
    from plancache._backends.local import LocalStore

    given = _Closing(LocalStore(str(tmp_path / "given")))
    with PlanCache(given) as cache:
        assert cache.lookup(FACTORS, current_free_memory=GiB).reason == "miss"
    assert _Closing.closes == 0  # a store given is the caller's
    with PlanCache(lambda: _Closing(LocalStore(str(tmp_path / "opened")))) as cache:
        assert cache.lookup(FACTORS, current_free_memory=GiB).reason == "miss"
    assert _Closing.closes == 1
    cache.close()  # idempotent
    assert _Closing.closes == 1
    with PlanCache(lambda: _Closing(LocalStore(str(tmp_path / "never")))):
        pass  # never opened: nothing to close
    assert _Closing.closes == 1


def test_result_types_are_frozen() -> None:
    from plancache.caches import CacheFetched, CachePushed

    for cls in (CacheFetched, CachePushed, plancache.Decision, plancache.Recorded):
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[union-attr]


def test_the_test_kits_local_layer_has_a_name_that_says_so() -> None:
    import plancache.testing as kit
    from plancache._backends.local import LocalStore

    assert kit.LocalLayer is LocalStore and "LocalLayer" in kit.__all__
    assert "LocalStore" not in kit.__all__
    with pytest.warns(DeprecationWarning, match="LocalStore is deprecated: use .*LocalLayer"):
        assert kit.LocalStore is LocalStore
