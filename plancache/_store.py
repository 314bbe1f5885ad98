"""The plans kind: ``PlanStore``, built on an object layer (composition), and its one
compare-and-swap loop (no I/O libraries).

A plan is the object ``startup_plan_{fp}.json`` of a layer (``plancache._objects.ObjectLayer``:
read with a version token, write create-if-absent or replace-if-version-matches, delete
unconditionally or if-version-matches, list): every backend and wrapper is a layer and nothing
else, and the plans kind is one more kind on it, like compile artifacts or cache bundles.
Everything plans need beyond the layer, including the merge of concurrent writers, the
backoff of those that lose a race and the signing of what is written (``PlanStore.keyring``,
see ``plancache._signing``), lives here once. A plans kind over two layers (a local tier in
front of a remote store) is ``plancache._backends.tiered.TieredStore``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from plancache import _reader as reader
from plancache._defaults import PUT_BUDGET_S
from plancache._defaults import STALE_TEMP_SECONDS as STALE_TEMP_SECONDS
from plancache._keys import OBJECT_PREFIX, fingerprint_of_name, plan_object_name, validate_key
from plancache._merge import covers, merge, retract
from plancache._objects import CREATE, ObjectLayer, Update
from plancache._observation import Observation
from plancache._plan import MAX_RECORD_BYTES, SCHEMA, Plan
from plancache._reasons import PutOutcome as PutOutcome  # what put returns, also named here
from plancache._reasons import Reason
from plancache._redaction import scrub
from plancache._signing import NO_KEYS, Keyring
from plancache._version import DEPRECATED_REMOVED_IN
from plancache.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidPlanError,
    InvalidSignatureError,
    JobTimeout,
    PlanStoreConflictError,
    PlanStoreError,
    PlanStorePermissionError,
    UnsupportedSchemaError,
)

log = logging.getLogger("plancache")
R = TypeVar("R")
Found = tuple[bytes, object] | None
"""What ``PlanStore._read`` returns: the record's bytes and version token, or None."""

CONTENT_TYPE = "application/json"
READ_LIMIT = MAX_RECORD_BYTES + 1
"""Readers fetch at most this many bytes; a longer record is invalid without reading it all."""
MAX_SEEN = 4096
"""Fingerprints a store object remembers having seen stored (``PlanStore._seen``)."""
_LAYER_METHODS = frozenset(
    {"read_object", "open_object", "write_object", "delete_object", "list_objects"}
)
"""The object layer's primitives, which 0.3.0's ``PlanStore`` offered itself."""


