"""One flat error family: what each error is, and the 0.1.0 names as deprecated aliases."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import plancache
from plancache import errors

OLD_NAMES = {
    "PlanStoreUnavailable": errors.PlanStoreUnavailableError,
    "PlanStoreNotFound": errors.PlanStoreNotFoundError,
    "PlanStoreConflict": errors.PlanStoreConflictError,
    "ReadOnlyStoreError": errors.PlanStoreReadOnlyError,
}


@pytest.mark.parametrize("module", [plancache, errors])
@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_names_are_the_same_classes_and_warn(module: object, old: str) -> None:
    new = OLD_NAMES[old].__name__
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use plancache.{new}"):
        assert getattr(module, old) is OLD_NAMES[old]


def test_old_names_are_not_advertised() -> None:
    assert not set(OLD_NAMES) & set(plancache.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        plancache.NoSuchName  # noqa: B018


def test_one_base_catches_every_error() -> None:
    names = [n for n in vars(errors) if isinstance(getattr(errors, n), type)]
    classes = [getattr(errors, n) for n in names if n != "PlancacheError"]
    assert classes
    assert all(issubclass(c, errors.PlancacheError) for c in classes)
    assert issubclass(errors.RankAgreementError, RuntimeError)


def test_public_signature_types_are_exported() -> None:
    from plancache._gate import Budget
    from plancache._observation import Observation

    assert (plancache.Budget, plancache.Observation) == (Budget, Observation)
    assert set(plancache.__all__) <= set(dir(plancache)) | {"__version__"}
    assert all(getattr(plancache, n) is not None for n in plancache.__all__)


HEAVY = (
    "plancache._store",
    "plancache._cache",
    "plancache._config",
    "plancache._backends",
    "plancache._artifacts",
    "plancache.integrations.vllm.apply",
    "plancache.integrations.vllm.compile",
    "orjson",
    "s3fs",
    "gcsfs",
    "fsspec",
)


@pytest.mark.parametrize(
    ("code", "env"),
    [
        ("import plancache", {}),
        ("import plancache.integrations.vllm as p; p.register()", {}),  # the plugin is off
        (
            "import plancache.integrations.vllm as p; p.register()",
            {"PLANCACHE_ENABLE": "0", "PLANCACHE_URL": "s3://b/p"},
        ),
    ],
)
def test_import_loads_no_store_code(code: str, env: dict[str, str]) -> None:
    """What every process pays: ``import plancache``, and vLLM's loading of the plugin where
    it is off, load no store, cache or JSON code (measured: 212 modules before, 30 after)."""
    probe = f"import sys\n{code}\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("PLANCACHE_", "VLLM_ENABLE"))
    }
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **env},
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_store_errors_keep_their_cause() -> None:
    cause = OSError(13, "Permission denied")
    exc = errors.PlanStorePermissionError("s3://b/p: denied", cause=cause)
    assert (exc.cause, exc.__cause__, str(exc)) == (cause, cause, "s3://b/p: denied")
    assert errors.PlanStoreError("x").cause is None


def test_the_family() -> None:
    store_errors = [
        errors.PlanStorePermissionError,
        errors.PlanStoreUnavailableError,
        errors.PlanStoreNotFoundError,
        errors.PlanStoreConflictError,
        errors.PlanStoreReadOnlyError,
        errors.UnsupportedStoreError,
    ]
    assert all(issubclass(e, errors.PlanStoreError) for e in store_errors)
    bad_input = [
        errors.UnsupportedStoreError,
        errors.UnknownSchemeError,
        errors.MissingExtraError,
        errors.InvalidPlanError,
        errors.UnsupportedSchemaError,
        errors.ConfigError,
    ]
    assert all(issubclass(e, ValueError) for e in bad_input)
    assert issubclass(errors.UnknownSchemeError, errors.UnsupportedStoreError)
    assert issubclass(errors.MissingExtraError, errors.UnsupportedStoreError)
    assert issubclass(errors.UnsupportedSchemaError, errors.InvalidPlanError)
    assert issubclass(errors.InvalidSignatureError, errors.InvalidPlanError)
    assert not issubclass(errors.InvalidPlanError, errors.PlanStoreError)


def test_every_error_is_exported_from_the_package() -> None:
    names = [n for n in vars(errors) if isinstance(getattr(errors, n), type)]
    assert set(names) <= set(plancache.__all__)
    missing = [n for n in names if getattr(plancache, n, None) is not getattr(errors, n)]
    assert not missing


def _calls(tmp_path: Path) -> dict[str, Callable[[], object]]:
    """Public calls given values they cannot use (each raised a plain ``ValueError`` in
    0.4.0)."""
    store = plancache.open_store(str(tmp_path / "plans"))
    return {
        "PlanStore.get": lambda: store.get("zz"),
        "PlanCache(timeout=0)": lambda: plancache.PlanCache(store, timeout=0),
        "Budget.limit": lambda: plancache.Budget(1.5, 0).limit(),  # type: ignore[arg-type]
        "open_store(s3:///)": lambda: plancache.open_store("s3:///prefix"),
        "ObjectLayer.read_object": lambda: store.layer.read_object("..", 10),
    }


@pytest.mark.parametrize(
    "call",
    [
        "PlanStore.get",
        "PlanCache(timeout=0)",
        "Budget.limit",
        "open_store(s3:///)",
        "ObjectLayer.read_object",
    ],
)
def test_a_public_call_given_a_bad_value_raises_a_plancache_error(
    tmp_path: Path, call: str
) -> None:
    """Both a ``PlancacheError`` (the documented family) and a ``ValueError`` (what 0.4.0
    programs catch)."""
    with pytest.raises(errors.PlancacheError) as raised:
        _calls(tmp_path)[call]()
    assert isinstance(raised.value, ValueError)
