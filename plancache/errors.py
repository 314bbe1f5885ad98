"""Every exception plancache raises on purpose, in one flat family (pure).

Every one derives from ``PlancacheError``, so ``except PlancacheError`` catches all of them.
The public ones are defined here; a few private refinements are defined beside the code that
raises them and derive from one of these: the fetch's ``TimedOut`` and ``TooSlow``, the trust
rule's ``Refused`` and ``Unvouched``, the bounded reader's ``Unreadable``, ``OddFileError``
of a neighbour's file, and internal signals translated before they leave their module (the
backends' ``ResponseTooLargeError`` and ``GCSStatusError``, the probe's ``_Decided``).
All store failures are ``PlanStoreError`` subclasses that keep their ``cause``; bad input is
a ``ValueError`` subclass (``InvalidPlanError``, ``ConfigError``, ``UnsupportedStoreError``,
``InvalidArgumentError``), so ``except ValueError`` written for 0.4.0 still catches it.
The 0.1.0 names without the ``Error`` suffix still resolve, with a ``DeprecationWarning``,
for one more release.
"""

from __future__ import annotations

import warnings

from plancache._version import DEPRECATED_REMOVED_IN


class PlancacheError(Exception):
    """The base of every exception plancache raises on purpose."""


class PlanStoreError(PlancacheError):
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


class StoreIgnoresPreconditionsError(PlanStoreReadOnlyError):
    """The store was found to ignore a write precondition (``plancache._probe``): nothing is
    written to it."""


class UnsupportedStoreError(PlanStoreError, ValueError):
    """A URL or its storage options name a store this installation cannot open."""


class UnknownSchemeError(UnsupportedStoreError):
    """The URL's scheme is served by no backend and no fsspec protocol."""


class MissingExtraError(UnsupportedStoreError):
    """The scheme's client library is not installed; the message names the pip extra."""


class InvalidPlanError(PlancacheError, ValueError):
    """A record breaks a rule of the plan format; it is never applied."""


class InvalidSignatureError(InvalidPlanError):
    """Keys are configured and a record lacks a valid signature from an accepted key
    (unsigned, signed by another key, or changed after signing): never applied, and a signed
    write replaces it."""


class UnsupportedSchemaError(InvalidPlanError):
    """A record of another schema version (e.g. from a newer plancache): never applied, never
    overwritten or deleted by this version, unless keys are configured and none of them signed
    it (``Keyring.check_foreign``); a miss for the cache."""


class ConfigError(PlancacheError, ValueError):
    """A setting (environment variable, option) holds a value plancache cannot use."""


class InvalidArgumentError(PlancacheError, ValueError):
    """A value given to a public call that it cannot use: a malformed fingerprint or object
    name, a timeout that is not positive, budget figures that are not ints, records of
    different keys to merge."""


class ArtifactError(PlancacheError):
    """A compile artifact (or another object of a kind loaded as code) that cannot be
    packed, read or installed; the message says why. Nothing was installed."""


class UnreadableHereError(ArtifactError):
    """An object this process cannot read, though another may: a codec not installed here,
    a newer format, a size over this process's cap. Never judged corrupt: kept."""


class JobTimeout(PlancacheError):
    """A background job did not finish within the wait (``plancache._background``)."""


class CliError(PlancacheError, ValueError):
    """A problem the ``plancache`` command found after parsing its arguments (a missing
    store, unreadable input)."""


class RankAgreementError(PlancacheError, RuntimeError):
    """The vLLM plugin's ranks could not vote on the KV-cache plan (a peer never came within
    the process group's timeout, or the group broke): the boot stops, since going on could
    leave ranks on different paths."""


class MovedError(PlancacheError, AttributeError):
    """A name of plancache 0.3.0 asked of an object that no longer answers it (the plans
    kind's ``get`` asked of a backend, which is an object layer since 0.4.0): the message
    names what to write instead."""


class MovedModuleError(PlancacheError, ModuleNotFoundError):
    """A module path of plancache 0.3.0 that no longer imports: the message names what to
    import instead."""


DEPRECATED_ALIASES = {
    "PlanStoreUnavailable": "PlanStoreUnavailableError",
    "PlanStoreNotFound": "PlanStoreNotFoundError",
    "PlanStoreConflict": "PlanStoreConflictError",
    "ReadOnlyStoreError": "PlanStoreReadOnlyError",
}
"""plancache 0.1.0's error names and the names that replaced them."""


def deprecated_alias(name: str) -> type[PlancacheError] | None:
    """The class an old error name stands for, with a ``DeprecationWarning``; None if
    ``name`` is no such alias."""
    new = DEPRECATED_ALIASES.get(name)
    if new is None:
        return None
    warnings.warn(
        f"plancache.{name} is deprecated: use plancache.{new} "
        f"(removed in plancache {DEPRECATED_REMOVED_IN})",
        DeprecationWarning,
        stacklevel=3,
    )
    cls: type[PlancacheError] = globals()[new]
    return cls


def __getattr__(name: str) -> type[PlancacheError]:
    cls = deprecated_alias(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