def content_version(data: bytes) -> str:
    """A version token for stores without native versions: the sha256 of the bytes (unlike
    inode or mtime, never reused for other content)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Retraction:
    """What ``PlanStore.retract`` did."""

    record: Plan | None
    """The record stored afterwards (None: the store holds none under the key)."""
    removed: bool
    """True if the record held the observation when it was read and no longer does (the
    retraction took effect); False if it changed nothing a lookup sees (no record, or one
    without that observation, which still gets its tombstone)."""


Put = tuple[PutOutcome, Plan | None]
"""What ``PlanStore.put_merged`` returns."""


@dataclass(frozen=True)
class _Step(Generic[R]):
    """What one round of the compare-and-swap loop does with the record it read: write
    ``data`` (create it where no record was read, else replace the version read), or
    ``delete`` the version read, or nothing; then return ``result``."""

    result: R
    data: bytes | None = None
    delete: bool = False


def _adds_nothing(stored: Plan, new: Plan, merged: Plan) -> bool:
    """True if merging ``new`` into ``stored`` gives no node anything: every observation of
    ``new`` is covered by the stored frontier, every provisional one by either stored
    frontier, and no tombstone changes (labels, and which of two equal points is kept, are
    not worth a write)."""
    held = (*stored.observations, *stored.provisional)
    return (
        merged.retracted == stored.retracted
        and all(covers(stored.observations, o) for o in new.observations)
        and all(covers(held, o) for o in new.provisional)
    )


class PlanStore:
    """The plans kind on ``layer``. Guarantees, for every layer that passes the conformance
    suite:

    - ``get`` returns a valid plan, None for a missing one, or raises ``InvalidPlanError``
      for a record that breaks a rule (``InvalidSignatureError`` for one the keyring does
      not accept); never a torn record.
    - ``put`` is atomic and merges: the stored record becomes the merge of it and the new one
      (signed, or kept, as the keyring's rules say).
    - transport and permission failures raise ``PlanStoreError`` subclasses.
    - every key is validated before any I/O, and a write asks the layer first
      (``check_writable``): a layer that refuses writes (read-only, a store found to ignore
      preconditions) fails it before anything is read.

    ``put`` is ``put_merged`` without the record, and ``retract`` is a ``rewrite``: a
    subclass that changes how records are written overrides those two, and both follow.
    The layer's primitives (``read_object``, ...) are reached through ``layer``; asked of
    the store they still answer, with a ``DeprecationWarning``, until
    ``DEPRECATED_REMOVED_IN``.
    """

    #: Bound on the compare-and-swap loop's rounds when racing writers keep winning.
    max_put_attempts: int = 16
    #: Seconds after which the compare-and-swap loop starts no new round (``PUT_BUDGET_S``).
    put_budget_s: float = PUT_BUDGET_S
    #: Signs what the store writes and judges what it reads (``plancache._signing``).
    keyring: Keyring = NO_KEYS

    def __init__(self, layer: ObjectLayer, keyring: Keyring | None = None) -> None:
        if not isinstance(layer, ObjectLayer):
            raise TypeError(f"not an ObjectLayer: {type(layer).__qualname__}")
        self.layer = layer
        if keyring is not None:
            self.keyring = keyring

    @property
    def url(self) -> str:
        """The layer's location, without secrets."""
        return self.layer.url

    @property
    def atomic(self) -> bool:
        """False where the layer cannot make create/replace atomic."""
        return self.layer.atomic

    @property
    def local_tier(self) -> ObjectLayer | None:
        """The layer of the local tier in front of this store (a ``TieredStore``'s), or
        None: where kinds that read both tiers find it."""
        return None

    def use_keyring(self, keyring: Keyring) -> None:
        """Sign and judge records with ``keyring`` from now on (``Settings.open_store`` does
        this with the configured keys)."""
        self.keyring = keyring

    def own(self) -> PlanStore:
        """The plans of ``layer.own()`` with this store's keyring: reading only what no other
        local user could have written (``ObjectLayer.own``)."""
        return PlanStore(self.layer.own(), self.keyring)

    def warm(self) -> None:
        """Start opening what the layer opens on first use (``ObjectLayer.warm``); returns
        at once."""
        self.layer.warm()

    def close(self) -> None:
        """Close the layer. Idempotent."""
        self.layer.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layer!r})"

    if not TYPE_CHECKING:  # typed code reaches the layer through ``layer``

        def __getattr__(self, name: str) -> Any:
            if name in _LAYER_METHODS:
                warnings.warn(
                    f"PlanStore.{name} is deprecated: use PlanStore.layer.{name} (removed in "
                    f"{DEPRECATED_REMOVED_IN})",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(self.layer, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- the plans kind on the object layer: its records as objects --------------------
    def _read(self, fp: str) -> tuple[bytes, object] | None:
        """At most ``READ_LIMIT`` bytes of the record and a version token; None if absent.
        Through the one bounded reader (``plancache._reader.read``): a record the store does
        not hand over is ``reader.Unreadable``, named once."""
        return reader.read(self.layer, plan_object_name(fp), READ_LIMIT)

    def _create(self, fp: str, data: bytes) -> bool:
        """Write ``data`` only if no record exists; False if one does. Atomic."""
        return self.layer.write_object(plan_object_name(fp), (data,), CREATE)

    def _replace(self, fp: str, data: bytes, version: object) -> bool:
        """Overwrite only if the stored version is still ``version``; False otherwise."""
        return self.layer.write_object(plan_object_name(fp), (data,), Update(version))

    def _delete_if(self, fp: str, version: object) -> bool:
        """Remove the record only if its version is still ``version`` (a token ``_read``
        returned); False if it changed or is gone. Atomic where the service honours the
        precondition (see each backend)."""
        return self.layer.delete_object(plan_object_name(fp), version)

    def _delete(self, fp: str) -> bool:
        """Remove the record, whatever its version; False if it was absent."""
        return self.layer.delete_object(plan_object_name(fp))

    def _list(self) -> Iterator[str]:
        """Fingerprints of stored records (names that are not plans are skipped)."""
        names = self.layer.list_objects(OBJECT_PREFIX)
        return (fp for fp in map(fingerprint_of_name, names) if fp is not None)

    # -- the public contract ------------------------------------------------------------
    def get(self, fp: str) -> Plan | None:
        """The valid plan stored under ``fp``, or None. Invalid records raise
        ``InvalidPlanError`` (``InvalidSignatureError`` where the keyring holds keys and none
        of them signed the record); store failures raise ``PlanStoreError``."""
        found = self._fetch(validate_key(fp))
        if found is None:
            return None
        return self.keyring.check(Plan.decode(found[0], expected_fingerprint=fp))

    def find(self, fp: str, usable: Callable[[Plan], bool]) -> Plan | None:
        """Like ``get``; stores with several tiers keep looking while the plan they found
        is not ``usable`` (e.g. the gate rejects it), and return the best they found."""
        return self.get(fp)

    def put(self, plan: Plan) -> PutOutcome:
        """Merge ``plan`` into the record under its key; see ``put_merged``."""
        return self.put_merged(plan)[0]

    def put_merged(self, plan: Plan) -> Put:
        """(outcome, the record now stored; None where that is another schema's).

        Merges ``plan`` into the record under its key (``plancache._merge``): create it,
        else replace the stored record by the merge when that gives a node something (also
        to upgrade a schema-1 record, or to replace an invalid one), else keep it and write
        nothing (an observation the stored frontier covers is never written). A record of
        an unknown schema is kept, never overwritten. The first request reads the record
        where this store object saw it stored before, else creates it (a create refused
        means it exists: from then on the loop only reads and swaps). Lost races back off
        and merge again (``_swap``), then ``PlanStoreConflictError``. No observation of a
        CREATED or REPLACED put is lost unless the merge's bound or dominance drops it.

        Signatures (``self.keyring``, rules in ``plancache._signing``): with a signing key,
        what is written is signed, and a stored record without a valid signature counts as
        invalid (replaced by ``plan`` alone); without one, a signed record is never replaced
        by an unsigned merge (KEPT). A record of an unknown schema that no accepted key
        signed is replaced by a write that one does (``Keyring.displaces``)."""
        keys = self.keyring
        fp = validate_key(plan.fingerprint)
        self.layer.check_writable()
        new = keys.seal(plan)
        created: _Step[Put] = _Step((PutOutcome.CREATED, new), new.encode())

        def step(found: Found) -> _Step[Put]:
            if found is None:  # absent, or deleted since
                return created
            try:
                stored = keys.base(Plan.decode(found[0], expected_fingerprint=fp))
            except UnsupportedSchemaError as exc:
                if not keys.displaces(found[0], new):
                    return _Step((PutOutcome.KEPT, None))  # another version's: not ours
                log.warning(
                    "plancache: replacing record %s… that no accepted key signed: %s", fp[:12], exc
                )
                merged = new
            except InvalidPlanError as exc:
                log.warning("plancache: replacing invalid record %s…: %s", fp[:12], exc)
                merged = new
            else:
                changed = merge(stored, new)
                if (stored.schema == SCHEMA and keys.settled(stored)) and (
                    changed == stored or _adds_nothing(stored, new, changed)
                ):
                    return _Step((PutOutcome.KEPT, stored))
                merged = keys.seal(new if changed == new else changed)  # a copy keeps its signature
                if not keys.may_replace(stored, merged):
                    log.warning(
                        "plancache: record %s… is signed and this writer holds no signing key "
                        "(PLANCACHE_SIGNING_KEY): kept as it is",
                        fp[:12],
                    )
                    return _Step((PutOutcome.KEPT, stored))
            return _Step((PutOutcome.REPLACED, merged), merged.encode())

        return self._swap(fp, step, first=None if fp in self._seen else created)

    def rewrite(self, fp: str, change: Callable[[Plan], Plan | None]) -> Plan | None:
        """Replace the valid record under ``fp`` by ``change(record)`` through the same
        compare-and-swap as ``put`` (None from ``change`` deletes the record); returns what
        is stored afterwards. A missing record stays missing and ``change`` is not called;
        an invalid one raises ``InvalidPlanError``. The delete is conditional too: a record
        written between the read and the delete is kept, and ``change`` is called on it in
        turn (where the service honours delete preconditions: see each backend). Lost races
        back off, re-read and call ``change`` again (``_swap``).

        Signatures as in ``put_merged``: with a signing key, the result is signed (an
        unchanged record signed by another accepted key is re-signed) and a record without a
        valid signature raises ``InvalidSignatureError``; without one, changing a signed
        record raises ``PlanStorePermissionError``."""
        validate_key(fp)
        self.layer.check_writable()
        keys = self.keyring

        def step(found: Found) -> _Step[Plan | None]:
            if found is None:
                return _Step(None)
            stored = keys.base(Plan.decode(found[0], expected_fingerprint=fp))
            changed = change(stored)
            if changed is None:
                return _Step(None, delete=True)
            if changed.fingerprint != fp:
                raise InvalidArgumentError("a rewrite cannot change the record's fingerprint")
            if changed == stored and stored.schema == SCHEMA and keys.settled(stored):
                return _Step(stored)
            sealed = keys.seal(changed)
            if not keys.may_replace(stored, sealed):
                raise PlanStorePermissionError(
                    f"{self.url}: record {fp[:12]}… is signed; changing it needs the signing "
                    "key (PLANCACHE_SIGNING_KEY)"
                )
            return _Step(sealed, sealed.encode())

        return self._swap(fp, step)

    def retract(self, fp: str, observation: Observation, at: float | None = None) -> Retraction:
        """Remove ``observation`` from the record under ``fp`` and keep its tombstone (always:
        ``plancache._merge.retract``), through ``rewrite``'s compare-and-swap; returns the
        record now stored and whether the observation was removed (a missing record is not
        created: nothing to retract). Every other observation stays. When no observation is
        left the record is kept with its tombstones only (it applies nowhere), so that an
        older copy merged later cannot bring the observation back; ``plancache prune``
        forgets it once the observation itself would be pruned."""
        when = time.time() if at is None else at
        held: list[bool] = []

        def change(plan: Plan) -> Plan:
            points = (*plan.observations, *plan.provisional)
            held.append(any(o.digest == observation.digest for o in points))
            return retract(plan, observation, when)

        record = self.rewrite(fp, change)
        return Retraction(record, any(held))

    def delete_if(self, fp: str, doomed: Callable[[bytes], bool]) -> bool:
        """Delete the record under ``fp`` if ``doomed(its stored bytes)``, and only the version
        judged: a record written between the read and the delete is kept and judged in turn
        (``put``'s compare-and-swap; where the service honours delete preconditions: see each
        backend). True if no record is left (deleted, or gone); False if the record stored
        now is not doomed, and kept."""
        validate_key(fp)
        self.layer.check_writable()

        def step(found: Found) -> _Step[bool]:
            if found is None:
                return _Step(True)
            return _Step(True, delete=True) if doomed(found[0]) else _Step(False)

        return self._swap(fp, step)

    def delete(self, fp: str) -> bool:
        """Remove the plan under ``fp``, whatever it holds now; True if one was there."""
        validate_key(fp)
        self.layer.check_writable()
        removed = self._delete(fp)
        self._note(fp, stored=False)
        return removed

    def iter_fingerprints(self) -> Iterator[str]:
        """Every stored fingerprint, in no particular order."""
        return self._list()

    def read_raw(self, fp: str) -> bytes | None:
        """The stored bytes under ``fp`` (at most ``READ_LIMIT``), unvalidated; for tools."""
        found = self._fetch(validate_key(fp))
        return None if found is None else found[0]

    # -- the compare-and-swap loop ------------------------------------------------------
    def _swap(self, fp: str, step: Callable[[Found], _Step[R]], first: _Step[R] | None = None) -> R:
        """The one compare-and-swap loop: read the record, let ``step`` decide, and write or
        delete only the version read (create only where none was read); ``first``: a create
        tried before any read. After the k-th lost race, a pause drawn uniformly from [0,
        2**(k+1) times that round's duration) (full jitter: racing writers spread out over
        more rounds' worth of time after each loss, and slower stores pause longer); at most
        ``max_put_attempts`` rounds, none started past ``put_budget_s`` seconds, then
        ``PlanStoreConflictError``."""
        start = time.monotonic()
        if first is not None and self._commit(fp, first, None):
            return first.result
        took = 0.0
        lost = 0
        while lost < self.max_put_attempts:
            if lost:
                left = start + self.put_budget_s - time.monotonic()
                if left <= 0:
                    break
                time.sleep(random.uniform(0.0, min(left, took * 2 ** (lost + 1))))
            began = time.monotonic()
            found = self._fetch(fp)
            decided = step(found)
            if self._commit(fp, decided, found):
                return decided.result
            lost += 1
            took = time.monotonic() - began
        raise PlanStoreConflictError(
            f"{self.url}: gave up on {fp[:12]}… after {lost} lost races in "
            f"{time.monotonic() - start:.1f} s"
        )

    def _commit(self, fp: str, step: _Step[R], found: Found) -> bool:
        """Do what ``step`` says, conditional on ``found`` (None: on there being no record);
        False if a racing writer changed the record first."""
        if step.data is None and not step.delete:
            return True
        if found is None:
            if step.data is None:  # nothing to delete
                return True
            created = self._create(fp, step.data)
            self._note(fp, stored=True)  # ours, or a racing writer's
            return created
        if step.delete:
            deleted = self._delete_if(fp, found[1])
            self._note(fp, stored=not deleted)
            return deleted
        assert step.data is not None
        return self._replace(fp, step.data, found[1])

    @functools.cached_property
    def _seen(self) -> set[str]:
        """Fingerprints this store object last saw stored: where ``put`` reads first (a
        create would be refused). A hint only; forgotten past ``MAX_SEEN`` entries."""
        return set()

    def _note(self, fp: str, *, stored: bool) -> None:
        if not stored:
            self._seen.discard(fp)
            return
        if len(self._seen) >= MAX_SEEN:
            self._seen.clear()
        self._seen.add(fp)

    def _fetch(self, fp: str) -> Found:
        """``_read``, noting whether the record exists."""
        found = self._read(fp)
        self._note(fp, stored=found is not None)
        return found


def plans_of(store: object, what: str) -> PlanStore:
    """``store`` as the plans kind: itself, or the plans kind built on a layer; anything else
    raises ``ConfigError`` naming ``what`` gave it and what to give instead."""
    if isinstance(store, ObjectLayer):
        return PlanStore(store)
    if not isinstance(store, PlanStore):
        raise ConfigError(
            f"{what} gave a {type(store).__qualname__}, not a store: give PlanCache a "
            "PlanStore (open_store(url)), an ObjectLayer, or a function returning one"
        )
    return store


def describe_failure(exc: BaseException) -> tuple[Reason, str]:
    """(reason, detail) for a failure of store I/O; the detail holds no URL user information
    or secret-looking URL parameter, whatever raised."""
    if isinstance(exc, JobTimeout):
        return Reason.TIMEOUT, "store did not answer within the time budget"
    if isinstance(exc, UnsupportedSchemaError):
        reason, detail = Reason.MISS, str(exc)
    elif isinstance(exc, InvalidSignatureError):
        reason, detail = Reason.INVALID_SIGNATURE, str(exc)
    elif isinstance(exc, InvalidPlanError):
        reason, detail = Reason.INVALID, str(exc)
    elif isinstance(exc, PlanStoreError):
        reason, detail = Reason.STORE_ERROR, str(exc)
    else:
        reason, detail = Reason.ERROR, f"{type(exc).__name__}: {exc}"
    return reason, scrub(detail)
