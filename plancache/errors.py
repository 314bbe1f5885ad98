"""Every exception plancache raises on purpose, in one flat family (pure).

All store failures are ``PlanStoreError`` subclasses that keep their ``cause``; bad input is
a ``ValueError`` subclass (``InvalidPlanError``, ``ConfigError``, ``UnsupportedStoreError``).
The names without the ``Error`` suffix are aliases kept for one release.
"""

from __future__ import annotations


class PlanStoreError(Exception):
    """A store could not be used (transport, permission, configuration). Keeps ``cause``."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class PlanStorePermissionError(PlanStoreError):
    """Access was denied (file mode, bad or missing credentials, forbidden bucket)."""


class PlanStoreUnavailableError(PlanStoreError):
    """The store did not answer in time, refused the connection or answered a server error."""


class PlanStoreNotFoundError(PlanStoreError):
    """The store's container (directory's parent, bucket) does not exist."""


class PlanStoreConflictError(PlanStoreError):
    """Concurrent writers kept winning; the bounded merge loop gave up."""


class PlanStoreReadOnlyError(PlanStoreError):
    """A write was asked of a store opened read-only."""


class UnsupportedStoreError(PlanStoreError, ValueError):
    """A URL or its storage options name a store this installation cannot open."""


class UnknownSchemeError(UnsupportedStoreError):
    """The URL's scheme is served by no backend and no fsspec protocol."""


class MissingExtraError(UnsupportedStoreError):
    """The scheme's client library is not installed; the message names the pip extra."""


class InvalidPlanError(ValueError):
    """A record breaks a rule of the plan format; it is never applied."""


class InvalidSignatureError(InvalidPlanError):
    """Keys are configured and a record lacks a valid signature from an accepted key
    (unsigned, signed by another key, or changed after signing): never applied, and a signed
    write replaces it."""


class UnsupportedSchemaError(InvalidPlanError):
    """A record of another schema version (e.g. from a newer plancache): never applied, never
    overwritten or deleted by this version, unless keys are configured and none of them signed
    it (``Keyring.check_foreign``); a miss for the cache."""


class ConfigError(ValueError):
    """A setting (environment variable, option) holds a value plancache cannot use."""


class RankAgreementError(RuntimeError):
    """The vLLM plugin's ranks could not vote on the KV-cache plan (a peer never came within
    the process group's timeout, or the group broke): the boot stops, since going on could
    leave ranks on different paths."""


# Aliases of plancache 0.1.0's names, kept for one release.
PlanStoreUnavailable = PlanStoreUnavailableError
PlanStoreNotFound = PlanStoreNotFoundError
PlanStoreConflict = PlanStoreConflictError
ReadOnlyStoreError = PlanStoreReadOnlyError
