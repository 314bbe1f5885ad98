"""One family of errors: every exception class of plancache is a ``PlancacheError``, the named
ones live in ``plancache.errors`` and are the same classes where they are raised."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from collections.abc import Iterator

import plancache
import plancache.errors

# -- one family of errors ------------------------------------------------------------------
EXPECTED_IN_ERRORS = (
    "ArtifactError",
    "JobTimeout",
    "CliError",
    "StoreIgnoresPreconditionsError",
)


def test_every_named_error_is_a_plancache_error_in_plancache_errors() -> None:
    base = plancache.errors.PlancacheError
    problems = []
    for name in EXPECTED_IN_ERRORS:
        cls = getattr(plancache.errors, name, None)
        if cls is None:
            problems.append(f"plancache.errors.{name} does not exist")
        elif not (isinstance(cls, type) and issubclass(cls, base)):
            problems.append(f"plancache.errors.{name} is not a PlancacheError")
    assert problems == []


def test_same_classes_where_they_are_raised() -> None:
    where = {
        "ArtifactError": "plancache._artifacts.archive",
        "JobTimeout": "plancache._background",
        "CliError": "plancache._command.stores",
        "StoreIgnoresPreconditionsError": "plancache._backends.guarded",
    }
    problems = []
    for name, module_name in where.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # moved by a refactor: the walk below covers wherever it went
        cls = getattr(module, name, None)
        if cls is not None and cls is not getattr(plancache.errors, name, None):
            problems.append(f"{module_name}.{name} is not plancache.errors.{name}")
    assert problems == []


def _plancache_modules() -> Iterator[types.ModuleType]:
    """Every module of the plancache package; those of the vLLM integration and the test kit
    that cannot be imported here (no vLLM, no torch) are left out."""
    optional = ("plancache.integrations.vllm", "plancache.testing")

    def onerror(name: str) -> None:
        if not name.startswith(optional):
            raise

    for info in pkgutil.walk_packages(plancache.__path__, "plancache.", onerror=onerror):
        if info.name.rpartition(".")[2] == "__main__":
            continue  # runs the command
        try:
            yield importlib.import_module(info.name)
        except ImportError:
            if not info.name.startswith(optional):
                raise


def test_every_exception_class_of_plancache_is_a_plancache_error() -> None:
    base = plancache.errors.PlancacheError
    outside = sorted(
        f"{module.__name__}.{name}"
        for module in _plancache_modules()
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, Exception)
        and cls.__module__ == module.__name__
        and not issubclass(cls, base)
    )
    assert outside == []


def test_the_errors_docstring_names_every_exception_defined_elsewhere() -> None:
    """``plancache.errors`` says the public exceptions are defined there and names the private
    refinements defined beside the code that raises them: every one of them."""
    elsewhere = sorted(
        name
        for module in _plancache_modules()
        if module is not plancache.errors
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, plancache.errors.PlancacheError)
        and cls.__module__ == module.__name__
    )
    assert len(elsewhere) >= 5
    doc = plancache.errors.__doc__ or ""
    assert [name for name in elsewhere if f"``{name}``" not in doc] == []
