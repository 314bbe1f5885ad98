"""One flat error family: what each error is, and the 0.1.0 names as aliases."""

from __future__ import annotations

import plancache
from plancache import errors


def test_old_names_are_the_same_classes() -> None:
    assert plancache.PlanStoreUnavailable is errors.PlanStoreUnavailableError
    assert plancache.PlanStoreNotFound is errors.PlanStoreNotFoundError
    assert plancache.PlanStoreConflict is errors.PlanStoreConflictError
    assert plancache.ReadOnlyStoreError is errors.PlanStoreReadOnlyError


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
    missing = [n for n in names if getattr(plancache, n, None) is not getattr(errors, n)]
    assert not missing
